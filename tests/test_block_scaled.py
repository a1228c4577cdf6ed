"""jaxgemm.scaled_matmul on the block-scaled fp8 kernel (e4m3 operands, blocks of a
multiple of 128 values along K, the scales applied per 128-deep k-tile in the mainloop):
where it runs, ragged sizes, deep K, batches, every output dtype, a persistent grid that
walks many tiles, scales that differ per block, the FFI's contract. On a CPU the same
call runs the handler's reference (JAXGEMM_CPU=ffi)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgemm
from jaxgemm.activations import apply
from jaxgemm.scaled import (
    GROUPS_ON_CUDA_VARIABLE,
    _scales_by_block,
    rhs_groups,
    runs_on_block_scaled_kernel,
    scaled_matmul_tiled,
)
from jaxgemm.scaled_dense import scaled_dense
from test_scaled import _bound as _scaled_bound
from test_scaled import _fp8_kernel_platform, _hopper, _operands, _reference, _rel

# From float64 on the quantized operands: each k-tile's sum in the tensor cores' fp8
# accumulation, 128 products deep, then promoted in float32, so the error does not grow
# with K as the unscaled fp8 kernel's does (test_scaled.FP8_KERNEL_BOUND).
BLOCK_KERNEL_BOUND = 1e-3
CPU_REFERENCE_BOUND = 1e-5  # float32 sums


def _bound(out_dtype=jnp.float32):
    if out_dtype == jnp.bfloat16:
        return 1e-2
    if out_dtype == jnp.float16:
        return 2e-3
    return BLOCK_KERNEL_BOUND if _hopper() else CPU_REFERENCE_BOUND


def _calls(fn, *args, target="jaxgemm_block_scaled_gemm"):
    hlo = jax.jit(fn).lower(*args).compile().as_text()
    return [line for line in hlo.splitlines() if f'custom_call_target="{target}"' in line]


@pytest.mark.parametrize("dtypes, kb, k, on_kernel", [
    ((jnp.float8_e4m3fn, jnp.float8_e4m3fn), 2, 256, True),
    ((jnp.float8_e4m3fn, jnp.float8_e4m3fn), 3, 768, True),   # blocks of 256
    ((jnp.float8_e4m3fn, jnp.float8_e4m3fn), 4, 256, False),  # blocks of 64: dequantized
    ((jnp.float8_e4m3fn, jnp.float8_e4m3fn), 1, 256, False),  # per-row: the fp8 GEMM
    ((jnp.float8_e5m2, jnp.float8_e4m3fn), 2, 256, True),  # a gradient's format beside e4m3
    ((jnp.float8_e4m3fn, jnp.float8_e5m2), 2, 256, True),
    ((jnp.float8_e5m2, jnp.float8_e5m2), 2, 256, False),
    ((jnp.bfloat16, jnp.bfloat16), 2, 256, False),
])  # fmt: skip
def test_runs_where_it_can(dtypes, kb, k, on_kernel):
    """e4m3 operands (or e5m2 beside e4m3) with blocks of a multiple of 128 values are
    multiplied by the block-scaled kernel (one custom call of fp8 operands and float32
    scales by block)."""
    platform = _fp8_kernel_platform()
    lhs, rhs, ls, rs = _operands(30 + kb, 1, 16, 32, k, kb)
    lhs, rhs = lhs.astype(jnp.float32).astype(dtypes[0]), rhs.astype(jnp.float32).astype(dtypes[1])
    assert runs_on_block_scaled_kernel(lhs, rhs, ls, platform) == on_kernel
    calls = _calls(jaxgemm.scaled_matmul, lhs, rhs, ls, rs)
    assert len(calls) == (1 if on_kernel else 0), calls
    if on_kernel:
        formats = [jnp.dtype(d).name.replace("float8_", "f8") + "[1," for d in dtypes]
        assert all(calls[0].count(f) == formats.count(f) for f in formats), calls
        assert f"f32[1,{kb},16]" in calls[0] and f"f32[1,{kb},32]" in calls[0]
    bound = _bound() if on_kernel else _scaled_bound((lhs, rhs))
    assert _rel(jaxgemm.scaled_matmul(lhs, rhs, ls, rs), _reference(lhs, rhs, ls, rs)) <= bound


@pytest.mark.parametrize("dtypes", [(jnp.float8_e5m2, jnp.float8_e4m3fn), (jnp.float8_e4m3fn, jnp.float8_e5m2)])
@pytest.mark.parametrize("out_dtype", [jnp.float32, jnp.bfloat16])
def test_e5m2_beside_e4m3(dtypes, out_dtype):
    """fp8.dense's blockwise backward with e5m2 gradients (dz w^T: e5m2 first; x^T dz: e5m2
    second) on ragged tiles, batched: within the kernel's bound of the float64 definition."""
    _fp8_kernel_platform()
    lhs, rhs, ls, rs = _operands(40, 2, 129, 200, 640, 5)
    lhs, rhs = lhs.astype(jnp.float32).astype(dtypes[0]), rhs.astype(jnp.float32).astype(dtypes[1])
    out = jaxgemm.scaled_matmul(lhs, rhs, ls, rs, preferred_element_type=out_dtype)
    assert out.shape == (2, 129, 200) and out.dtype == out_dtype
    assert _rel(out, _reference(lhs, rhs, ls, rs)) <= _bound(out_dtype)


@pytest.mark.parametrize("b, m, n, k, block", [
    (1, 1, 8, 128, 128), (3, 17, 130, 384, 128), (1, 300, 200, 1024, 256), (2, 129, 385, 4096, 128),
    (1, 200, 100, 640, 128), (1, 64, 192, 8192, 512),
])  # fmt: skip
@pytest.mark.parametrize("out_dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_sizes_and_outputs(b, m, n, k, block, out_dtype):
    """Ragged tiles (M, N not multiples of 128 x 192; N = 100 and 130 leave the TMA store for
    the general epilogue), one to 64 blocks, deep K, batches, into each output dtype:
    within the kernel's bound or the output dtype's rounding of the float64 definition."""
    _fp8_kernel_platform()
    args = _operands(b * m + n + k, b, m, n, k, k // block)
    out = jaxgemm.scaled_matmul(*args, preferred_element_type=out_dtype)
    assert out.shape == (b, m, n) and out.dtype == out_dtype
    assert _rel(out, _reference(*args)) <= _bound(out_dtype)


def test_scales_differ_per_block():
    """Each block's scales reach its own k-tiles: blocks with scales 2^j and 0 (the second
    block's products must vanish) against the float64 definition."""
    _fp8_kernel_platform()
    lhs, rhs, _, _ = _operands(40, 1, 96, 200, 512, 4)
    ls = jnp.broadcast_to(jnp.asarray([1.0, 0.0, 4.0, 0.5]), (1, 96, 4))
    rs = jnp.broadcast_to(jnp.asarray([2.0, 8.0, 0.25, 1.0]), (1, 200, 4))
    out = jaxgemm.scaled_matmul(lhs, rhs, ls, rs)
    assert _rel(out, _reference(lhs, rhs, ls, rs)) <= _bound()


def test_persistent_grid_walks_many_tiles(monkeypatch):
    """Four blocks walk 20 tiles of 128 x 192 each (JAXGEMM_SM_COUNT): every tile's
    accumulators start from zero and the stage ring carries across tiles."""
    platform = _fp8_kernel_platform()
    if platform == "cpu":
        pytest.skip("the grid is the GPU kernel's")
    monkeypatch.setenv("JAXGEMM_SM_COUNT", "4")
    args = _operands(41, 1, 520, 700, 1024, 8)
    assert _rel(jaxgemm.scaled_matmul(*args), _reference(*args)) <= _bound()


def test_jit_and_vmap():
    _fp8_kernel_platform()
    per = [_operands(50 + i, 1, 24, 40, 384, 3) for i in range(2)]
    stacked = [jnp.stack(xs) for xs in zip(*per)]
    out = jax.jit(jax.vmap(jaxgemm.scaled_matmul))(*stacked)
    for i, args in enumerate(per):
        assert _rel(out[i], _reference(*args)) <= _bound()


def _tiled(rs, seed):
    """rhs scales (B, N, KB) replaced by random ones that repeat over 128-row tiles."""
    b, n, kb = rs.shape
    tiles = np.random.default_rng(seed).uniform(0.25, 2, (b, -(-n // 128), kb))
    return jnp.asarray(np.repeat(tiles, 128, axis=1)[:, :n], jnp.float32)


@pytest.mark.parametrize("lhs_dtype", [jnp.float8_e4m3fn, jnp.float8_e5m2])  # e5m2: dx's dz in the HYBRID recipe
@pytest.mark.parametrize("b, m, n, k, block, out_dtype", [
    (1, 136, 264, 256, 128, jnp.float32),    # the second tile starts mid-tile of scales (192)
    (2, 129, 385, 4096, 128, jnp.bfloat16),  # batches, deep K, a ragged last tile
    (1, 64, 640, 1024, 256, jnp.float32),    # blocks of 256; four tiles, each at its own place in 4 groups
    (1, 30, 40, 256, 128, jnp.float16),      # one partial group
])  # fmt: skip
def test_rhs_scales_in_tiles(b, m, n, k, block, out_dtype, lhs_dtype, monkeypatch):
    """rhs_tiles: rhs's scales repeat over 128-row tiles (fp8.dense's weights), and the
    kernel takes one per 64 rows (b_scale_rows=64, (B, KB, ceil(N / 64)) padded to 4)
    against the float64 definition with the scales as given."""
    _fp8_kernel_platform()
    monkeypatch.setenv(GROUPS_ON_CUDA_VARIABLE, "1")
    lhs, rhs, ls, rs = _operands(80 + n, b, m, n, k, k // block)
    lhs, rs = lhs.astype(jnp.float32).astype(lhs_dtype), _tiled(rs, n)
    fn = lambda *args: scaled_matmul_tiled(*args, preferred_element_type=out_dtype, rhs_tiles=True)
    (call,) = _calls(fn, lhs, rhs, ls, rs)
    groups = -(-n // 64)
    assert "b_scale_rows = 64" in call and f"f32[{b},{k // block},{groups + -groups % 4}]" in call, call
    out = fn(lhs, rhs, ls, rs)
    assert out.shape == (b, m, n) and out.dtype == out_dtype
    assert _rel(out, _reference(lhs, rhs, ls, rs)) <= _bound(out_dtype)


def test_rhs_tiles_in_the_fused_forward(monkeypatch):
    """scaled_dense with rhs_tiles: bias, gelu and z in the groups kernel's epilogue, on a
    grid of four blocks walking its tiles where a GPU runs it."""
    platform = _fp8_kernel_platform()
    if platform != "cpu":
        monkeypatch.setenv("JAXGEMM_SM_COUNT", "4")
    monkeypatch.setenv(GROUPS_ON_CUDA_VARIABLE, "1")
    lhs, rhs, ls, rs = _operands(90, 1, 520, 700, 1024, 8)
    rs = _tiled(rs, 91)
    bias = jnp.asarray(np.random.default_rng(92).standard_normal((1, 700)), jnp.bfloat16)
    y, z = scaled_dense(lhs, rhs, ls, rs, bias, activation="gelu", want_aux=True, out_dtype=jnp.bfloat16,
                        rhs_tiles=True)  # fmt: skip
    want_z = np.asarray(_reference(lhs, rhs, ls, rs), np.float64) + np.asarray(bias, np.float64)[:, None, :]
    assert _rel(z, want_z) <= _bound(jnp.bfloat16)
    assert _rel(y, np.asarray(apply("gelu", jnp.asarray(want_z, jnp.float32)), np.float64)) <= _bound(jnp.bfloat16)


@pytest.mark.parametrize("n, k, kb", [(200, 512, 4), (384, 1024, 8), (64, 256, 2), (300, 256, 1)])
def test_rhs_scales_as_tiles(n, k, kb, monkeypatch):
    """rhs_scales (B, ceil(N / 128), KB), one per 128-row tile of rhs (DeepGEMM's form): the
    product with each scale repeated over its tile's rows; with blocks (KB > 1) on the
    kernel's groups (b_scale_rows = 64), with one block on the per-row fp8 kernel."""
    _fp8_kernel_platform()
    monkeypatch.setenv(GROUPS_ON_CUDA_VARIABLE, "1")
    lhs, rhs, ls, _ = _operands(100 + n, 2, 40, n, k, kb)
    tiles = jnp.asarray(np.random.default_rng(n).uniform(0.25, 2, (2, -(-n // 128), kb)), jnp.float32)
    rows = jnp.repeat(tiles, 128, axis=1)[:, :n]
    out = jax.jit(jaxgemm.scaled_matmul)(lhs, rhs, ls, tiles)
    assert out.shape == (2, 40, n)
    assert _rel(out, _reference(lhs, rhs, ls, rows)) <= (_bound() if kb > 1 else _scaled_bound((lhs, rhs)))
    calls = _calls(jaxgemm.scaled_matmul, lhs, rhs, ls, tiles)
    assert len(calls) == (kb > 1) and all("b_scale_rows = 64" in call for call in calls), calls


def test_rhs_scales_as_tiles_under_vmap(monkeypatch):
    """The tiled rhs_scales under vmap: each example's product, its tiles repeated per row."""
    _fp8_kernel_platform()
    monkeypatch.setenv(GROUPS_ON_CUDA_VARIABLE, "1")
    per = [_operands(110 + i, 1, 24, 200, 384, 3) for i in range(2)]
    tiles = [jnp.asarray(np.random.default_rng(i).uniform(0.25, 2, (1, 2, 3)), jnp.float32) for i in range(2)]
    out = jax.jit(jax.vmap(jaxgemm.scaled_matmul))(*(jnp.stack(xs) for xs in zip(*(p[:3] for p in per))),
                                                  jnp.stack(tiles))  # fmt: skip
    for i, (lhs, rhs, ls, _) in enumerate(per):
        rows = jnp.repeat(tiles[i], 128, axis=1)[:, :200]
        assert _rel(out[i], _reference(lhs, rhs, ls, rows)) <= _bound()


@pytest.mark.parametrize("n, tiles, axes, platform, variable, want", [
    (100, True, {}, "cpu", None, True),             # N whole: groups start at row 0
    (128, True, {"n": ("x",)}, "cpu", None, True),  # shards of whole groups
    (96, True, {"n": ("x",)}, "cpu", None, False),  # a shard that may start mid-group: per row
    (128, False, {}, "cpu", None, False),           # no promise
    (128, True, {}, "cuda", None, False),           # on a GPU only where asked for, for now
    (128, True, {}, "cuda", "1", True),
])  # fmt: skip
def test_rhs_groups_only_where_shards_hold_whole_groups(n, tiles, axes, platform, variable, want, monkeypatch):
    if variable is None:
        monkeypatch.delenv(GROUPS_ON_CUDA_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(GROUPS_ON_CUDA_VARIABLE, variable)
    assert rhs_groups(jnp.zeros((1, n, 128), jnp.float8_e4m3fn), tiles, axes, platform) == want


def test_scales_by_block_layout():
    """(B, R, KB) scales travel as (B, KB, R') float32, R' the next multiple of 4."""
    s = jnp.arange(2 * 5 * 3, dtype=jnp.bfloat16).reshape(2, 5, 3)
    t = _scales_by_block(s)
    assert t.shape == (2, 3, 8) and t.dtype == jnp.float32
    np.testing.assert_array_equal(t[:, :, :5], np.swapaxes(np.asarray(s, np.float32), 1, 2))
    np.testing.assert_array_equal(t[:, :, 5:], 0)


def _ffi(lhs, rhs, sa, sb, out_dtype=jnp.float32, bias=None, aux_dtype=None, activation=0, b_scale_rows=1):
    shape = (lhs.shape[0], lhs.shape[1], rhs.shape[1])
    results = (jax.ShapeDtypeStruct(shape, out_dtype), jax.ShapeDtypeStruct((0,) if aux_dtype is None else shape,
                                                                            aux_dtype or out_dtype))  # fmt: skip
    bias = jnp.zeros((0,), out_dtype) if bias is None else bias
    call = jax.ffi.ffi_call("jaxgemm_block_scaled_gemm", results)
    return jax.block_until_ready(call(lhs, rhs, sa, sb, bias, activation=np.int64(activation),
                                      b_scale_rows=np.int64(b_scale_rows)))  # fmt: skip


@pytest.mark.parametrize("change, words", [
    ("block of 64", "blocks of a multiple of 128"),
    ("pitch of 6", "pitches multiples of 4"),
    ("float16 out", "bfloat16 or float32"),
    ("bfloat16 scales", "scales must be float32"),
    ("fewer scale rows", "pitch >= m"),
    ("bias of 7 columns", r"bias must be \(1 or batch, n\)"),
    ("float32 aux", "aux must match out"),
    ("activation 99", "unknown activation id"),
    ("b_scale_rows 32", "b_scale_rows must be 1 or 64"),
    ("fewer group scales", r"pitch >= ceil\(n / b_scale_rows\)"),
])  # fmt: skip
def test_ffi_contract(change, words):
    """The handler's contract (ffi_src/ffi/block_scaled_decode.h): a clear error, no kernel."""
    _fp8_kernel_platform()
    lhs, rhs, _, _ = _operands(60, 1, 6, 300 if change == "fewer group scales" else 8, 256, 2)
    sa, sb = jnp.ones((1, 2, 8)), jnp.ones((1, 2, 8))
    out_dtype = jnp.float32
    if change == "block of 64":
        sa, sb = jnp.ones((1, 4, 8)), jnp.ones((1, 4, 8))
    elif change == "pitch of 6":
        sa = jnp.ones((1, 2, 6))
    elif change == "float16 out":
        out_dtype = jnp.float16
    elif change == "bfloat16 scales":
        sa = sa.astype(jnp.bfloat16)
    elif change in ("fewer scale rows", "fewer group scales"):
        sb = jnp.ones((1, 2, 4))
    extra = {"bias of 7 columns": {"bias": jnp.ones((1, 7), out_dtype)}, "activation 99": {"activation": 99},
             "float32 aux": {"out_dtype": jnp.bfloat16, "aux_dtype": jnp.float32},
             "b_scale_rows 32": {"b_scale_rows": 32},
             "fewer group scales": {"b_scale_rows": 64}}.get(change, {})  # fmt: skip
    extra = {"out_dtype": out_dtype} | extra
    with pytest.raises(Exception, match=words):
        _ffi(lhs, rhs, sa, sb, **extra)


@pytest.mark.parametrize("out_dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("b, m, n, k, activation, bias_batch", [
    (1, 136, 264, 256, "gelu", 1),   # ragged M and N: partial tiles, fused TMA store (bf16)
    (2, 64, 128, 384, "relu", 2),    # a bias per batch index
    (2, 200, 72, 256, None, 1),      # one bias for the batch (stride 0), no activation
])  # fmt: skip
def test_epilogue_in_the_kernel(out_dtype, b, m, n, k, activation, bias_batch):
    """scaled_dense with blocks of 128: the block-scaled product, the bias, the activation
    and z in the kernel's epilogue (one call, no XLA pass after it), against float64."""
    _fp8_kernel_platform()
    lhs, rhs, ls, rs = _operands(70 + m, b, m, n, k, k // 128)
    bias = jnp.asarray(np.random.default_rng(m).standard_normal((bias_batch, n)) * 10, out_dtype)
    fn = lambda *args: scaled_dense(*args, activation=activation, want_aux=True, out_dtype=out_dtype)
    assert len(_calls(fn, lhs, rhs, ls, rs, bias)) == 1
    y, z = fn(lhs, rhs, ls, rs, bias)
    want_z = np.asarray(_reference(lhs, rhs, ls, rs), np.float64) + np.asarray(bias, np.float64)[:, None, :]
    want_y = np.asarray(apply(activation, jnp.asarray(want_z, jnp.float32)), np.float64)
    assert y.dtype == z.dtype == out_dtype
    assert _rel(z, want_z) <= _bound(out_dtype) and _rel(y, want_y) <= _bound(out_dtype)
