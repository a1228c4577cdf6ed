"""jaxgemm.matmul against float64 references, through the public API.

Runs on whatever JAX's default backend is: the CPU handlers in CI, the CUDA kernels on a
GPU. Tests marked `gpu` need a GPU and are skipped without one.
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import jaxgemm
from jaxgemm import _ffi, kernels
from conftest import on_gpu
from reference import TF32_TOLERANCE, TOLERANCE, op, random, rel_error, to64
from reference import matmul_operands as _operands
from reference import matmul_reference as _reference

DTYPES = [jnp.float32, jnp.float16, jnp.bfloat16]
LAYOUTS = list(itertools.product([False, True], repeat=2))
SHAPES = [(1, 1, 1), (3, 17, 5), (17, 1, 127), (127, 255, 33), (255, 127, 513)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ta,tb", LAYOUTS)
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_matches_float64(m, n, k, ta, tb, dtype):
    rng = np.random.default_rng(hash((m, n, k, ta, tb)) % 2**32)
    a, b = _operands(rng, m, n, k, dtype, ta, tb)
    out = jax.jit(jaxgemm.matmul, static_argnames=("transpose_a", "transpose_b"))(
        a, b, transpose_a=ta, transpose_b=tb
    )
    assert out.dtype == jnp.dtype(dtype)
    assert rel_error(out, _reference(a, b, ta, tb)) <= TOLERANCE[jnp.dtype(dtype)]


@pytest.mark.parametrize(
    "a_shape,b_shape",
    [
        ((4, 5, 7), (4, 7, 3)),
        ((2, 1, 5, 7), (3, 7, 3)),  # both broadcast
        ((6, 5, 7), (7, 3)),  # B shared: folded into M
        ((5, 7), (6, 7, 3)),  # A shared: stride-0 broadcast
        ((2, 1, 3, 1, 5, 7), (1, 4, 1, 2, 7, 3)),  # alternating patterns beyond the kernel's rank
        ((7,), (7, 3)),
        ((5, 7), (7,)),
        ((7,), (7,)),
        ((2, 3, 5, 7), (7,)),
        ((7,), (2, 7, 3)),
    ],
)
def test_batch_broadcast_and_vectors(a_shape, b_shape):
    rng = np.random.default_rng(0)
    a, b = random(rng, a_shape, jnp.float32), random(rng, b_shape, jnp.float32)
    out = jaxgemm.matmul(a, b)
    ref = np.matmul(to64(a), to64(b))
    assert out.shape == ref.shape
    assert rel_error(out, ref) <= 1e-5


def test_transposed_batched():
    rng = np.random.default_rng(1)
    a = random(rng, (3, 9, 6), jnp.float32)  # (batch, K, M)
    b = random(rng, (1, 4, 9), jnp.float32)  # (1, N, K)
    out = jaxgemm.matmul(a, b, transpose_a=True, transpose_b=True)
    assert rel_error(out, _reference(a, b, True, True)) <= 1e-5


def test_lowering_contains_custom_call():
    a = jnp.ones((8, 4), jnp.float32)
    text = jax.jit(jaxgemm.matmul).lower(a, a.T).as_text()
    assert "jaxgemm_gemm" in text
    assert "dot_general" not in text  # no silent fallback to an XLA dot


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_out_dtype_float32(dtype):
    rng = np.random.default_rng(2)
    a, b = _operands(rng, 33, 17, 65, dtype, False, False)
    out = jaxgemm.matmul(a, b, out_dtype=jnp.float32)
    assert out.dtype == jnp.float32
    # The fp32 result of half inputs is exact up to fp32 accumulation.
    assert rel_error(out, _reference(a, b)) <= 1e-5


def test_out_dtype_narrower_than_input():
    rng = np.random.default_rng(3)
    a, b = _operands(rng, 16, 8, 32, jnp.float32, False, False)
    out = jaxgemm.matmul(a, b, out_dtype=jnp.bfloat16)
    assert out.dtype == jnp.bfloat16
    assert rel_error(out, _reference(a, b)) <= 1e-2


def test_mixed_input_dtypes_promote():
    rng = np.random.default_rng(4)
    a = random(rng, (5, 6), jnp.bfloat16)
    b = random(rng, (6, 7), jnp.float32)
    out = jaxgemm.matmul(a, b)
    assert out.dtype == jnp.float32
    assert rel_error(out, _reference(a, b)) <= 1e-5


@pytest.mark.parametrize("precision", ["tensorfloat32", jax.lax.Precision.DEFAULT, jax.lax.Precision.HIGH])
def test_tf32_precision(precision):
    rng = np.random.default_rng(5)
    a, b = _operands(rng, 130, 66, 257, jnp.float32, False, True)
    out = jaxgemm.matmul(a, b, transpose_b=True, precision=precision)
    assert rel_error(out, _reference(a, b, False, True)) <= TF32_TOLERANCE


@pytest.mark.parametrize(
    "ta,tb,m,n,tile,plain,expected",
    [
        (False, True, 300, 200, None, True, (False, False)),  # K-major A and B: as stored
        (False, False, 300, 200, None, True, (False, False)),  # run transposed (D^T = B^T A^T)
        (False, False, 300, 200, None, False, (False, True)),  # an epilogue: B transposed
        (False, False, 300, 201, None, True, (False, True)),  # B's rows not 16-byte multiples
        (False, False, 64, 200, None, True, (False, True)),  # few rows
        (False, False, 300, 200, (128, 128), True, (False, True)),  # pingpong: no register A
        (True, True, 300, 200, None, True, (False, False)),  # A from registers
        (True, True, 300, 200, (128, 128), True, (True, False)),  # pingpong: no register A
        (True, True, 301, 200, (128, 256), True, (True, False)),  # A's rows not 16-byte multiples
        (True, False, 300, 200, None, True, (False, True)),  # -> TT
        (True, False, 301, 200, None, True, (True, True)),  # -> NT
    ],
)
def test_tf32_operand_layouts(ta, tb, m, n, tile, plain, expected):
    """Which stored operands the lowering transposes for the sm90 tf32 kernel (B unless it is
    K-major or the product runs transposed; A only when it cannot come from registers), and
    what it hands the kernel: K padded to a multiple of 4."""
    from jaxgemm.gemm import GemmConfig, tf32_operands, _tf32_transposes

    config = GemmConfig(ta, tb, True, jnp.dtype(jnp.float32), tile=tile)
    assert _tf32_transposes(m, n, config, plain) == expected
    k = 203
    a = jnp.ones((k, m) if ta else (m, k), jnp.float32)
    b = jnp.ones((n, k) if tb else (k, n), jnp.float32)
    ka, kb, kconfig = tf32_operands(a, b, config, plain)
    assert (kconfig.transpose_a, kconfig.transpose_b) == (ta != expected[0], tb != expected[1])
    assert ka.shape == ((204, m) if kconfig.transpose_a else (m, 204))
    assert kb.shape == ((n, 204) if kconfig.transpose_b else (204, n))


@pytest.mark.parametrize(
    "m,n,k,ta,tb,split,pays",
    [
        (128, 4096, 4096, False, False, 2, False),  # few rows: bound by reading B, the transpose doubles it
        (96, 8192, 8192, False, False, 4, False),
        (4096, 4096, 4096, False, False, 2, True),  # compute-bound: half the product outweighs it
        (128, 4096, 4096, False, True, 2, True),  # B stored K-major: no transpose either way
        (64, 4096, 4096, False, False, 2, True),  # <= 64 rows: B is transposed unsplit too
    ],
)
def test_tf32_split_weighs_the_transpose_of_b(m, n, k, ta, tb, split, pays):
    """A tf32 NN product unsplit runs transposed without copying B; split, the lowering
    transposes B (8 bytes an element moved), which few-row products do not earn back."""
    from jaxgemm.gemm import GemmConfig, _tf32_split_pays, _tf32_split_transposes_b

    config = GemmConfig(ta, tb, True, jnp.dtype(jnp.float32))
    keeps_split = not _tf32_split_transposes_b(m, n, config) or _tf32_split_pays(m, n, k, split)
    assert keeps_split == pays


def test_unknown_precision_is_a_value_error():
    a = jnp.ones((4, 8), jnp.float32)
    with pytest.raises(ValueError, match="unknown precision 'float64'"):
        jaxgemm.matmul(a, a.T, precision="float64")


@pytest.mark.parametrize("precision", [None, "highest", jax.lax.Precision.HIGHEST])
def test_exact_precision(precision):
    rng = np.random.default_rng(6)
    a, b = _operands(rng, 130, 66, 257, jnp.float32, True, False)
    out = jaxgemm.matmul(a, b, transpose_a=True, precision=precision)
    assert rel_error(out, _reference(a, b, True, False)) <= 1e-5


def test_nan_propagates_to_its_row_only():
    rng = np.random.default_rng(7)
    a, b = _operands(rng, 9, 5, 11, jnp.float32, False, False)
    a = a.at[3, 4].set(jnp.nan)
    out = np.asarray(jaxgemm.matmul(a, b))
    assert np.all(np.isnan(out[3]))
    assert np.all(np.isfinite(np.delete(out, 3, axis=0)))


@pytest.mark.parametrize(
    "a_shape,b_shape,out_shape",
    [((0, 4), (4, 3), (0, 3)), ((5, 4), (4, 0), (5, 0)), ((5, 0), (0, 3), (5, 3)), ((0, 5, 4), (4, 3), (0, 5, 3))],
)
def test_zero_sizes(a_shape, b_shape, out_shape):
    a, b = jnp.ones(a_shape, jnp.float32), jnp.ones(b_shape, jnp.float32)
    out = jax.jit(jaxgemm.matmul)(a, b)
    assert out.shape == out_shape
    assert np.all(np.asarray(out) == 0)
    grads = jax.grad(lambda a, b: jaxgemm.matmul(a, b).sum(), argnums=(0, 1))(a, b)
    assert grads[0].shape == a_shape and grads[1].shape == b_shape


# --- differentiation -------------------------------------------------------------------


@pytest.mark.parametrize("ta,tb", LAYOUTS)
def test_grads_order_2(ta, tb):
    rng = np.random.default_rng(8)
    a, b = _operands(rng, 5, 4, 6, jnp.float32, ta, tb)
    f = lambda a, b: jaxgemm.matmul(a, b, transpose_a=ta, transpose_b=tb)  # noqa: E731
    check_grads(f, (a, b), order=2, modes=("fwd", "rev"), atol=1e-2, rtol=1e-2)


def test_grads_batched_broadcast():
    rng = np.random.default_rng(9)
    a, b = random(rng, (2, 1, 3, 4), jnp.float32), random(rng, (3, 4, 5), jnp.float32)
    check_grads(jaxgemm.matmul, (a, b), order=2, modes=("fwd", "rev"), atol=1e-2, rtol=1e-2)
    ga, gb = jax.grad(lambda a, b: (jaxgemm.matmul(a, b) ** 2).sum(), argnums=(0, 1))(a, b)
    ra, rb = jax.grad(lambda a, b: (jnp.matmul(a, b, precision="highest") ** 2).sum(), argnums=(0, 1))(a, b)
    assert rel_error(ga, to64(ra)) <= 1e-5 and rel_error(gb, to64(rb)) <= 1e-5


def test_grad_of_vector_products():
    rng = np.random.default_rng(10)
    x, w = random(rng, (6,), jnp.float32), random(rng, (6, 3), jnp.float32)
    check_grads(jaxgemm.matmul, (x, w), order=2, modes=("fwd", "rev"), atol=1e-2, rtol=1e-2)


def test_jvp_vjp_and_linear_transpose():
    rng = np.random.default_rng(11)
    a, b = _operands(rng, 4, 3, 5, jnp.float32, False, False)
    da, db = _operands(rng, 4, 3, 5, jnp.float32, False, False)
    out, tangent = jax.jvp(jaxgemm.matmul, (a, b), (da, db))
    ref = _reference(da, b) + _reference(a, db)
    assert rel_error(tangent, ref) <= 1e-5
    _, vjp = jax.vjp(jaxgemm.matmul, a, b)
    ct = random(rng, out.shape, jnp.float32)
    ga, gb = vjp(ct)
    assert rel_error(ga, to64(ct) @ to64(b).T) <= 1e-5
    assert rel_error(gb, to64(a).T @ to64(ct)) <= 1e-5
    (lt,) = jax.linear_transpose(lambda x: jaxgemm.matmul(x, b), a)(ct)
    assert rel_error(lt, to64(ct) @ to64(b).T) <= 1e-5


def test_half_precision_grads_keep_dtype():
    rng = np.random.default_rng(12)
    a, b = _operands(rng, 8, 4, 16, jnp.bfloat16, False, False)
    ga, gb = jax.grad(lambda a, b: jaxgemm.matmul(a, b, out_dtype=jnp.float32).sum(), argnums=(0, 1))(a, b)
    assert ga.dtype == jnp.bfloat16 and gb.dtype == jnp.bfloat16
    ones = np.ones((8, 4))
    assert rel_error(ga, ones @ to64(b).T) <= 1e-2


# --- vmap ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "in_axes,a_shape,b_shape",
    [
        ((0, None), (3, 5, 7), (7, 4)),
        ((None, 0), (5, 7), (3, 7, 4)),
        ((0, 0), (3, 5, 7), (3, 7, 4)),
        ((1, 2), (5, 3, 7), (7, 4, 3)),
        ((2, None), (5, 7, 3), (2, 7, 4)),
        ((None, 0), (2, 5, 7), (3, 1, 7, 4)),
    ],
)
def test_vmap(in_axes, a_shape, b_shape):
    rng = np.random.default_rng(13)
    a, b = random(rng, a_shape, jnp.float32), random(rng, b_shape, jnp.float32)
    out = jax.vmap(jaxgemm.matmul, in_axes=in_axes)(a, b)
    ref = jax.vmap(lambda x, y: jnp.matmul(x, y, precision="highest"), in_axes=in_axes)(a, b)
    assert rel_error(out, to64(ref)) <= 1e-5


def test_nested_vmap_and_vmap_of_grad():
    rng = np.random.default_rng(14)
    a, b = random(rng, (2, 3, 5, 7), jnp.float32), random(rng, (3, 7, 4), jnp.float32)
    out = jax.vmap(jax.vmap(jaxgemm.matmul, in_axes=(0, 0)), in_axes=(0, None))(a, b)
    assert rel_error(out, np.matmul(to64(a), to64(b))) <= 1e-5

    loss = lambda x, w: (jaxgemm.matmul(x, w) ** 2).sum()  # noqa: E731
    ref_loss = lambda x, w: (jnp.matmul(x, w, precision="highest") ** 2).sum()  # noqa: E731
    x, w = random(rng, (6, 5, 7), jnp.float32), random(rng, (7, 4), jnp.float32)
    g = jax.vmap(jax.grad(loss, argnums=1), in_axes=(0, None))(x, w)  # per-example grads
    r = jax.vmap(jax.grad(ref_loss, argnums=1), in_axes=(0, None))(x, w)
    assert rel_error(g, to64(r)) <= 1e-5


def test_vmap_does_not_copy_unbatched_operand():
    """The unbatched operand reaches the kernel unexpanded (stride-0 broadcast or folded)."""
    a, b = jnp.ones((5, 7), jnp.float32), jnp.ones((64, 7, 4), jnp.float32)
    for fn, args in [
        (jax.vmap(jaxgemm.matmul, in_axes=(None, 0)), (a, b)),
        (jax.vmap(jaxgemm.matmul, in_axes=(0, None)), (b.transpose(0, 2, 1), a.T)),
    ]:
        jaxpr = jax.make_jaxpr(fn)(*args)
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "broadcast_in_dim":
                assert np.prod(eqn.outvars[0].aval.shape) == np.prod(eqn.invars[0].aval.shape), eqn


# --- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "a,b,kwargs,exc,pattern",
    [
        (jnp.float32(1), jnp.ones((2, 2)), {}, ValueError, r"rank >= 1.*\(\)"),
        (jnp.ones((3, 4)), jnp.ones((5, 6)), {}, ValueError, r"inner dimensions.*\(3, 4\).*\(5, 6\)"),
        (jnp.ones((3, 4)), jnp.ones((3, 6)), {"transpose_a": False}, ValueError, "K=4.*K=3"),
        (jnp.ones((2, 3, 4)), jnp.ones((5, 4, 6)), {}, ValueError, r"batch dims do not broadcast.*\(2,\).*\(5,\)"),
        (jnp.ones((3, 4), jnp.int32), jnp.ones((4, 2), jnp.int32), {}, TypeError, "int32"),
        (jnp.ones((3, 4)), jnp.ones((4, 2)), {"out_dtype": jnp.int8}, TypeError, "int8"),
        (jnp.ones((3, 4)), jnp.ones((4, 2)), {"precision": "fastest"}, ValueError, "precision"),
    ],
)
def test_bad_input_raises_at_trace_time(a, b, kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        jax.jit(lambda a, b: jaxgemm.matmul(a, b, **kwargs)).lower(a, b)


# --- GPU-only ---------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize(
    "m,n,k",
    [
        (4095, 4097, 4093),  # ragged edges on every side
        (128, 8192, 2048),  # tall and skinny
        (2048, 2048, 1024),
        (1, 4095, 127),
        (127, 1, 4095),
    ],
)
@pytest.mark.parametrize("ta,tb", LAYOUTS)
def test_gpu_large_ragged_float32(m, n, k, ta, tb):
    rng = np.random.default_rng(hash((m, n, k, ta, tb)) % 2**32)
    a, b = _operands(rng, m, n, k, jnp.float32, ta, tb)
    out = jaxgemm.matmul(a, b, transpose_a=ta, transpose_b=tb)
    assert rel_error(out, _reference(a, b, ta, tb)) <= 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("ta,tb", LAYOUTS)
def test_gpu_simt_float32_stores_wide_operands_mn_major(ta, tb):
    """The SIMT float32 path transposes a K-contiguous A when N >= 2048 and a K-contiguous B
    when M >= 2048 (their tiles copy faster M- / N-contiguous), and not below; the product,
    plain and with a fused epilogue, is unchanged."""
    rng = np.random.default_rng(hash((ta, tb, "mn-major")) % 2**32)
    m, n, k = 2049, 2050, 65
    a, b = _operands(rng, m, n, k, jnp.float32, ta, tb)
    bias = random(rng, (n,), jnp.float32)
    fn = jax.jit(functools.partial(jaxgemm.matmul, transpose_a=ta, transpose_b=tb))
    transposes = (not ta) + tb
    assert fn.lower(a, b).as_text().count("stablehlo.transpose") == transposes
    assert rel_error(fn(a, b), _reference(a, b, ta, tb)) <= 1e-5
    y = jaxgemm.matmul(a, b, transpose_a=ta, transpose_b=tb, bias=bias, activation="relu")
    assert rel_error(y, np.maximum(_reference(a, b, ta, tb) + to64(bias), 0)) <= 1e-5
    narrow_a, narrow_b = _operands(rng, 2047, 2047, k, jnp.float32, ta, tb)
    assert "stablehlo.transpose" not in fn.lower(narrow_a, narrow_b).as_text()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k", [(1023, 1025, 513), (64, 3000, 1001)])
def test_gpu_half_and_unaligned(m, n, k, dtype):
    rng = np.random.default_rng(15)
    for ta, tb in LAYOUTS:
        a, b = _operands(rng, m, n, k, dtype, ta, tb)
        out = jaxgemm.matmul(a, b, transpose_a=ta, transpose_b=tb)
        assert rel_error(out, _reference(a, b, ta, tb)) <= TOLERANCE[jnp.dtype(dtype)], (ta, tb)


@pytest.mark.gpu
def test_gpu_heuristic_choices_cover_every_simt_tile():
    """Every (tile, split-K) the heuristic picks over a grid of shapes is one the forced-tile
    test below checks, and shapes that pick split-K are correct."""
    from jaxgemm import _ffi

    sms = _ffi.cuda_sm_count()
    choices = {}
    for m, n, k in itertools.product([16, 128, 512, 2048], [64, 1024, 8192], [64, 1024, 8192]):
        choices.setdefault(_ffi.simt_config(m, n, k, 1, sms), (m, n, k))
    assert {c[:2] for c in choices} <= set(SIMT_TILES)
    rng = np.random.default_rng(16)
    for (bm, bn, split), (m, n, k) in choices.items():
        if m * n * k > 2**31:
            continue  # keep the float64 reference cheap
        a, b = _operands(rng, m, n, k, jnp.float32, False, True)
        out = jaxgemm.matmul(a, b, transpose_b=True)
        assert rel_error(out, _reference(a, b, False, True)) <= 1e-5, (m, n, k, bm, bn, split)


SIMT_TILES = [(256, 128), (128, 128), (128, 64), (64, 64)]


@pytest.mark.gpu
@pytest.mark.parametrize(
    "tile,dtype", [(t, jnp.float32) for t in SIMT_TILES] + [((128, 128), jnp.float16), ((128, 128), jnp.bfloat16)]
)
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (129, 67, 1001), (300, 257, 64)])
def test_gpu_every_simt_tile(tile, dtype, m, n, k):
    """Every SIMT kernel (16-bit inputs have one: they use it when rows are unaligned)."""
    from jaxgemm.gemm import GemmConfig, gemm_product

    rng = np.random.default_rng(hash((tile, m, n, k)) % 2**32)
    for ta, tb in LAYOUTS:
        for batch_a, batch_b in [((), ()), ((3,), (3,)), ((), (2,))]:
            a, b = _operands(rng, m, n, k, dtype, ta, tb, batch_a, batch_b)
            config = GemmConfig(ta, tb, False, jnp.dtype(dtype), split_k=1, kernel="simt", tile=tile)
            out = gemm_product(a, b, config)
            err = rel_error(out, _reference(a, b, ta, tb))
            assert err <= TOLERANCE[jnp.dtype(dtype)], (ta, tb, batch_a, batch_b, err)


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(1031, 777, 523), (513, 260, 48)])
def test_gpu_simt_256x128_over_many_tiles(m, n, k):
    """The 16x8-per-thread float32 tile over several tiles each way, with partial ones, every
    layout, aligned (16-byte copies) and not: each of a thread's four row fragments lands
    in its own rows."""
    from jaxgemm.gemm import GemmConfig, gemm_product

    rng = np.random.default_rng(hash((m, n, k, "256x128")) % 2**32)
    for ta, tb in LAYOUTS:
        a, b = _operands(rng, m, n, k, jnp.float32, ta, tb)
        config = GemmConfig(ta, tb, split_k=1, kernel="simt", tile=(256, 128))
        err = rel_error(gemm_product(a, b, config), _reference(a, b, ta, tb))
        assert err <= 1e-5, (ta, tb, err)


@pytest.mark.gpu
def test_gpu_unknown_tile_is_an_error_not_a_crash():
    from jaxgemm.gemm import GemmConfig, gemm_product

    a = jnp.ones((8, 8), jnp.float32)
    with pytest.raises(Exception, match="no SIMT tile 96x96"):
        jax.block_until_ready(gemm_product(a, a, GemmConfig(kernel="simt", tile=(96, 96))))


@pytest.mark.parametrize("ta,tb", LAYOUTS)
def test_padding_for_tensor_cores_keeps_the_product(ta, tb):
    """The GPU lowering pads 16-bit operands with unaligned rows (pad_rows_for_tensor_cores):
    stored rows become multiples of 8 and the product, sliced back, is unchanged."""
    from jaxgemm.gemm import GemmConfig, pad_rows_for_tensor_cores

    rng = np.random.default_rng(19)
    m, n, k = 13, 21, 30
    a, b = _operands(rng, m, n, k, jnp.bfloat16, ta, tb, (2,), (2,))
    pa, pb, m_pad, n_pad = pad_rows_for_tensor_cores(a, b, GemmConfig(ta, tb))
    assert pa.shape[-1] % 8 == 0 and pb.shape[-1] % 8 == 0, (pa.shape, pb.shape)
    out = np.matmul(op(to64(pa), ta), op(to64(pb), tb))
    assert out.shape[-2:] == (m + m_pad, n + n_pad)
    np.testing.assert_array_equal(out[..., :m, :n], _reference(a, b, ta, tb))


@pytest.mark.parametrize("ta,tb", LAYOUTS)
@pytest.mark.parametrize("m,n,k", [(2049, 2050, 2048), (2048, 2052, 2047), (2047, 2048, 2048), (16, 4097, 4095)])
def test_simt_layout_and_padding_keep_the_product(m, n, k, ta, tb):
    """The GPU lowering's SIMT float32 rewrites (mn_major_for_simt, then
    _aligned_rows_for_simt): operands stored (k, m) / (k, n) where the GEMM is wide enough,
    m and n zero-padded to multiples of 4 only when the whole GEMM is large, and op(a) / op(b)
    unchanged but for zero rows / columns (which only add output rows / columns)."""
    from jaxgemm.gemm import GemmConfig, _aligned_rows_for_simt, mn_major_for_simt

    rng = np.random.default_rng(hash((m, n, k, ta, tb, "simt rows")) % 2**32)
    a, b = _operands(rng, m, n, k, jnp.float32, ta, tb)
    pa, pb, config = mn_major_for_simt(a, b, GemmConfig(ta, tb))
    assert config.transpose_a == (ta or n >= 2048) and config.transpose_b == (tb and m < 2048), config
    pa, pb, m_pad, n_pad = _aligned_rows_for_simt(pa, pb, config)
    if min(m, n, k) >= 2048:
        assert pa.shape == (k, m + m_pad) and pb.shape == (k, n + n_pad) and (m + m_pad) % 4 == (n + n_pad) % 4 == 0
    else:
        assert m_pad == n_pad == 0
    # op(a) gains zero rows and op(b) zero columns: the product's first m x n are unchanged.
    op_a, op_b = op(np.asarray(pa), config.transpose_a), op(np.asarray(pb), config.transpose_b)
    assert op_a.shape == (m + m_pad, k) and op_b.shape == (k, n + n_pad)
    np.testing.assert_array_equal(op_a[:m], op(np.asarray(a), ta))
    np.testing.assert_array_equal(op_b[:, :n], op(np.asarray(b), tb))
    assert not op_a[m:].any() and not op_b[:, n:].any()


def _skip_unless_hopper(kernel):
    from jaxgemm import _ffi

    if kernel == "sm90" and _ffi.cuda_compute_capability() != 90:
        pytest.skip("the sm90 kernel needs compute capability 9.0")


# (kernel family, tile): every tensor-core kernel the heuristic can pick: sm80, and every
# sm90 schedule built for 16-bit inputs (some for those only, the swapped one taking A
# stored (m, k) only).
TENSOR_CORE_KERNELS = [("sm80", None)] + [("sm90", s.tile) for s in kernels.SM90_SCHEDULES if s.half]
SM90_16BIT_ONLY_TILES = {s.tile for s in kernels.SM90_SCHEDULES if s.half and not s.tf32}
SM90_A_MK_ONLY_TILES = {s.tile for s in kernels.SM90_SCHEDULES if s.swapped}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("kernel,tile", TENSOR_CORE_KERNELS)
def test_gpu_every_tensor_core_kernel(kernel, tile, dtype):
    """Each tensor-core kernel, forced, over layouts x shapes ragged against its tiles x
    batching (incl. a broadcast operand) x output dtype x split-K."""
    from jaxgemm.gemm import GemmConfig, gemm_product

    _skip_unless_hopper(kernel)
    rng = np.random.default_rng(hash((kernel, tile, str(dtype))) % 2**32)
    # (296, ...) and (4104, ...): odd tile rows (a cluster whose second tile is empty);
    # (4104, 4104, 264): several tiles per block (the ring runs across tiles).
    shapes = [(8, 8, 8), (136, 264, 72), (296, 520, 200), (392, 200, 1000), (1000, 520, 4104), (4104, 4104, 264)]
    batches = [((), ()), ((3,), (3,)), ((), (2,)), ((2,), ())]
    for i, ((m, n, k), (ta, tb)) in enumerate(itertools.product(shapes, LAYOUTS)):
        if ta and tile in SM90_A_MK_ONLY_TILES:
            continue
        batch_a, batch_b = batches[i % len(batches)]
        out_dtype = jnp.dtype(dtype) if i % 2 == 0 else jnp.dtype(jnp.float32)
        split_k = 3 if i % 3 == 2 else 1
        a, b = _operands(rng, m, n, k, dtype, ta, tb, batch_a, batch_b)
        config = GemmConfig(ta, tb, False, out_dtype, split_k=split_k, kernel=kernel, tile=tile)
        out = gemm_product(a, b, config)
        assert out.dtype == out_dtype
        err = rel_error(out, _reference(a, b, ta, tb))
        assert err <= TOLERANCE[jnp.dtype(dtype)], (m, n, k, ta, tb, batch_a, batch_b, out_dtype, split_k, err)


SM90_TILES = [t for kernel, t in TENSOR_CORE_KERNELS if kernel == "sm90"]
SM90_TF32_TILES = [t for t in SM90_TILES if t not in SM90_16BIT_ONLY_TILES]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("tile", SM90_TILES)
def test_gpu_few_rows_on_every_sm90_tile(tile, dtype):
    """Products with fewer rows than a tile, or a last tile with at most 64 rows: A's box
    shrinks to M's rows and m64 blocks past M are not multiplied, so the stage rows they
    would read hold stale values. Every row < M must still be right and written (poisoned
    outputs), in every layout, with split-K and batches, with a fused epilogue too; float32
    runs as tf32 (A from shared memory or, stored (k, m), from registers)."""
    from jaxgemm.gemm import GemmConfig, gemm_product

    _skip_unless_hopper("sm90")
    if dtype == jnp.float32 and tile in SM90_16BIT_ONLY_TILES:
        pytest.skip("a 16-bit-only tile")
    rng = np.random.default_rng(hash((tile, str(dtype))) % 2**32)
    tf32 = dtype == jnp.float32
    tolerance = TF32_TOLERANCE if tf32 else TOLERANCE[jnp.dtype(dtype)]
    rows = [1, 16, 63, 65, 136]
    for i, (m, (ta, tb)) in enumerate(itertools.product(rows, LAYOUTS)):
        if ta and tile in SM90_A_MK_ONLY_TILES:
            continue
        n, k = (264, 1000) if i % 2 else (520, 4104)
        if ta and not tf32:
            m = -(-m // 8) * 8  # a forced kernel gets no padding: 16-byte rows of stored A
        batch = ((2,), (2,)) if i % 4 == 3 else ((), ())
        split_k = 3 if i % 3 == 1 else 1
        a, b = _operands(rng, m, n, k, dtype, ta, tb, *batch)
        config = GemmConfig(ta, tb, tf32, jnp.dtype(dtype), split_k=split_k, kernel="sm90", tile=tile)
        out = jax.jit(lambda a, b: gemm_product(a, b, config))(a, b)
        err = rel_error(out, _reference(a, b, ta, tb))
        assert err <= tolerance, (m, n, k, ta, tb, batch, split_k, err)
    # The fused TMA-store epilogue (bias, activation, Aux) on a few-row product.
    if not tf32:
        a, b = _operands(rng, 16, 512, 2048, dtype, False, False)
        bias = random(rng, (512,), dtype)
        y, z = jaxgemm.matmul(a, b, bias=bias, activation="relu", return_pre_activation=True)
        z_ref = _reference(a, b) + to64(bias)
        assert rel_error(z, z_ref) <= tolerance
        assert rel_error(y, np.maximum(z_ref, 0)) <= tolerance


@pytest.mark.gpu
@pytest.mark.parametrize("tile", SM90_TF32_TILES)
def test_gpu_tf32_on_every_sm90_tile(tile):
    """float32 with tf32 allowed, forced onto each sm90 tile: every layout (on the cooperative
    tiles A stored (k, m) comes from registers; the pingpong tiles get K-major operands), K
    not a multiple of 4 (padded), ragged tiles, batches (one operand broadcast), split-K. The
    error must be tf32's: above exact fp32's, so the tensor cores ran."""
    from jaxgemm.gemm import GemmConfig, gemm_product

    _skip_unless_hopper("sm90")
    rng = np.random.default_rng(hash(tile) % 2**32)
    shapes = [(8, 8, 8), (136, 264, 73), (296, 520, 203), (1000, 520, 4104), (4104, 1032, 264)]
    batches = [((), ()), ((3,), (3,)), ((), (2,)), ((2,), ())]
    for i, ((m, n, k), (ta, tb)) in enumerate(itertools.product(shapes, LAYOUTS)):
        batch_a, batch_b = batches[i % len(batches)]
        split_k = 3 if i % 3 == 2 else 1
        a, b = _operands(rng, m, n, k, jnp.float32, ta, tb, batch_a, batch_b)
        config = GemmConfig(ta, tb, True, jnp.dtype(jnp.float32), split_k=split_k, kernel="sm90", tile=tile)
        out = jax.jit(lambda a, b: gemm_product(a, b, config))(a, b)
        err = rel_error(out, _reference(a, b, ta, tb))
        assert 1e-6 < err <= TF32_TOLERANCE, (m, n, k, ta, tb, batch_a, batch_b, split_k, err)


@pytest.mark.gpu
@pytest.mark.parametrize("ta,tb", LAYOUTS)
@pytest.mark.parametrize("m,n,k", [(1, 4095, 127), (127, 1, 4095), (2048, 2048, 1024), (128, 8192, 2048)])
def test_gpu_tf32_heuristic(m, n, k, ta, tb):
    """precision="tensorfloat32" through the public API: tf32 tensor cores on Hopper (an
    error above exact fp32's), exact fp32 elsewhere."""
    from jaxgemm import _ffi

    rng = np.random.default_rng(hash((m, n, k, ta, tb, "tf32")) % 2**32)
    a, b = _operands(rng, m, n, k, jnp.float32, ta, tb)
    out = jaxgemm.matmul(a, b, transpose_a=ta, transpose_b=tb, precision="tensorfloat32")
    err = rel_error(out, _reference(a, b, ta, tb))
    assert err <= TF32_TOLERANCE, err
    if _ffi.cuda_compute_capability() == 90 and k > 1:
        assert err > 1e-6, err
    else:
        assert err <= 1e-5, err


@pytest.mark.gpu
@pytest.mark.parametrize("ta,tb", LAYOUTS)
def test_gpu_tf32_fused_epilogue(ta, tb):
    """tf32 with a fused epilogue (bias, gelu, aux), every layout, K not a multiple of 4: on
    Hopper the sm90 kernel runs it, so the error is tf32's (the tensor cores ran); elsewhere
    the product is exact fp32. Under vmap too."""
    rng = np.random.default_rng(23)
    a, b = _operands(rng, 300, 200, 523, jnp.float32, ta, tb)
    bias = random(rng, (200,), jnp.float32)
    fn = functools.partial(jaxgemm.matmul, transpose_a=ta, transpose_b=tb, precision="tensorfloat32",
                           activation="gelu", return_pre_activation=True)
    y, z = fn(a, b, bias=bias)
    z_ref = _reference(a, b, ta, tb) + to64(bias)
    err = rel_error(z, z_ref)
    assert err <= (TF32_TOLERANCE if _ffi.cuda_compute_capability() == 90 else 1e-5), err
    if _ffi.cuda_compute_capability() == 90:
        assert err > 1e-6, err
    assert rel_error(y, np.asarray(jax.nn.gelu(jnp.asarray(z_ref)), np.float64)) <= TF32_TOLERANCE
    ys, _ = jax.vmap(lambda a, bias: fn(a, b, bias=bias))(jnp.stack([a, a]), jnp.stack([bias, bias]))
    assert rel_error(ys[1], np.asarray(y, np.float64)) <= 1e-6


@pytest.mark.gpu
@pytest.mark.parametrize("ta,tb", LAYOUTS)
def test_gpu_tf32_general_epilogue(ta, tb):
    """tf32 with alpha, beta * C and a residual (the general epilogue), ragged M and N, every
    layout: with A from registers, accumulator rows are permuted tile rows
    (Sm90RegisterAFragments::Row), which the epilogue must undo."""
    rng = np.random.default_rng(29)
    m, n, k = 333, 260, 200
    a, b = _operands(rng, m, n, k, jnp.float32, ta, tb)
    c, res = random(rng, (m, n), jnp.float32), random(rng, (m, n), jnp.float32)
    out = jaxgemm.matmul(a, b, transpose_a=ta, transpose_b=tb, precision="tensorfloat32", alpha=0.5, beta=2.0,
                         c=c, residual=res, activation="relu")
    ref = np.maximum(0.5 * _reference(a, b, ta, tb) + 2.0 * to64(c), 0) + to64(res)
    err = rel_error(out, ref)
    assert err <= TF32_TOLERANCE, err
    if _ffi.cuda_compute_capability() == 90:
        assert err > 1e-6, err


@pytest.mark.gpu
def test_gpu_tf32_nn_runs_transposed_without_copies():
    """tf32 with a stored (m, k) and b stored (k, n), no epilogue: the kernel computes
    D^T = B^T A^T and writes its tiles transposed into D, so the lowering makes no copy of b;
    ragged M and K, a batch with b broadcast, alpha. With a bias, b is transposed first."""
    _skip_unless_hopper("sm90")
    rng = np.random.default_rng(31)
    for batch, (m, n, k) in [((), (333, 260, 203)), ((3,), (1000, 1032, 520)), ((), (4104, 1032, 264))]:
        a = random(rng, batch + (m, k), jnp.float32)
        b = random(rng, (k, n), jnp.float32)
        fn = jax.jit(lambda a, b: jaxgemm.matmul(a, b, precision="tensorfloat32", alpha=1.5))
        assert "stablehlo.transpose" not in fn.lower(a, b).as_text(), (batch, m, n, k)
        err = rel_error(fn(a, b), 1.5 * _reference(a, b, False, False))
        assert 1e-6 < err <= TF32_TOLERANCE, (batch, m, n, k, err)
    bias = random(rng, (n,), jnp.float32)
    with_bias = jax.jit(lambda a, b: jaxgemm.matmul(a, b, bias=bias, precision="tensorfloat32"))
    assert "stablehlo.transpose" in with_bias.lower(a, b).as_text()


@pytest.mark.gpu
@pytest.mark.parametrize("tile", SM90_TILES)
def test_gpu_sm90_tma_stores_scale_by_alpha(tile):
    """alpha != 1 with no other epilogue: the plain TMA-store epilogue scales the values as it
    packs them, for 16-bit and float outputs (tf32 with A from shared memory and from
    registers too), with several tiles per block and ragged edges."""
    from jaxgemm.gemm import GemmConfig, gemm_product

    _skip_unless_hopper("sm90")
    rng = np.random.default_rng(hash(("alpha", tile)) % 2**32)
    cases = [(jnp.bfloat16, jnp.bfloat16, False), (jnp.bfloat16, jnp.float32, True), (jnp.float16, jnp.float32, False),
             (jnp.float32, jnp.float32, False), (jnp.float32, jnp.float32, True)]
    for (m, n, k), (dtype, out_dtype, ta) in itertools.product([(296, 520, 200), (4104, 1032, 264)], cases):
        tf32 = dtype == jnp.float32
        if (tf32 and tile in SM90_16BIT_ONLY_TILES) or (ta and tile in SM90_A_MK_ONLY_TILES):
            continue
        a, b = _operands(rng, m, n, k, dtype, ta, False)
        config = GemmConfig(ta, False, tf32, jnp.dtype(out_dtype), kernel="sm90", tile=tile, alpha=-0.75)
        out = jax.jit(lambda a, b: gemm_product(a, b, config))(a, b)
        assert out.dtype == jnp.dtype(out_dtype)
        err = rel_error(out, -0.75 * _reference(a, b, ta, False))
        tolerance = TF32_TOLERANCE if tf32 else TOLERANCE[jnp.dtype(dtype)]
        assert err <= tolerance, (m, n, k, dtype, out_dtype, ta, err)


@pytest.mark.gpu
def test_gpu_tensor_core_heuristic_choices():
    """Shapes where the heuristic splits K or picks either sm90 tile come out right."""
    from jaxgemm import _ffi

    sms = _ffi.cuda_sm_count()
    assert _ffi.tensor_core_split_k(16, 2048, 8192, 1, sms) > 1
    assert _ffi.tensor_core_split_k(8192, 8192, 8192, 1, sms) == 1
    rng = np.random.default_rng(18)
    for m, n, k in [(16, 8192, 8192), (128, 4096, 8192), (2048, 2048, 512), (4096, 4096, 256)]:
        a, b = _operands(rng, m, n, k, jnp.bfloat16, False, False)
        out = jaxgemm.matmul(a, b)
        assert rel_error(out, _reference(a, b)) <= TOLERANCE[jnp.dtype(jnp.bfloat16)], (m, n, k)


@pytest.mark.gpu
@pytest.mark.parametrize("k", [40, 64, 72, 128])
def test_gpu_shallow_batched_products_on_the_heuristic(k):
    """Attention-like shallow products (q k^T: B stored (n, k), batched), which the heuristic
    gives the 192 x 128 tile: ragged rows and K, bias, gelu and the pre-activation output."""
    batch, m, n = 12, 520, 500
    assert _ffi.sm90_choice(m, n, k, batch, 132, False, False, True)[:2] == (192, 128)
    rng = np.random.default_rng(k)
    a = jnp.asarray(rng.standard_normal((batch, m, k)), jnp.bfloat16)
    b = jnp.asarray(rng.standard_normal((batch, n, k)), jnp.bfloat16)
    bias = jnp.asarray(rng.standard_normal(n), jnp.bfloat16)
    y, z = jaxgemm.matmul(a, b, transpose_b=True, bias=bias, activation="gelu", return_pre_activation=True)
    z64 = np.einsum("bmk,bnk->bmn", to64(a), to64(b)) + to64(bias)
    tol = TOLERANCE[jnp.dtype(jnp.bfloat16)]
    assert rel_error(z, z64) <= tol
    assert rel_error(y, np.asarray(jax.nn.gelu(jnp.asarray(z64, jnp.float32)), np.float64)) <= tol
    plain = jaxgemm.matmul(a, b, transpose_b=True)
    assert rel_error(plain, z64 - to64(bias)) <= tol


@pytest.mark.gpu
@pytest.mark.parametrize("transpose_b", [False, True])
def test_gpu_shallow_products_within_two_waves_on_the_heuristic(transpose_b):
    """Batched products of K = 248 within two waves, which the heuristic gives the pingpong
    128 x 128 (session 37): ragged rows, columns and K, both ways of storing B, bias, silu
    and the pre-activation output."""
    batch, m, n, k = 32, 250, 250, 248  # (K: 16-byte rows, not a multiple of 64)
    assert _ffi.sm90_choice(m, n, k, batch, 132, False, False, transpose_b) == (128, 128, 1)
    rng = np.random.default_rng(248)
    a = jnp.asarray(rng.standard_normal((batch, m, k)), jnp.bfloat16)
    b64 = rng.standard_normal((batch, k, n))
    b = jnp.asarray(b64.transpose(0, 2, 1) if transpose_b else b64, jnp.bfloat16)
    bias = jnp.asarray(rng.standard_normal(n), jnp.bfloat16)
    y, z = jaxgemm.matmul(a, b, transpose_b=transpose_b, bias=bias, activation="silu", return_pre_activation=True)
    z64 = np.einsum("bmk,bkn->bmn", to64(a), to64(b).transpose(0, 2, 1) if transpose_b else to64(b)) + to64(bias)
    tol = TOLERANCE[jnp.dtype(jnp.bfloat16)]
    assert rel_error(z, z64) <= tol
    assert rel_error(y, np.asarray(jax.nn.silu(jnp.asarray(z64, jnp.float32)), np.float64)) <= tol


@pytest.mark.gpu
@pytest.mark.parametrize("transpose_a", [False, True])
def test_gpu_192_row_tiles_over_many_row_blocks_on_the_heuristic(transpose_a):
    """The heuristic's 192 x 128 tile beyond 384 rows (session 36): four row blocks, the last
    with 124 rows (its third consumer's rows all out of range), ragged N and K, both ways of
    storing A, bias, relu and the pre-activation output."""
    m, n, k = 700, 4100, 1000
    assert _ffi.sm90_choice(m, n, k, 1, 132, False, transpose_a)[:2] == (192, 128)
    rng = np.random.default_rng(7)
    a64 = rng.standard_normal((m, k))
    a = jnp.asarray(a64.T if transpose_a else a64, jnp.bfloat16)
    b = jnp.asarray(rng.standard_normal((k, n)), jnp.bfloat16)
    bias = jnp.asarray(rng.standard_normal(n), jnp.bfloat16)
    y, z = jaxgemm.matmul(a, b, transpose_a=transpose_a, bias=bias, activation="relu", return_pre_activation=True)
    a_ = to64(a).T if transpose_a else to64(a)
    z64 = a_ @ to64(b) + to64(bias)
    tol = TOLERANCE[jnp.dtype(jnp.bfloat16)]
    assert rel_error(z, z64) <= tol
    assert rel_error(y, np.maximum(z64, 0.0)) <= tol


@pytest.mark.gpu
def test_gpu_float32_outputs_of_shallow_products_on_the_heuristic():
    """bf16 inputs with a float32 product: the heuristic's pingpong for shallow K (session 36),
    batched, ragged rows, the lowering sizing its workspace with the same output type."""
    batch, m, n, k = 16, 1030, 1000, 64
    assert _ffi.sm90_choice(m, n, k, batch, 132, False, False, False, True) == (128, 128, 1)
    rng = np.random.default_rng(3)
    a = jnp.asarray(rng.standard_normal((batch, m, k)), jnp.bfloat16)
    b = jnp.asarray(rng.standard_normal((batch, k, n)), jnp.bfloat16)
    out = jaxgemm.matmul(a, b, out_dtype=jnp.float32)
    assert out.dtype == jnp.float32
    assert rel_error(out, np.einsum("bmk,bkn->bmn", to64(a), to64(b))) <= TOLERANCE[jnp.dtype(jnp.float32)]


@pytest.mark.gpu
def test_gpu_forced_kernel_that_cannot_run_is_an_error():
    from jaxgemm import _ffi
    from jaxgemm.gemm import GemmConfig, gemm_product

    a = jnp.ones((8, 12), jnp.bfloat16)  # rows of 24 bytes: no TMA, no 16-byte cp.async
    for kernel in ("sm80", "sm90"):
        with pytest.raises(Exception, match=f"the {kernel} kernel cannot take"):
            config = GemmConfig(transpose_b=True, out_dtype=jnp.dtype(jnp.bfloat16), kernel=kernel)
            jax.block_until_ready(gemm_product(a, a, config))
    if _ffi.cuda_compute_capability() == 90:  # a tile built for 16-bit inputs only, asked for tf32
        f = jnp.ones((256, 256), jnp.float32)
        config = GemmConfig(transpose_b=True, tf32=True, out_dtype=jnp.dtype(jnp.float32), kernel="sm90", tile=(192, 128))
        with pytest.raises(Exception, match="the 192x128 tile is built for 16-bit inputs only"):
            jax.block_until_ready(gemm_product(f, f, config))
        config = GemmConfig(transpose_b=True, tf32=True, out_dtype=jnp.dtype(jnp.float32), kernel="sm90", tile=(160, 128))
        with pytest.raises(Exception, match="the 160x128 tile is built for 16-bit inputs only"):
            jax.block_until_ready(gemm_product(f, f, config))
        # The swapped tile multiplies A^T as its K-major B: A stored (k, m) is refused.
        h = jnp.ones((64, 64), jnp.bfloat16)
        config = GemmConfig(transpose_a=True, out_dtype=jnp.dtype(jnp.bfloat16), kernel="sm90", tile=(160, 128))
        with pytest.raises(Exception, match=r"the 160x128 tile takes A stored \(m, k\) only"):
            jax.block_until_ready(gemm_product(h, h, config))


def test_unknown_kernel_family_is_a_value_error():
    from jaxgemm.gemm import GemmConfig

    with pytest.raises(ValueError, match="GemmConfig.kernel"):
        GemmConfig(kernel="sm70")


@pytest.mark.gpu
def test_gpu_many_batches_beyond_grid_limit():
    rng = np.random.default_rng(17)
    a, b = random(rng, (70000, 2, 3), jnp.float32), random(rng, (70000, 3, 2), jnp.float32)
    assert rel_error(jaxgemm.matmul(a, b), np.matmul(to64(a), to64(b))) <= 1e-5


def test_runs_on_expected_backend():
    assert jaxgemm.WITH_CUDA or not on_gpu()


# --- split-K ------------------------------------------------------------------------------


@pytest.mark.parametrize("split_k", [2, 3, 7])
@pytest.mark.parametrize("ta,tb", LAYOUTS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_split_k_partials_sum_to_product(split_k, ta, tb, dtype):
    """Forced split-K (the GPU heuristic picks it for small outputs with long K)."""
    from jaxgemm.gemm import GemmConfig, gemm_product

    rng = np.random.default_rng(18)
    a, b = _operands(rng, 9, 13, 203, dtype, ta, tb, batch_a=(2,))
    config = GemmConfig(ta, tb, False, jnp.dtype(dtype), split_k=split_k)
    out = jax.jit(lambda a, b: gemm_product(a, b, config))(a, b)
    assert out.dtype == jnp.dtype(dtype)
    assert rel_error(out, _reference(a, b, ta, tb)) <= TOLERANCE[jnp.dtype(dtype)]
    text = jax.jit(lambda a, b: gemm_product(a, b, config)).lower(a, b).as_text()
    assert f"split_k = {split_k}" in text


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("m,n,k", [(8, 8, 8), (1000, 1000, 1000), (136, 264, 40), (2048, 1024, 4096)])
def test_gpu_tensor_core_path(m, n, k, dtype):
    """Leading dims that are multiples of 8 take the sm80 mma.sync kernel; ragged tiles."""
    rng = np.random.default_rng(hash((m, n, k)) % 2**32)
    for ta, tb in LAYOUTS:
        for batch_a, batch_b in [((), ()), ((2,), ()), ((), (2,))]:
            a, b = _operands(rng, m, n, k, dtype, ta, tb, batch_a, batch_b)
            for out_dtype in (dtype, jnp.float32):
                out = jaxgemm.matmul(a, b, transpose_a=ta, transpose_b=tb, out_dtype=out_dtype)
                err = rel_error(out, _reference(a, b, ta, tb))
                assert err <= TOLERANCE[jnp.dtype(dtype)], (ta, tb, batch_a, batch_b, out_dtype, err)


@pytest.mark.gpu
@pytest.mark.parametrize("split_k", [2, 5])
def test_gpu_tensor_core_split_k(split_k):
    from jaxgemm.gemm import GemmConfig, gemm_product

    rng = np.random.default_rng(19)
    a, b = _operands(rng, 128, 256, 4000, jnp.bfloat16, False, False)
    out = gemm_product(a, b, GemmConfig(out_dtype=jnp.dtype(jnp.bfloat16), split_k=split_k))
    assert rel_error(out, _reference(a, b)) <= 1e-2
