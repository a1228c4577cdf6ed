"""Fused epilogues (bias, activations, alpha/beta*C, residual, aux) and `jaxgemm.dense`,
forward against float64 references and gradients against pure-JAX references."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import jaxgemm
from jaxgemm import activations, kernels
from jaxgemm.epilogue import bias_act_grad
from reference import ACTIVATIONS, TOLERANCE, jaxpr_equations, op, random, rel_error, to64

DTYPES = [jnp.float32, jnp.float16, jnp.bfloat16]
ACTS = [None, "relu", "gelu", "gelu_exact", "silu", "sigmoid", "tanh"]
LAYOUTS = list(itertools.product([False, True], repeat=2))


def _epilogue_reference(a, b, ta, tb, bias=None, act=None, alpha=1.0, beta=0.0, c=None, residual=None):
    z = alpha * np.matmul(op(to64(a), ta), op(to64(b), tb))
    if c is not None:
        z = z + beta * to64(c)
    if bias is not None:
        z = z + to64(bias)
    y = ACTIVATIONS[act](z)
    if residual is not None:
        y = y + to64(residual)
    return y, z


def _jax_reference(a, b, bias=None, act=None, alpha=1.0, beta=0.0, c=None, residual=None, ta=False, tb=False):
    """The same function in plain JAX (float32, exact), for gradient comparisons."""
    a = jnp.swapaxes(a, -1, -2) if ta else a
    b = jnp.swapaxes(b, -1, -2) if tb else b
    z = alpha * jnp.matmul(a, b, precision="highest")
    if c is not None:
        z = z + beta * c
    if bias is not None:
        z = z + bias
    y = activations.apply(act, z)
    return y + residual if residual is not None else y


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ACTS)
def test_every_activation_and_dtype(act, dtype):
    rng = np.random.default_rng(abs(hash((act, str(dtype)))) % 2**32)
    m, n, k = 37, 19, 45
    a, b = random(rng, (m, k), dtype), random(rng, (k, n), dtype)
    bias, c, res = random(rng, (n,), dtype), random(rng, (m, n), dtype), random(rng, (m, n), dtype)
    y, z = jax.jit(
        lambda a, b, bias, c, res: jaxgemm.matmul(
            a, b, bias=bias, activation=act, alpha=0.5, beta=2.0, c=c, residual=res, return_pre_activation=True
        )
    )(a, b, bias, c, res)
    ry, rz = _epilogue_reference(a, b, False, False, bias, act, 0.5, 2.0, c, res)
    assert y.dtype == z.dtype == jnp.dtype(dtype)
    tol = TOLERANCE[jnp.dtype(dtype)]
    assert rel_error(z, rz) <= tol
    assert rel_error(y, ry) <= tol


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("ta,tb", LAYOUTS)
def test_layouts_and_batches(ta, tb, dtype):
    """Every layout, batched; m, n and k not multiples of 8 (16-bit operands are padded to
    the tensor cores' 16-byte rows, c, bias and residual with them, the outputs sliced)."""
    rng = np.random.default_rng(1)
    m, n, k = 9, 13, 21
    a = random(rng, (3, k, m) if ta else (3, m, k), dtype)
    b = random(rng, (n, k) if tb else (k, n), dtype)
    bias, c, res = random(rng, (n,), dtype), random(rng, (3, m, n), dtype), random(rng, (3, m, n), dtype)
    y, z = jaxgemm.matmul(a, b, transpose_a=ta, transpose_b=tb, bias=bias, activation="gelu", residual=res, c=c,
                          beta=0.5, return_pre_activation=True)  # fmt: skip
    ry, rz = _epilogue_reference(a, b, ta, tb, bias, "gelu", beta=0.5, c=c, residual=res)
    assert y.shape == z.shape == (3, m, n)
    tol = TOLERANCE[jnp.dtype(dtype)]
    assert rel_error(y, ry) <= tol and rel_error(z, rz) <= tol


def test_broadcast_epilogue_operands():
    rng = np.random.default_rng(2)
    a, b = random(rng, (2, 1, 5, 7), jnp.float32), random(rng, (3, 7, 4), jnp.float32)
    bias = random(rng, (3, 4), jnp.float32)  # per batch of b
    c = random(rng, (5, 4), jnp.float32)  # shared by all batches
    res = random(rng, (1, 3, 1, 4), jnp.float32)  # broadcast rows
    y = jaxgemm.matmul(a, b, bias=bias, c=c, beta=-1.0, residual=res, activation="tanh")
    ry, _ = _epilogue_reference(a, b, False, False, bias[:, None, :], "tanh", 1.0, -1.0, c, res)
    assert y.shape == (2, 3, 5, 4)
    assert rel_error(y, ry) <= 1e-5


def test_out_dtype_with_epilogue():
    rng = np.random.default_rng(3)
    a, b = random(rng, (16, 32), jnp.bfloat16), random(rng, (32, 8), jnp.bfloat16)
    bias = random(rng, (8,), jnp.bfloat16)
    y = jaxgemm.matmul(a, b, bias=bias, activation="relu", out_dtype=jnp.float32)
    assert y.dtype == jnp.float32
    ry, _ = _epilogue_reference(a, b, False, False, bias, "relu")
    assert rel_error(y, ry) <= 1e-5


@pytest.mark.parametrize("act", ACTS)
def test_grads_wrt_every_input(act):
    rng = np.random.default_rng(4)
    m, n, k = 6, 5, 7
    args = [random(rng, s, jnp.float32) for s in [(m, k), (k, n), (n,), (m, n), (m, n)]]
    # Keep z away from relu's kink so finite differences are meaningful.
    f = lambda a, b, bias, c, res: jaxgemm.matmul(  # noqa: E731
        a, b, bias=bias, activation=act, alpha=0.7, beta=1.3, c=c, residual=res
    )
    ref = lambda a, b, bias, c, res: _jax_reference(a, b, bias, act, 0.7, 1.3, c, res)  # noqa: E731
    ct = random(rng, (m, n), jnp.float32)
    _, vjp = jax.vjp(f, *args)
    _, ref_vjp = jax.vjp(ref, *args)
    for got, want in zip(vjp(ct), ref_vjp(ct)):
        assert rel_error(got, to64(want)) <= 1e-5
    if act != "relu":
        check_grads(f, args, order=1, modes=("rev",), atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("act", ["relu", "gelu"])
def test_relu_gradient_is_read_off_the_output(act):
    """relu without a residual: the backward takes relu'(z) from y > 0, so the forward
    GEMM under vjp writes no pre-activation (gelu, the control, does); the gradients still
    match the reference for every input, C included."""
    rng = np.random.default_rng(12)
    m, n, k = 33, 24, 20
    args = [random(rng, s, jnp.float32) for s in [(m, k), (k, n), (n,), (m, n)]]
    f = lambda a, b, bias, c: jaxgemm.matmul(a, b, bias=bias, activation=act, alpha=0.7, beta=1.3, c=c)  # noqa: E731
    ref = lambda a, b, bias, c: _jax_reference(a, b, bias, act, 0.7, 1.3, c)  # noqa: E731
    ct = random(rng, (m, n), jnp.float32)
    got = jax.jit(lambda *a: jax.vjp(f, *a)[1](ct))(*args)
    want = jax.vjp(ref, *args)[1](ct)
    for g, w in zip(got, want):
        assert rel_error(g, to64(w)) <= 1e-5
    # The fused forward writes z only for gelu; the backward's GEMMs are the plain GEMM primitive.
    jaxpr = jax.make_jaxpr(lambda *a: jax.vjp(f, *a)[1](ct))(*args)
    calls = [len(e.outvars) for e in jaxpr_equations(jaxpr.jaxpr) if e.primitive.name == "jaxgemm_gemm_epilogue"]
    assert calls and all(outputs == (1 if act == "relu" else 2) for outputs in calls), calls


@pytest.mark.parametrize("ta,tb", LAYOUTS)
def test_grads_of_aux_output_and_layouts(ta, tb):
    rng = np.random.default_rng(5)
    a = random(rng, (2, 7, 6) if ta else (2, 6, 7), jnp.float32)
    b = random(rng, (5, 7) if tb else (7, 5), jnp.float32)
    bias = random(rng, (5,), jnp.float32)

    def loss(a, b, bias):
        y, z = jaxgemm.matmul(a, b, transpose_a=ta, transpose_b=tb, bias=bias, activation="silu", return_pre_activation=True)
        return (y**2).sum() + (jnp.sin(z)).sum()

    def ref_loss(a, b, bias):
        aa = jnp.swapaxes(a, -1, -2) if ta else a
        bb = b.T if tb else b
        z = jnp.matmul(aa, bb, precision="highest") + bias
        return (jax.nn.silu(z) ** 2).sum() + jnp.sin(z).sum()

    got = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(a, b, bias)
    want = jax.grad(ref_loss, argnums=(0, 1, 2))(a, b, bias)
    for g, w in zip(got, want):
        assert rel_error(g, to64(w)) <= 1e-5


@pytest.mark.parametrize("act", ["gelu", "relu"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_dense_forward_and_backward(act, dtype):
    rng = np.random.default_rng(6)
    x, w, bias = random(rng, (3, 40, 24), dtype), random(rng, (24, 16), dtype), random(rng, (16,), dtype)
    y = jaxgemm.dense(x, w, bias, act)
    ry, _ = _epilogue_reference(x, w, False, False, bias, act)
    assert y.shape == (3, 40, 16) and y.dtype == jnp.dtype(dtype)
    tol = TOLERANCE[jnp.dtype(dtype)]
    assert rel_error(y, ry) <= tol
    ct = random(rng, y.shape, dtype)
    f32 = lambda t: t.astype(jnp.float32)  # noqa: E731
    got = jax.vjp(lambda x, w, b: jaxgemm.dense(x, w, b, act), x, w, bias)[1](ct)
    want = jax.vjp(lambda x, w, b: _jax_reference(x, w, b, act), f32(x), f32(w), f32(bias))[1](f32(ct))
    for g, r in zip(got, want):
        assert g.dtype == jnp.dtype(dtype)
        assert rel_error(g, to64(r)) <= 4 * tol  # z and dz are rounded to dtype on the way


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_bias_act_grad_kernel(act, dtype):
    """The fused backward alone, with the aux cotangent: vector path (columns a multiple of
    16 bytes, spanning several blocks; rows of 8-16 vectors on the narrow blocks), scalar
    path (odd columns), ragged row chunks, and more than 256 chunks (many rows of few
    columns: a first conv layer's output)."""
    rng = np.random.default_rng(21)
    for rows, cols in ((300, 264), (130, 70), (2, 8), (20000, 16), (1000, 128), (500, 64)):
        dy, z, extra = (random(rng, (rows, cols), dtype) for _ in range(3))
        dz, dbias = jax.jit(lambda dy, z, e: bias_act_grad(dy, z, e, act))(dy, z, extra)
        f32 = lambda t: jnp.asarray(t, jnp.float32)  # noqa: E731
        want = f32(dy) * jax.vmap(jax.vmap(jax.grad(lambda v: activations.apply(act, v))))(f32(z)) + f32(extra)
        tol = TOLERANCE[jnp.dtype(dtype)]
        assert dz.dtype == jnp.dtype(dtype) and rel_error(dz, to64(want)) <= tol, (rows, cols)
        assert dbias.dtype == jnp.float32 and rel_error(dbias, to64(want.sum(0))) <= tol, (rows, cols)


def test_bias_act_grad_grid():
    """Up to 256 row chunks of >= 64 rows; more where the columns are few, until ~2048 blocks."""
    from jaxgemm.epilogue import _bag_chunks

    assert _bag_chunks(100, 4096, 2) == 2 and _bag_chunks(16384, 3072, 2) == 256
    assert _bag_chunks(512 * 28 * 28, 128, 2) == 2048  # 128 bf16 channels: one block of columns
    assert _bag_chunks(10**6, 4096, 2) == 256 and _bag_chunks(20000, 16, 4) == 313
    assert _bag_chunks(10**9, 8, 2) == 2048 and _bag_chunks(5, 0, 2) == 1


def test_dense_bias_grad_spans_many_row_chunks():
    rng = np.random.default_rng(7)
    x, w, bias = random(rng, (1000, 8), jnp.float32), random(rng, (8, 70), jnp.float32), random(rng, (70,), jnp.float32)
    ct = random(rng, (1000, 70), jnp.float32)
    got = jax.vjp(lambda b: jaxgemm.dense(x, w, b, "gelu_exact"), bias)[1](ct)[0]
    want = jax.vjp(lambda b: _jax_reference(x, w, b, "gelu_exact"), bias)[1](ct)[0]
    assert rel_error(got, to64(want)) <= 1e-5


def test_vmap_of_fused_and_of_its_grad():
    rng = np.random.default_rng(8)
    x, w, bias = random(rng, (4, 6, 8), jnp.float32), random(rng, (8, 5), jnp.float32), random(rng, (5,), jnp.float32)
    ws = random(rng, (4, 8, 5), jnp.float32)
    out = jax.vmap(lambda x, w: jaxgemm.dense(x, w, bias, "sigmoid"))(x, ws)
    ref = jax.vmap(lambda x, w: _jax_reference(x, w, bias, "sigmoid"))(x, ws)
    assert rel_error(out, to64(ref)) <= 1e-5
    loss = lambda w, x: jaxgemm.dense(x, w, bias, "gelu").sum()  # noqa: E731
    ref_loss = lambda w, x: _jax_reference(x, w, bias, "gelu").sum()  # noqa: E731
    got = jax.vmap(jax.grad(loss), in_axes=(None, 0))(w, x)  # per-example weight gradients
    want = jax.vmap(jax.grad(ref_loss), in_axes=(None, 0))(w, x)
    assert rel_error(got, to64(want)) <= 1e-5


def test_one_fused_kernel_per_step():
    x, w, b = jnp.ones((64, 32)), jnp.ones((32, 16)), jnp.ones((16,))
    fwd = jax.jit(lambda x, w, b: jaxgemm.dense(x, w, b, "gelu")).lower(x, w, b).as_text()
    assert fwd.count("jaxgemm_gemm") == 1 and "dot_general" not in fwd
    bwd = jax.jit(jax.grad(lambda x, w, b: jaxgemm.dense(x, w, b, "gelu").sum(), argnums=(0, 1, 2)))
    text = bwd.lower(x, w, b).as_text()
    assert text.count("jaxgemm_bias_act_grad") == 1 and text.count("jaxgemm_gemm") == 3
    assert "dot_general" not in text


@pytest.mark.parametrize(
    "kwargs,pattern",
    [
        ({"activation": "swish"}, "unknown activation 'swish'"),
        ({"bias": jnp.ones((5,))}, r"bias of shape \(5,\)"),
        ({"bias": jnp.ones((2, 4))}, r"bias of shape \(2, 4\) does not fit"),
        ({"c": jnp.ones((3, 5)), "beta": 1.0}, r"c of shape \(3, 5\) does not fit \(3, 4\)"),
        ({"residual": jnp.ones((2, 3, 4))}, r"residual of shape \(2, 3, 4\) does not fit"),
        ({"beta": 1.0}, "beta=1.0 needs c"),
    ],
)
def test_bad_epilogue_arguments(kwargs, pattern):
    a, b = jnp.ones((3, 6)), jnp.ones((6, 4))
    with pytest.raises(ValueError, match=pattern):
        jax.jit(lambda a, b: jaxgemm.matmul(a, b, **kwargs)).lower(a, b)


def test_bad_dense_arguments():
    with pytest.raises(ValueError, match=r"x\(3, 5\) and w\(6, 4\)"):
        jaxgemm.dense(jnp.ones((3, 5)), jnp.ones((6, 4)))
    with pytest.raises(ValueError, match=r"bias must have shape \(4,\)"):
        jaxgemm.dense(jnp.ones((3, 6)), jnp.ones((6, 4)), jnp.ones((3,)))
    with pytest.raises(ValueError, match="rank >= 2"):
        jaxgemm.matmul(jnp.ones((6,)), jnp.ones((6, 4)), activation="relu")


# --- GPU-only ---------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize(
    "kernel_tile,dtype",
    [(("simt", t), jnp.float32) for t in kernels.SIMT_TILES]
    + [(k, d) for k in [("simt", (128, 128)), ("sm80", None), *(("sm90", s.tile) for s in kernels.SM90_SCHEDULES if s.half),
                        (None, None)]
       for d in (jnp.float16, jnp.bfloat16)],
)
def test_gpu_epilogue_on_every_kernel(kernel_tile, dtype):
    """kernel None: the heuristic, i.e. tensor cores for 16-bit inputs (aligned rows here)."""
    from jaxgemm import _ffi

    kernel, tile = kernel_tile
    if kernel == "sm90" and _ffi.cuda_compute_capability() != 90:
        pytest.skip("the sm90 kernel needs compute capability 9.0")
    from jaxgemm.epilogue import EpilogueConfig, fused_matmul
    from jaxgemm.gemm import GemmConfig

    rng = np.random.default_rng(9)
    m, n, k = 257, 136, 304
    for act in ACTS:
        a, b = random(rng, (m, k), dtype), random(rng, (n, k), dtype)
        bias, c, res = random(rng, (n,), dtype), random(rng, (m, n), dtype), random(rng, (m, n), dtype)
        config = GemmConfig(False, True, False, jnp.dtype(dtype), kernel=kernel, tile=tile, alpha=1.5)
        y, z = fused_matmul(a, b, c, bias, res, config, EpilogueConfig(act, 0.25, True))
        ry, rz = _epilogue_reference(a, b, False, True, bias, act, 1.5, 0.25, c, res)
        tol = TOLERANCE[jnp.dtype(dtype)]
        assert rel_error(z, rz) <= tol and rel_error(y, ry) <= tol, act


# The sm90 TMA-store epilogue with bias, activation and aux (no C or residual, which take
# the general epilogue): each schedule, M and N not multiples of the tile or of 64, with and
# without aux (the boxes alternate / both hold one block), batches with and without a
# per-batch bias (3-D maps), and N % 8 != 0 (no TMA store: the general epilogue).
SM90_TMA_EPILOGUE_CASES = [
    # (batch_a, batch_b, bias_batched, m, n, k, transpose_b)
    ((), (), False, 300, 200, 264, False),
    ((), (), False, 129, 72, 64, True),
    ((3,), (3,), False, 200, 136, 192, False),
    ((2,), (2,), True, 72, 264, 128, True),
    ((), (), False, 150, 133, 96, True),  # ldd = 133: the general epilogue
]


@pytest.mark.gpu
@pytest.mark.parametrize("tile", [(128, 128), (128, 256), (256, 256), (64, 64)])
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("case", SM90_TMA_EPILOGUE_CASES, ids=[str(c) for c in SM90_TMA_EPILOGUE_CASES])
def test_gpu_sm90_fused_tma_store_epilogue(case, dtype, tile):
    from jaxgemm import _ffi

    if _ffi.cuda_compute_capability() != 90:
        pytest.skip("the sm90 kernel needs compute capability 9.0")
    from jaxgemm.epilogue import EpilogueConfig, fused_matmul
    from jaxgemm.gemm import GemmConfig

    batch_a, batch_b, bias_batched, m, n, k, tb = case
    rng = np.random.default_rng(11)
    a = random(rng, batch_a + (m, k), dtype)
    b = random(rng, batch_b + ((n, k) if tb else (k, n)), dtype)
    bias = random(rng, (batch_b + (n,)) if bias_batched else (n,), dtype)
    ref_bias = bias[..., None, :] if bias_batched else bias
    tol = TOLERANCE[jnp.dtype(dtype)]
    for act, with_bias, want_aux, alpha in [
        ("gelu", True, True, 1.0),
        ("gelu", True, False, 1.0),
        ("silu", False, True, 0.75),
        (None, True, True, 1.0),
        (None, True, False, 1.5),
        ("relu", True, True, -0.5),
        ("gelu_exact", True, True, 1.0),
        ("sigmoid", True, False, 1.0),
        ("tanh", False, True, 1.0),
    ]:
        config = GemmConfig(False, tb, False, jnp.dtype(dtype), kernel="sm90", tile=tile, alpha=alpha)
        out = fused_matmul(a, b, None, bias if with_bias else None, None, config, EpilogueConfig(act, 0.0, want_aux))
        y, z = out if want_aux else (out, None)
        ry, rz = _epilogue_reference(a, b, False, tb, ref_bias if with_bias else None, act, alpha)
        assert y.dtype == jnp.dtype(dtype) and y.shape == ry.shape, act
        # The norm-wise error, and every element within a few output roundings of the
        # largest (a block stored at the wrong place, or with a wrong bias, fails either).
        for got, want in [(y, ry)] + ([(z, rz)] if want_aux else []):
            assert rel_error(got, want) <= tol, (act, with_bias, want_aux)
            assert np.max(np.abs(to64(got) - want)) <= 4 * tol * np.max(np.abs(want)), (act, with_bias, want_aux)


@pytest.mark.gpu
def test_gpu_dense_large_ragged():
    rng = np.random.default_rng(10)
    x, w, bias = random(rng, (4095, 1023), jnp.bfloat16), random(rng, (1023, 2049), jnp.bfloat16), random(rng, (2049,), jnp.bfloat16)
    y = jaxgemm.dense(x, w, bias, "gelu")
    ry, _ = _epilogue_reference(x, w, False, False, bias, "gelu")
    assert rel_error(y, ry) <= 1e-2
    ct = random(rng, y.shape, jnp.bfloat16)
    got = jax.vjp(lambda x, w, b: jaxgemm.dense(x, w, b, "gelu"), x, w, bias)[1](ct)
    f32 = lambda t: t.astype(jnp.float32)  # noqa: E731
    want = jax.vjp(lambda x, w, b: _jax_reference(x, w, b, "gelu"), f32(x), f32(w), f32(bias))[1](f32(ct))
    for g, r in zip(got, want):
        assert rel_error(g, to64(r)) <= 2e-2
