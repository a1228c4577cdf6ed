"""The sm90 GEMM's dynamic walk (GemmConfig.dynamic_tiles, which tensor-parallel weight
gradients get; JAXGEMM_SM90_DYNAMIC_TILES=1 for every call): the blocks take their tiles
from a counter in the workspace (Sm90Schedule::Take) instead of a static share. The
workspace query asks for the counter; on a Hopper GPU every schedule gives exactly the
static whole-tile walk's values (each tile is still one block's full K, in the same
order), which are right against a float64 reference."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgemm
from jaxgemm import _ffi
from jaxgemm.gemm import KERNEL_FAMILIES, GemmConfig, gemm_product, uses_dynamic_tiles
from reference import TF32_TOLERANCE, TOLERANCE, random, rel_error, to64
from reference import matmul_operands as _operands
from reference import matmul_reference as _reference
from test_matmul import LAYOUTS, SM90_16BIT_ONLY_TILES, SM90_A_MK_ONLY_TILES, SM90_TILES

DYNAMIC = "JAXGEMM_SM90_DYNAMIC_TILES"


def test_workspace_holds_the_tile_counter():
    """The host query (at lowering) asks for the counter's 16 bytes with the walk on, and
    for stream-K's slots or nothing without it."""
    if not _ffi.WITH_CUDA:
        pytest.skip("the workspace query is part of the CUDA handlers")
    def query(m, n, k, sms, dynamic):
        return _ffi.gemm_workspace_bytes(m, n, k, 1, sms, 1, KERNEL_FAMILIES[None], 0, 0, False, False, False, False,
                                         dynamic)  # fmt: skip

    # 8192^2 x 4096 on 132 SMs; (3 x 4096)^2 x 4096 on 100, whose last wave stream-K shares.
    shapes = [(8192, 8192, 4096, 132), (12288, 12288, 4096, 100)]
    for shape in shapes:
        assert query(*shape, True) == 16, shape
        assert query(*shape, False) != 16, shape
    assert query(*shapes[1], False) > 0, "the second shape's last wave is shared out stream-K"


def test_env_turns_the_walk_on_for_every_call(monkeypatch):
    """JAXGEMM_SM90_DYNAMIC_TILES=1 reaches the call and its workspace query alike."""
    monkeypatch.delenv(DYNAMIC, raising=False)
    assert not uses_dynamic_tiles(GemmConfig()) and uses_dynamic_tiles(GemmConfig(dynamic_tiles=True))
    monkeypatch.setenv(DYNAMIC, "1")
    assert uses_dynamic_tiles(GemmConfig())


def _skip_unless_hopper():
    if jax.default_backend() != "gpu" or _ffi.cuda_compute_capability() != 90:
        pytest.skip("the sm90 kernel needs compute capability 9.0")


def _both_walks(monkeypatch, fn, *args):
    """fn(*args) jitted afresh (the workspace is sized at lowering) with the static
    whole-tile walk (no stream-K) and with the dynamic one."""
    outs = []
    for env in ({"JAXGEMM_STREAM_K": "0"}, {DYNAMIC: "1"}):
        monkeypatch.delenv(DYNAMIC, raising=False)
        monkeypatch.delenv("JAXGEMM_STREAM_K", raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        outs.append(jax.block_until_ready(jax.jit(lambda *a: fn(*a))(*args)))
    return outs


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("tile", SM90_TILES)
def test_gpu_dynamic_walk_on_every_sm90_tile(monkeypatch, tile, dtype):
    """Each sm90 schedule, forced: layouts x shapes (ragged, a cluster's empty second tile,
    many tiles per block, fewer rows than a tile) x batches x split-K x output dtype; float32
    as tf32. Bitwise the static walk's values, and right."""
    _skip_unless_hopper()
    tf32 = dtype == jnp.float32
    if tf32 and tile in SM90_16BIT_ONLY_TILES:
        pytest.skip("a 16-bit-only tile")
    rng = np.random.default_rng(hash((tile, str(dtype), "dynamic")) % 2**32)
    # Twice tf32's bound: K = 8 sums too few products to average its rounding (5.04e-4 seen).
    tolerance = 2 * TF32_TOLERANCE if tf32 else TOLERANCE[jnp.dtype(dtype)]
    shapes = [(8, 8, 8), (296, 520, 200), (16, 520, 4104), (1000, 520, 4104), (4104, 4104, 264)]
    for i, ((m, n, k), (ta, tb)) in enumerate(itertools.product(shapes, LAYOUTS)):
        if ta and tile in SM90_A_MK_ONLY_TILES:
            continue
        if ta and not tf32:
            m = -(-m // 8) * 8  # a forced kernel gets no padding: 16-byte rows of stored A
        batch = ((3,), (3,)) if i % 4 == 3 else ((), ())
        split_k = 3 if i % 3 == 2 else 1
        out_dtype = jnp.dtype(jnp.float32) if tf32 or i % 2 else jnp.dtype(dtype)
        a, b = _operands(rng, m, n, k, dtype, ta, tb, *batch)
        config = GemmConfig(ta, tb, tf32, out_dtype, split_k=split_k, kernel="sm90", tile=tile)
        static, dynamic = _both_walks(monkeypatch, lambda a, b: gemm_product(a, b, config), a, b)
        case = (m, n, k, ta, tb, batch, split_k, out_dtype)
        np.testing.assert_array_equal(np.asarray(dynamic), np.asarray(static), err_msg=str(case))
        assert rel_error(dynamic, _reference(a, b, ta, tb)) <= tolerance, case


@pytest.mark.gpu
def test_gpu_dynamic_walk_fused_epilogue_and_gradient(monkeypatch):
    """The heuristic's schedule with the fused epilogue (bias, gelu, the pre-activation Aux,
    a residual) and dense's gradient: the store warps read the queue too."""
    _skip_unless_hopper()
    rng = np.random.default_rng(11)
    x, w = random(rng, (2048, 1024), jnp.bfloat16), random(rng, (1024, 3072), jnp.bfloat16) * 0.05
    bias, res = random(rng, (3072,), jnp.bfloat16), random(rng, (2048, 3072), jnp.bfloat16)

    def step(x, w, bias, res):
        y, z = jaxgemm.matmul(x, w, bias=bias, activation="gelu", residual=res, return_pre_activation=True)
        g = jax.grad(lambda x, w: jaxgemm.dense(x, w, bias, "gelu").astype(jnp.float32).sum(), (0, 1))(x, w)
        return y, z, *g

    static, dynamic = _both_walks(monkeypatch, step, x, w, bias, res)
    for s, d in zip(static, dynamic):
        np.testing.assert_array_equal(np.asarray(d), np.asarray(s))
    z_ref = to64(x) @ to64(w) + to64(bias)
    assert rel_error(dynamic[1], z_ref) <= TOLERANCE[jnp.dtype(jnp.bfloat16)]
