"""`jaxgemm.conv2d` against `lax.conv_general_dilated` (float32 HIGHEST on the exact,
upcast inputs): values and gradients over strides, dilations, paddings, groups, odd sizes,
C = 3, every epilogue and dtype; vmap, jit and argument errors. On a GPU the unmarked tests
run the CUDA kernels too; the `gpu` ones add shapes that span many tiles and k-tiles."""

import functools
import os
import pathlib
import shutil
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from reference import TOLERANCE, jaxpr_equations, random, rel_error

import jaxgemm
from jaxgemm import activations
from jaxgemm.conv import ConvConfig, _conv1x1_prefers_matmul, _padding, conv2d_dgrad, conv2d_wgrad

DTYPES = [jnp.float32, jnp.float16, jnp.bfloat16]
ACTS = [None, "relu", "gelu", "gelu_exact", "silu", "sigmoid", "tanh"]


def _lax_padding(padding):
    """conv2d's padding forms as lax.conv_general_dilated takes them."""
    if isinstance(padding, str):
        return padding
    if isinstance(padding, int):
        return ((padding, padding), (padding, padding))
    if all(isinstance(v, int) for v in padding):
        return tuple((v, v) for v in padding)
    return tuple(tuple(p) for p in padding)


def _reference(x, w, stride=1, padding="SAME", dilation=1, groups=1, bias=None, activation=None, residual=None):
    """The contract in float32 HIGHEST on upcast inputs."""
    pair = lambda v: (v, v) if isinstance(v, int) else tuple(v)
    f32 = lambda a: None if a is None else jnp.asarray(a, jnp.float32)
    z = lax.conv_general_dilated(
        f32(x),
        f32(w),
        pair(stride),
        _lax_padding(padding),
        rhs_dilation=pair(dilation),
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
        feature_group_count=groups,
        precision=lax.Precision.HIGHEST,
    )
    if bias is not None:
        z = z + f32(bias)
    y = activations.apply(activation, z)
    return y + f32(residual) if residual is not None else y


def _inputs(rng, n, h, w, c, k, r, s, groups, dtype):
    x = random(rng, (n, h, w, c), dtype)
    wt = random(rng, (r, s, c // groups, k), dtype) * (1.0 / np.sqrt(r * s * c // groups))
    return x, wt.astype(dtype)


def _check(shape, conv_kw, dtype=jnp.float32, act=None, with_bias=True, with_residual=False, grads=True, seed=0,
           kernel=None, out_dtype=None):
    """Forward and (optionally) gradients of every input against the reference; `kernel`
    forces a CUDA kernel family (ignored on CPU)."""
    n, h, w, c, k, r, s = shape
    rng = np.random.default_rng(seed)
    groups = conv_kw.get("groups", 1)
    x, wt = _inputs(rng, n, h, w, c, k, r, s, groups, dtype)
    bias = random(rng, (k,), dtype) if with_bias else None
    ref_y = _reference(x, wt, bias=bias, activation=act, **conv_kw)
    residual = random(rng, ref_y.shape, dtype) if with_residual else None
    if residual is not None:
        ref_y = ref_y + jnp.asarray(residual, jnp.float32)
    ours = functools.partial(jaxgemm.conv2d, activation=act, kernel=kernel, out_dtype=out_dtype, **conv_kw)
    y = jax.jit(lambda x, wt, b, res: ours(x, wt, bias=b, residual=res))(x, wt, bias, residual)
    tol = TOLERANCE[jnp.dtype(dtype)]
    assert y.dtype == jnp.dtype(out_dtype or dtype) and y.shape == ref_y.shape
    assert rel_error(y, ref_y) <= tol, rel_error(y, ref_y)
    if not grads or y.size == 0:
        return
    ct = random(rng, y.shape, dtype)
    args = [x, wt] + [a for a in (bias, residual) if a is not None]

    def split(args):
        it = iter(args[2:])
        return args[0], args[1], next(it) if with_bias else None, next(it) if with_residual else None

    def ours_fn(*args):
        x, wt, b, res = split(args)
        return ours(x, wt, bias=b, residual=res)

    def ref_fn(*args):
        x, wt, b, res = split(args)
        out = _reference(x, wt, bias=b, activation=act, **conv_kw)
        return out + res if res is not None else out

    got = jax.jit(lambda ct, *a: jax.vjp(ours_fn, *a)[1](ct))(ct, *args)
    want = jax.vjp(ref_fn, *[jnp.asarray(a, jnp.float32) for a in args])[1](jnp.asarray(ct, jnp.float32))
    for name, g, r in zip(["dx", "dw", "dbias", "dresidual"][: len(args)], got, want):
        assert g.shape == r.shape and g.dtype == jnp.dtype(dtype), name
        err = rel_error(g, r)
        assert err <= tol, f"{name}: {err}"


# (N, H, W, C, K, R, S), conv kwargs: small enough for the CPU reference.
GEOMETRY = [
    ((2, 8, 8, 4, 8, 3, 3), dict()),
    ((1, 7, 13, 5, 6, 3, 3), dict(stride=2)),
    ((3, 9, 7, 6, 4, 3, 3), dict(stride=(2, 1), padding="VALID")),
    ((2, 11, 10, 4, 6, 3, 2), dict(dilation=2)),
    ((1, 13, 13, 3, 5, 3, 3), dict(stride=2, dilation=(2, 3), padding=1)),
    ((2, 9, 10, 8, 8, 3, 3), dict(groups=2, stride=2)),
    ((1, 8, 9, 6, 9, 3, 3), dict(groups=3, padding=((2, 0), (1, 3)))),
    ((2, 7, 7, 4, 4, 1, 1), dict(groups=4)),  # depthwise
    ((1, 12, 11, 3, 8, 7, 7), dict(stride=2)),  # a first layer, C = 3
    ((3, 6, 5, 4, 6, 1, 1), dict(stride=2, padding="VALID")),  # strided 1x1 (dgrad skips pixels)
    ((1, 10, 9, 5, 3, 5, 3), dict(stride=3, padding=(2, 1))),  # stride 3 > dilation
    ((1, 7, 8, 4, 4, 3, 3), dict(padding=((-1, 2), (0, -1)))),  # negative padding crops
    ((2, 5, 5, 4, 8, 5, 5), dict(padding="VALID")),  # window = image: 1x1 output
    ((2, 11, 10, 4, 6, 3, 3), dict(stride=3, dilation=3, padding=2)),  # dgrad phases without taps
    ((1, 9, 13, 4, 4, 3, 2), dict(stride=(4, 5), padding=((1, 1), (0, 0)))),  # stride > filter
    ((3, 1, 2, 4, 6, 3, 3), dict(stride=(2, 3), padding=1)),  # image smaller than the stride
]


@pytest.mark.parametrize("kernel", [None, "sm80"])
@pytest.mark.parametrize("shape,conv_kw", GEOMETRY, ids=[f"{s}-{k}" for s, k in GEOMETRY])
def test_geometry_values_and_grads(shape, conv_kw, kernel):
    # kernel="sm80" also keeps few-channel dgrad on the phase-split conv kernel (the
    # heuristic's col2im route is the None run).
    _check(shape, conv_kw, with_bias=True, with_residual=False, kernel=kernel)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ACTS)
def test_epilogue_every_activation_and_dtype(act, dtype):
    _check((2, 7, 6, 8, 16, 3, 3), dict(stride=1), dtype, act, with_residual=True, grads=False, seed=3)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", [None, "relu", "gelu", "silu"])
def test_grads_with_epilogue(act, dtype):
    _check((2, 6, 7, 8, 8, 3, 3), dict(stride=2, padding="SAME"), dtype, act, with_residual=True, seed=4)


@pytest.mark.parametrize("act", ["relu", "gelu"])
def test_relu_gradient_is_read_off_the_output(act):
    """relu without a residual: the backward takes relu'(z) from y > 0, so the forward
    under vjp writes no pre-activation (gelu, the control, does); gradients still match."""
    _check((2, 6, 7, 8, 8, 3, 3), dict(stride=2, padding="SAME"), jnp.float32, act, seed=27)
    rng = np.random.default_rng(27)
    x, w = random(rng, (2, 6, 7, 8), jnp.float32), random(rng, (3, 3, 8, 8), jnp.float32)
    bias, ct = random(rng, (8,), jnp.float32), random(rng, (2, 6, 7, 8), jnp.float32)
    f = lambda x, w, b: jaxgemm.conv2d(x, w, padding="SAME", bias=b, activation=act)  # noqa: E731
    jaxpr = jax.make_jaxpr(lambda *a: jax.vjp(f, *a)[1](ct))(x, w, bias)
    forward = [e.params["want_aux"] for e in jaxpr_equations(jaxpr.jaxpr) if e.primitive.name == "jaxgemm_conv2d"]
    assert forward and all(want_aux == (act != "relu") for want_aux in forward), forward


@pytest.mark.parametrize("dtype", DTYPES)
def test_first_layer_c3_half(dtype):
    _check((2, 15, 14, 3, 8, 7, 7), dict(stride=2), dtype, "relu", seed=5)


COL2IM_CASES = [
    ((2, 15, 14, 3, 8, 7, 7), dict(stride=2)),
    ((1, 9, 10, 5, 6, 3, 3), dict(stride=(2, 3), dilation=(1, 2), padding=((2, 0), (1, 3)))),
    ((2, 8, 7, 16, 4, 3, 2), dict(padding="VALID")),
    ((1, 13, 13, 3, 5, 3, 3), dict(stride=2, dilation=(2, 3), padding=1)),  # phases without taps
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,conv_kw", COL2IM_CASES, ids=[f"{s}-{k}" for s, k in COL2IM_CASES])
def test_few_channel_dgrad_runs_as_gemm_and_col2im(shape, conv_kw, dtype):
    """dx of convs with C <= 16 (groups 1) is a GEMM into window columns plus col2im: it
    matches lax, under vmap too, and no dgrad conv kernel runs."""
    _check(shape, conv_kw, dtype, "gelu", with_residual=True, seed=19)
    n, h, w, c, k, r, s = shape
    rng = np.random.default_rng(20)
    x, wt = _inputs(rng, n, h, w, c, k, r, s, 1, dtype)
    loss = lambda x: jaxgemm.conv2d(x, wt, **conv_kw).astype(jnp.float32).sum()
    text = str(jax.make_jaxpr(jax.grad(loss))(x))
    assert "jaxgemm_col2im" in text and "jaxgemm_conv2d_dgrad" not in text
    xs = jnp.stack([x, 2 * x + 1])
    grads = jax.jit(jax.vmap(jax.grad(loss)))(xs)
    ref = jax.vmap(jax.grad(lambda x: _reference(x, wt, **conv_kw).sum()))(jnp.asarray(xs, jnp.float32))
    assert rel_error(grads, ref) <= TOLERANCE[jnp.dtype(dtype)]


WINDOW_GEMM_CASES = [
    ((2, 9, 8, 1, 16, 3, 3), dict()),  # MNIST's first layer: C = 1, padded to nothing
    ((2, 15, 14, 2, 8, 7, 7), dict(stride=2)),  # 7x7, stride 2, C = 2, the most the route takes
    ((1, 9, 10, 2, 6, 3, 3), dict(stride=(2, 3), dilation=(1, 2), padding=((2, 0), (1, 3)))),  # K = 6
    ((2, 8, 7, 1, 24, 3, 2), dict(padding="VALID")),
    ((1, 7, 8, 2, 4, 3, 3), dict(padding=((-1, 2), (0, -1)))),  # negative padding crops
    ((3, 1, 2, 1, 6, 3, 3), dict(stride=(2, 3), padding=1)),  # image smaller than the stride
]


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("shape,conv_kw", WINDOW_GEMM_CASES, ids=[f"{s}-{k}" for s, k in WINDOW_GEMM_CASES])
def test_few_channel_conv_runs_as_window_gemms(shape, conv_kw, dtype):
    """16-bit convs with C <= 2 (groups 1): the forward (with its fused epilogue) and the
    weight gradient are GEMMs of window columns, the data gradient GEMM + col2im; no conv
    kernel runs, and the values and every gradient match lax (the pre-activation kept by
    gelu and read off the output by relu both)."""
    _check(shape, conv_kw, dtype, "gelu", with_residual=True, seed=23)
    _check(shape, conv_kw, dtype, "relu", seed=24)
    n, h, w, c, k, r, s = shape
    x, wt = _inputs(np.random.default_rng(25), n, h, w, c, k, r, s, 1, dtype)
    b = jnp.ones((k,), dtype)
    loss = lambda x, wt, b: jaxgemm.conv2d(x, wt, bias=b, activation="relu", **conv_kw).astype(jnp.float32).sum()
    hlo = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))).lower(x, wt, b).compile().as_text()
    assert "jaxgemm_gemm" in hlo and "jaxgemm_col2im" in hlo and "jaxgemm_conv" not in hlo
    forced = jax.jit(jax.grad(lambda x, wt: jaxgemm.conv2d(x, wt, kernel="sm80", **conv_kw).astype(jnp.float32).sum(),
                              argnums=(0, 1))).lower(x, wt).compile().as_text()  # fmt: skip
    assert "jaxgemm_conv" in forced and "jaxgemm_gemm" not in forced


def test_window_gemm_channel_limit(monkeypatch):
    """C = 3's forward runs the conv kernel (the route measured slower there), unless
    JAXGEMM_WINDOW_GEMM_CHANNELS raises the limit; the values match lax either way."""
    x, wt = _inputs(np.random.default_rng(27), 2, 9, 8, 3, 8, 3, 3, 1, jnp.bfloat16)
    ref = _reference(jnp.asarray(x, jnp.float32), jnp.asarray(wt, jnp.float32))
    for limit, kernel in ((None, "jaxgemm_conv"), ("3", "jaxgemm_gemm")):
        if limit is not None:
            monkeypatch.setenv("JAXGEMM_WINDOW_GEMM_CHANNELS", limit)
        forward = jax.jit(lambda x, wt: jaxgemm.conv2d(x, wt))
        assert kernel in forward.lower(x, wt).compile().as_text(), limit
        assert rel_error(forward(x, wt), ref) <= TOLERANCE[jnp.dtype(jnp.bfloat16)], limit


def test_few_channel_conv_composes():
    """The window-column route under vmap (over images and over filters), jvp and a
    hessian-vector product (forward-over-reverse), each against lax."""
    n, h, w, c, k, r, s = 2, 9, 8, 2, 8, 3, 3
    rng = np.random.default_rng(26)
    x, wt = _inputs(rng, n, h, w, c, k, r, s, 1, jnp.bfloat16)
    b = random(rng, (k,), jnp.bfloat16)
    tol = TOLERANCE[jnp.dtype(jnp.bfloat16)]
    ours = lambda x, wt, b: jaxgemm.conv2d(x, wt, stride=2, bias=b, activation="gelu")  # noqa: E731
    ref = lambda x, wt, b: _reference(x, wt, stride=2, bias=b, activation="gelu")  # noqa: E731
    f32 = lambda *a: [jnp.asarray(v, jnp.float32) for v in a]  # noqa: E731
    xs, ws = jnp.stack([x, -x]), jnp.stack([wt, 2 * wt])
    for axes, args in (((0, None, None), (xs, wt, b)), ((None, 0, None), (x, ws, b))):
        got = jax.jit(jax.vmap(ours, axes))(*args)
        assert rel_error(got, jax.vmap(ref, axes)(*f32(*args))) <= tol, axes
    tangents = [random(rng, v.shape, jnp.bfloat16) for v in (x, wt, b)]
    _, t = jax.jit(lambda p, t: jax.jvp(ours, p, t))((x, wt, b), tuple(tangents))
    _, t_ref = jax.jvp(ref, tuple(f32(x, wt, b)), tuple(f32(*tangents)))
    assert rel_error(t, t_ref) <= tol

    def hvp(conv, wt, v):
        def loss(wt):
            return jnp.sum(conv(x.astype(wt.dtype), wt, b.astype(wt.dtype)).astype(jnp.float32) ** 2)

        return jax.jvp(jax.grad(loss), (wt,), (v,))[1]

    got = jax.jit(functools.partial(hvp, ours))(wt, tangents[1])
    assert rel_error(got, hvp(ref, *f32(wt, tangents[1]))) <= tol


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("stride", [1, 2, (2, 3)])
@pytest.mark.parametrize("epilogue", ["none", "bias_act_residual"])
def test_1x1_runs_as_gemm(dtype, stride, epilogue):
    """Unpadded 16-bit 1x1 convolutions (groups=1) take jaxgemm.matmul (float32 ones, and
    on Hopper stride-1 ones with C % 64 == 0, stay on the conv kernels); values and every gradient still match lax, strided ones included
    (dx is zero at skipped pixels)."""
    fused = epilogue != "none"
    for padding in ("SAME", "VALID"):
        _check((2, 7, 9, 12, 16, 1, 1), dict(stride=stride, padding=padding), dtype, "gelu" if fused else None,
               with_bias=fused, with_residual=fused, seed=11)  # fmt: skip
    x = jnp.ones((2, 7, 9, 12), dtype)
    w = jnp.ones((1, 1, 12, 16), dtype)
    text = str(jax.make_jaxpr(jax.grad(lambda x: jaxgemm.conv2d(x, w, stride=stride).astype(jnp.float32).sum()))(x))
    pair = (stride, stride) if isinstance(stride, int) else stride
    as_gemm = _conv1x1_prefers_matmul(jnp.dtype(dtype), pair, 12, 16)
    assert as_gemm == (jnp.dtype(dtype) != jnp.float32)  # C = 12: no Hopper conv path
    assert ("jaxgemm_gemm" in text) == as_gemm and ("jaxgemm_conv2d" not in text) == as_gemm


def test_1x1_with_padding_or_groups_stays_on_conv():
    x, w = jnp.ones((1, 5, 5, 4), jnp.float32), jnp.ones((1, 1, 4, 4), jnp.float32)
    for kw in (dict(padding=1), dict(groups=2)):
        wk = w[:, :, : 4 // kw.get("groups", 1)]
        assert "jaxgemm_conv2d" in str(jax.make_jaxpr(lambda x: jaxgemm.conv2d(x, wk, **kw))(x))


# C > 16: fewer channels take the GEMM + col2im route instead.
STRIDE1_DGRAD = [
    ((2, 9, 8, 24, 24, 3, 3), dict()),
    ((2, 9, 8, 32, 8, 3, 3), dict(padding="VALID")),
    ((1, 10, 11, 24, 16, 3, 2), dict(dilation=(2, 3), padding=((3, 0), (1, 4)))),
    ((2, 12, 11, 24, 16, 5, 5), dict(padding=((-1, 2), (0, 1)))),
    ((1, 8, 8, 24, 8, 1, 1), dict(padding=1)),
]


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("shape,conv_kw", STRIDE1_DGRAD, ids=[f"{s}-{k}" for s, k in STRIDE1_DGRAD])
def test_stride1_dgrad_runs_as_fprop(shape, conv_kw, dtype):
    """16-bit stride-1 dgrad is the forward conv of dy with flipped, (C, K)-swapped filters
    and complementary padding: gradients match lax, and no dgrad kernel runs."""
    _check(shape, conv_kw, dtype, "relu", with_residual=True, seed=17)
    n, h, w, c, k, r, s = shape
    x, wt = jnp.ones((n, h, w, c), dtype), jnp.ones((r, s, c, k), dtype)
    loss = lambda x: jaxgemm.conv2d(x, wt, **conv_kw).astype(jnp.float32).sum()
    text = str(jax.make_jaxpr(jax.grad(loss))(x))
    assert "jaxgemm_conv2d_dgrad" not in text and text.count("jaxgemm_conv2d[") >= 2


def test_out_dtype():
    rng = np.random.default_rng(6)
    x, w = _inputs(rng, 2, 6, 6, 8, 8, 3, 3, 1, jnp.bfloat16)
    bias = random(rng, (8,), jnp.bfloat16)
    ref = _reference(x, w, bias=bias, activation="gelu")
    for out_dtype in (jnp.float32, jnp.float16):
        y = jaxgemm.conv2d(x, w, bias=bias, activation="gelu", out_dtype=out_dtype)
        assert y.dtype == jnp.dtype(out_dtype)
        assert rel_error(y, ref) <= 2e-3
    g = jax.grad(lambda x: jaxgemm.conv2d(x, w, out_dtype=jnp.float32).sum())(x)
    assert g.dtype == jnp.bfloat16
    assert rel_error(g, jax.grad(lambda x: _reference(x, w).sum())(jnp.asarray(x, jnp.float32))) <= 1e-2


def test_vmap_folds_into_batch_and_loops_over_weights():
    rng = np.random.default_rng(7)
    x = random(rng, (3, 2, 6, 7, 4), jnp.float32)
    w = random(rng, (3, 3, 4, 5), jnp.float32)
    ws = random(rng, (3, 3, 3, 4, 5), jnp.float32)
    res = random(rng, (3, 2, 3, 4, 5), jnp.float32)
    conv = functools.partial(jaxgemm.conv2d, stride=2, activation="silu")
    ref = functools.partial(_reference, stride=2, activation="silu")
    y = jax.vmap(lambda x, r: conv(x, w, residual=r))(x, res)
    assert rel_error(y, jax.vmap(lambda x, r: ref(x, w, residual=r))(x, res)) <= 1e-5
    y = jax.vmap(conv)(x, ws)  # per-example weights
    assert rel_error(y, jax.vmap(ref)(x, ws)) <= 1e-5
    # Per-example gradients: dgrad folds, wgrad loops.
    loss = lambda f: lambda w, x: (f(x, w) ** 2).sum()
    g = jax.jit(jax.vmap(jax.grad(loss(conv), argnums=(0, 1)), in_axes=(None, 0)))(w, x)
    r = jax.vmap(jax.grad(loss(ref), argnums=(0, 1)), in_axes=(None, 0))(w, x)
    for a, b in zip(g, r):
        assert rel_error(a, b) <= 1e-5


def test_jit_matches_eager_and_wgrad_split():
    rng = np.random.default_rng(8)
    x, w = _inputs(rng, 3, 9, 8, 4, 6, 3, 3, 2, jnp.float32)
    kw = dict(stride=2, dilation=(1, 2), groups=2, padding=((1, 1), (2, 2)))
    eager = jaxgemm.conv2d(x, w, **kw)
    assert rel_error(jax.jit(functools.partial(jaxgemm.conv2d, **kw))(x, w), eager) == 0.0
    config = ConvConfig(stride=(2, 1), padding=((1, 1), (0, 2)), dilation=(1, 2), groups=2)
    dy = random(rng, (3, 5, 6, 6), jnp.float32)
    one = conv2d_wgrad(x, dy, config, (3, 3), split=1)
    for split in (2, 3, 7):  # the CPU reference honours forced splits (empty chunks included)
        assert rel_error(conv2d_wgrad(x, dy, config, (3, 3), split=split), np.asarray(one, np.float64)) <= 1e-6


def test_empty_outputs():
    x = jnp.ones((0, 5, 5, 4), jnp.float32)
    w = jnp.ones((3, 3, 4, 2), jnp.float32)
    assert jaxgemm.conv2d(x, w).shape == (0, 5, 5, 2)
    x = jnp.ones((1, 2, 2, 4), jnp.float32)
    assert jaxgemm.conv2d(x, w, padding="VALID").shape == (1, 0, 0, 2)
    assert jax.grad(lambda w: jaxgemm.conv2d(x, w, padding="VALID").sum())(w).shape == w.shape


@pytest.mark.parametrize(
    "x_shape,w_shape,kwargs,error,match",
    [
        ((2, 5, 5), (3, 3, 5, 4), {}, ValueError, r"x\(2, 5, 5\)"),
        ((2, 5, 5, 4), (3, 3, 4), {}, ValueError, r"w\(3, 3, 4\)"),
        ((2, 5, 5, 4), (3, 3, 3, 4), {}, ValueError, r"C=4"),
        ((2, 5, 5, 4), (3, 3, 2, 3), dict(groups=2), ValueError, r"groups=2"),
        ((2, 5, 5, 6), (3, 3, 2, 4), dict(groups=4), ValueError, r"groups=4"),
        ((2, 5, 5, 4), (3, 3, 4, 4), dict(stride=0), ValueError, r"stride"),
        ((2, 5, 5, 4), (3, 3, 4, 4), dict(stride=(1, -2)), ValueError, r"stride"),
        ((2, 5, 5, 4), (3, 3, 4, 4), dict(dilation=0), ValueError, r"dilation"),
        ((2, 5, 5, 4), (3, 3, 4, 4), dict(groups=0), ValueError, r"groups"),
        ((2, 5, 5, 4), (3, 3, 4, 4), dict(padding="FULL"), ValueError, r"padding"),
        ((2, 5, 5, 4), (3, 3, 4, 4), dict(padding=(1, 2, 3)), ValueError, r"padding"),
        ((2, 5, 5, 4), (3, 3, 4, 4), dict(activation="swish"), ValueError, r"activation"),
        ((2, 5, 5, 4), (3, 3, 4, 4), dict(bias=np.ones((3,), np.float32)), ValueError, r"bias"),
        ((2, 5, 5, 4), (3, 3, 4, 4), dict(residual=np.ones((2, 4, 4, 4), np.float32)), ValueError, r"residual"),
        ((2, 5, 5, 4), (3, 3, 4, 4), dict(out_dtype=jnp.int8), TypeError, r"int8"),
    ],
)
def test_bad_inputs(x_shape, w_shape, kwargs, error, match):
    x, w = jnp.ones(x_shape, jnp.float32), jnp.ones(w_shape, jnp.float32)
    with pytest.raises(error, match=match):
        jax.jit(lambda x, w: jaxgemm.conv2d(x, w, **kwargs))(x, w)


def test_bad_dtype():
    with pytest.raises(TypeError, match="int32"):
        jaxgemm.conv2d(jnp.ones((1, 4, 4, 2), jnp.int32), jnp.ones((3, 3, 2, 2), jnp.int32))


# GPU: shapes spanning several 128 x 128 output tiles and 32-deep k-tiles, for both kernel
# families (tensor cores: 16-bit with channels per group multiples of 8; SIMT otherwise).
GPU_CASES = [
    ((4, 28, 28, 64, 64, 3, 3), dict()),
    ((2, 30, 29, 32, 136, 3, 3), dict(stride=2)),  # K not a multiple of 128
    ((2, 17, 19, 64, 256, 1, 1), dict()),
    ((3, 16, 16, 128, 64, 1, 1), dict(stride=2)),
    ((2, 20, 20, 40, 48, 3, 3), dict(dilation=2, padding="VALID")),
    ((2, 14, 14, 64, 64, 3, 3), dict(groups=4, stride=2)),  # 16 channels per group
    ((2, 12, 12, 64, 64, 3, 3), dict(groups=8)),  # 8 per group
    ((2, 58, 58, 3, 64, 7, 7), dict(stride=2)),  # C = 3: SIMT even for 16-bit
    ((2, 21, 22, 12, 20, 3, 3), dict(stride=(2, 3), padding=((2, 1), (0, 2)))),  # C % 8 = 4
    ((1, 9, 9, 6, 10, 3, 3), dict(groups=2)),  # odd per-group channels
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,conv_kw", GPU_CASES, ids=[f"{s}-{k}" for s, k in GPU_CASES])
def test_gpu_kernels(shape, conv_kw, dtype):
    _check(shape, conv_kw, dtype, "relu", with_residual=True, seed=9)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_wgrad_split(dtype):
    # Large N*P*Q: the CUDA lowering splits wgrad; forced splits with empty chunks too.
    rng = np.random.default_rng(10)
    x, w = _inputs(rng, 8, 32, 32, 32, 64, 3, 3, 1, dtype)
    config = ConvConfig(padding=((1, 1), (1, 1)))
    dy = random(rng, (8, 32, 32, 64), dtype)
    ref = jax.vjp(lambda w: _reference(x, w), jnp.asarray(w, jnp.float32))[1](jnp.asarray(dy, jnp.float32))[0]
    for split in (None, 1, 5, 300):
        dw = conv2d_wgrad(x, dy, config, (3, 3), split=split)
        assert rel_error(dw, ref) <= TOLERANCE[jnp.dtype(dtype)], split


def test_kernel_family_argument():
    # CPU ignores the family (the CUDA handler honours it); unknown names are errors.
    rng = np.random.default_rng(12)
    x, w = _inputs(rng, 2, 6, 7, 8, 8, 3, 3, 1, jnp.float32)
    for kernel in ("sm80", "sm90") if jax.default_backend() == "cpu" else ("sm80",):
        assert rel_error(jaxgemm.conv2d(x, w, kernel=kernel, stride=2), _reference(x, w, stride=2)) <= 1e-5
    with pytest.raises(ValueError, match="kernel"):
        jaxgemm.conv2d(x, w, kernel="simt")


# sm90 (TMA im2col + wgmma) fprop, forced: channel blocks of 64 with zero-filled tails
# (C = 8, 72), K not a multiple of the 128 / 256 tiles, M not a multiple of 128, the pixel
# walk crossing rows and images, strides, dilation, SAME / VALID / asymmetric padding.
SM90_CASES = [
    ((2, 17, 19, 64, 64, 3, 3), dict()),
    ((2, 30, 29, 72, 128, 3, 3), dict(stride=2)),
    ((2, 20, 21, 256, 200, 3, 3), dict(dilation=2, padding="VALID")),
    ((3, 21, 22, 8, 64, 3, 3), dict(stride=(2, 1), padding=((2, 1), (0, 2)))),
    ((2, 13, 11, 64, 128, 3, 3), dict(stride=2, dilation=2, padding="SAME")),
    ((1, 12, 12, 128, 64, 3, 5), dict(stride=(1, 2), dilation=(2, 1), padding=((3, 0), (1, 4)))),
    ((2, 16, 15, 64, 128, 1, 1), dict(padding=1)),  # padded 1x1: stays a conv
    ((2, 30, 30, 3, 64, 7, 7), dict(stride=2)),  # first layer: C = 3 padded to 8
    ((4, 14, 14, 256, 256, 3, 3), dict()),  # wide K: the cooperative 128 x 256 tile
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("shape,conv_kw", SM90_CASES, ids=[f"{s}-{k}" for s, k in SM90_CASES])
def test_gpu_sm90_fprop(shape, conv_kw, dtype):
    if jaxgemm._ffi.cuda_compute_capability() != 90:
        pytest.skip("the sm90 kernel needs compute capability 9.0")
    _check(shape, conv_kw, dtype, "relu", with_residual=True, grads=False, seed=13, kernel="sm90")
    _check(shape, conv_kw, dtype, "gelu", with_bias=False, grads=False, seed=14, kernel="sm90", out_dtype=jnp.float32)
    # Bias and activation without residual: the fused TMA-store epilogue.
    _check(shape, conv_kw, dtype, "gelu", grads=False, seed=19, kernel="sm90")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_gpu_sm90_matches_sm80_and_grads(dtype):
    if jaxgemm._ffi.cuda_compute_capability() != 90:
        pytest.skip("the sm90 kernel needs compute capability 9.0")
    rng = np.random.default_rng(15)
    x, w = _inputs(rng, 4, 28, 28, 128, 128, 3, 3, 1, dtype)
    bias = random(rng, (128,), dtype)
    run = lambda kernel: jax.jit(lambda x, w, b: jaxgemm.conv2d(x, w, bias=b, activation="silu", kernel=kernel))
    y90, y80 = run("sm90")(x, w, bias), run("sm80")(x, w, bias)
    ref = _reference(x, w, bias=bias, activation="silu")
    tol = TOLERANCE[jnp.dtype(dtype)]
    assert rel_error(y90, ref) <= tol and rel_error(y80, ref) <= tol
    assert rel_error(y90, np.asarray(y80, np.float64)) <= tol
    _check((2, 15, 16, 64, 64, 3, 3), dict(stride=2), dtype, "relu", with_residual=True, seed=16, kernel="sm90")
    # Stride 1: dgrad is a forward conv too, forced onto sm90 with the forward.
    _check((2, 15, 16, 64, 72, 3, 3), dict(padding=((2, 0), (1, 1))), dtype, "relu", seed=18, kernel="sm90")


def _forced_sm90_gradient_case(shape, conv_kw, dtype, seed):
    """(x, w, dy, config) for a gradient kernel forced onto sm90; skips off Hopper."""
    if jaxgemm._ffi.cuda_compute_capability() != 90:
        pytest.skip("the sm90 kernel needs compute capability 9.0")
    n, h, wd, c, k, r, s = shape
    rng = np.random.default_rng(seed)
    x, w = _inputs(rng, n, h, wd, c, k, r, s, 1, dtype)
    dy = random(rng, _reference(x, w, **conv_kw).shape, dtype)
    pair = lambda v: (v, v) if isinstance(v, int) else tuple(v)
    stride, dilation = pair(conv_kw.get("stride", 1)), pair(conv_kw.get("dilation", 1))
    padding = _padding(conv_kw.get("padding", "SAME"), (h, wd), (r, s), stride, dilation)
    return x, w, dy, ConvConfig(stride, padding, dilation, kernel="sm90")


def _wgrad_at_splits(x, dy, config, kernel_hw):
    """{split: dw} for the cost model's split, one chunk, and more chunks than k-tiles."""
    pixels = dy.shape[0] * dy.shape[1] * dy.shape[2]
    run = lambda split: jax.jit(lambda x, dy: conv2d_wgrad(x, dy, config, kernel_hw, split=split))(x, dy)
    return {split: run(split) for split in (None, 1, pixels // 64 + 3)}


# sm90 wgrad, forced: dw rows (R*S*C) not a multiple of 128, K not a multiple of 128, the
# pixel walk crossing rows and images, N*P*Q not a multiple of 64, strides, dilation,
# padding; splits from the cost model, one, and more chunks than k-tiles (empty partials).
SM90_WGRAD_CASES = [
    ((2, 17, 19, 64, 64, 3, 3), dict()),
    ((2, 30, 29, 128, 72, 3, 3), dict(stride=2)),
    ((2, 20, 21, 64, 200, 3, 3), dict(dilation=2, padding="VALID")),
    ((3, 21, 22, 64, 64, 3, 5), dict(stride=(2, 1), padding=((2, 1), (0, 2)))),
    ((1, 12, 12, 192, 64, 3, 5), dict(stride=(1, 2), dilation=(2, 1), padding=((3, 0), (1, 4)))),
    ((2, 16, 15, 64, 128, 1, 1), dict(padding=1)),
    ((8, 28, 28, 128, 128, 3, 3), dict()),
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("shape,conv_kw", SM90_WGRAD_CASES, ids=[f"{s}-{k}" for s, k in SM90_WGRAD_CASES])
def test_gpu_sm90_wgrad(shape, conv_kw, dtype):
    x, w, dy, config = _forced_sm90_gradient_case(shape, conv_kw, dtype, seed=19)
    ref = jax.vjp(lambda w: _reference(x, w, **conv_kw), jnp.asarray(w, jnp.float32))[1](jnp.asarray(dy, jnp.float32))[0]
    for split, dw in _wgrad_at_splits(x, dy, config, w.shape[:2]).items():
        assert dw.shape == w.shape and dw.dtype == jnp.dtype(dtype)
        assert rel_error(dw, ref) <= TOLERANCE[jnp.dtype(dtype)], split
    # Through conv2d's gradient (the heuristic's choice, sm90 on Hopper).
    _check(shape, conv_kw, dtype, "relu", with_bias=False, seed=20)


# The sm90 pingpong 128 x 64 tile (taken when the GEMM has n <= 64 columns), forced: fprop
# (n = K), stride-1 dgrad as a forward conv (n = C) and wgrad (n = K) with K = 8, 40, 64
# (B boxes, TMA stores and bias reads past K), C = 64 and 128, N*P*Q not a multiple of 128,
# and the ResNet K = 64 layer at batch 8 (more tiles than SMs: both consumers take turns).
SM90_NARROW_CASES = [
    ((2, 17, 19, 64, 8, 3, 3), dict()),
    ((3, 13, 15, 128, 40, 3, 3), dict(padding=((2, 0), (1, 1)))),
    ((2, 23, 21, 64, 40, 3, 3), dict(dilation=2)),
    ((4, 9, 11, 128, 64, 3, 3), dict(padding="VALID")),
    ((8, 56, 56, 64, 64, 3, 3), dict()),
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("shape,conv_kw", SM90_NARROW_CASES, ids=[f"{s}-{k}" for s, k in SM90_NARROW_CASES])
def test_gpu_sm90_narrow_tile(shape, conv_kw, dtype):
    x, w, dy, config = _forced_sm90_gradient_case(shape, conv_kw, dtype, seed=25)
    tol = TOLERANCE[jnp.dtype(dtype)]
    # fprop through each epilogue: general (residual), fp32 output, fused and plain TMA store.
    _check(shape, conv_kw, dtype, "relu", with_residual=True, grads=False, seed=26, kernel="sm90")
    _check(shape, conv_kw, dtype, "gelu", with_bias=False, grads=False, seed=27, kernel="sm90", out_dtype=jnp.float32)
    _check(shape, conv_kw, dtype, "gelu", grads=False, seed=28, kernel="sm90")
    _check(shape, conv_kw, dtype, None, with_bias=False, grads=False, seed=29, kernel="sm90")
    f32 = lambda a: jnp.asarray(a, jnp.float32)
    ref_dx, ref_dw = jax.vjp(lambda x, w: _reference(x, w, **conv_kw), f32(x), f32(w))[1](f32(dy))
    dx = jax.jit(lambda dy, w: conv2d_dgrad(dy, w, config, x.shape[1:3]))(dy, w)
    assert dx.shape == x.shape and rel_error(dx, ref_dx) <= tol
    for split, dw in _wgrad_at_splits(x, dy, config, w.shape[:2]).items():
        assert dw.shape == w.shape and rel_error(dw, ref_dw) <= tol, split


# sm90 strided dgrad, forced: one forward conv per output phase, taps reversed, rows
# scattered to the phase's dx pixels; phases of unequal sizes and tap counts, dilation,
# padding, K not a multiple of 64, C not a multiple of 64 (and C = 8).
SM90_DGRAD_CASES = [
    ((2, 17, 19, 64, 64, 3, 3), dict(stride=2)),
    ((2, 30, 29, 128, 72, 3, 3), dict(stride=2, padding="VALID")),
    ((2, 20, 21, 40, 64, 3, 3), dict(stride=(2, 3), dilation=(1, 2))),
    ((3, 21, 22, 8, 64, 5, 5), dict(stride=2, padding=((2, 1), (0, 2)))),
    ((4, 28, 28, 128, 128, 3, 3), dict(stride=2)),
    ((2, 15, 16, 64, 128, 2, 2), dict(stride=2)),  # one tap per phase
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("shape,conv_kw", SM90_DGRAD_CASES, ids=[f"{s}-{k}" for s, k in SM90_DGRAD_CASES])
def test_gpu_sm90_strided_dgrad(shape, conv_kw, dtype):
    x, w, dy, config = _forced_sm90_gradient_case(shape, conv_kw, dtype, seed=21)
    ref = jax.vjp(lambda x: _reference(x, w, **conv_kw), jnp.asarray(x, jnp.float32))[1](jnp.asarray(dy, jnp.float32))[0]
    dx = jax.jit(lambda dy, w: conv2d_dgrad(dy, w, config, x.shape[1:3]))(dy, w)
    assert dx.shape == x.shape and dx.dtype == jnp.dtype(dtype)
    assert rel_error(dx, ref) <= TOLERANCE[jnp.dtype(dtype)]
    # Through conv2d's gradient (the heuristic's choice, sm90 on Hopper).
    _check(shape, conv_kw, dtype, "relu", with_bias=False, seed=22)


@pytest.mark.gpu
def test_gpu_sm90_dgrad_phase_without_taps():
    # Stride 2 with dilation 2: odd phases get no taps (zeros); sm90 refuses, auto falls back.
    if jaxgemm._ffi.cuda_compute_capability() != 90:
        pytest.skip("the sm90 kernel needs compute capability 9.0")
    rng = np.random.default_rng(23)
    x, w = _inputs(rng, 2, 20, 21, 64, 64, 3, 3, 1, jnp.bfloat16)
    config = ConvConfig((2, 2), ((2, 2), (2, 2)), (2, 2), kernel="sm90")
    dy = random(rng, (2, 10, 11, 64), jnp.bfloat16)
    with pytest.raises(Exception, match="sm90"):
        jax.block_until_ready(conv2d_dgrad(dy, w, config, (20, 21)))
    _check((2, 20, 21, 64, 64, 3, 3), dict(stride=2, dilation=2, padding=2), jnp.bfloat16, seed=24)


@pytest.mark.gpu
def test_gpu_sm90_refuses_what_it_cannot_take():
    if jaxgemm._ffi.cuda_compute_capability() != 90:
        pytest.skip("the sm90 kernel needs compute capability 9.0")
    x, w = jnp.ones((1, 8, 8, 16), jnp.float32), jnp.ones((3, 3, 16, 16), jnp.float32)
    with pytest.raises(Exception, match="sm90"):
        jax.block_until_ready(jaxgemm.conv2d(x, w, kernel="sm90"))  # float32: no sm90 kernel
    x, w = x.astype(jnp.bfloat16), jnp.ones((3, 3, 8, 16), jnp.bfloat16)
    with pytest.raises(Exception, match="sm90"):
        jax.block_until_ready(jaxgemm.conv2d(x, w, groups=2, kernel="sm90"))


def _cuda_include_dir():
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(str(pathlib.Path(nvcc).resolve().parent.parent))
    for root in filter(None, roots):
        if (pathlib.Path(root) / "include" / "cuda_fp16.h").exists():
            return str(pathlib.Path(root) / "include")
    return None


def test_gpu_loaders_emulated_on_host(tmp_path):
    """The CUDA kernels' loaders and output addressing, run on the host against the CPU
    reference (tools/conv_loader_emulation.cc): needs g++ and the CUDA headers, no GPU."""
    repo = pathlib.Path(__file__).resolve().parent.parent
    include, cxx = _cuda_include_dir(), shutil.which("g++")
    source = repo / "tools" / "conv_loader_emulation.cc"
    if include is None or cxx is None or not source.exists():
        pytest.skip("needs g++, the CUDA headers and a source checkout")
    binary = tmp_path / "conv_emu"
    subprocess.run(
        [cxx, "-std=c++17", "-O1", "-I", str(repo / "tools" / "conv_mock"), "-I", str(repo / "ffi_src"), "-I", include,
         str(source), str(repo / "ffi_src" / "conv" / "cpu_conv.cc"), str(repo / "ffi_src" / "gemm" / "cpu_epilogue.cc"),
         "-o", str(binary)],
        check=True, capture_output=True,
    )  # fmt: skip
    run = subprocess.run([str(binary)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.skipif(not jaxgemm._ffi.WITH_CUDA, reason="the CUDA handlers' count (a CPU-only build has none)")
def test_kernel_sm_count_leaves_the_margin():
    """The SMs a persistent grid takes beside a collective, as the GEMM and conv handlers and
    the lowering's workspace and split choices all count them (KernelSmCount)."""
    sms = jaxgemm._ffi.cuda_sm_count() or 132  # (no GPU: an H100 / H200's count)
    count = jaxgemm._ffi.kernel_sm_count
    assert count(0) == sms and count(-5) == sms
    assert count(16) == sms - 16
    assert count(10_000) == 2


def test_sm90_wgrad_split_model():
    """The sm90 wgrad's split of N*P*Q (conv/sm90_wgrad_split.h, the launcher's own tile rule,
    asked by the lowering through the module): chunks of at least 4 k-tiles of 64 pixels, at
    most 128 of them; one chunk when the tiles alone fill the GPU or K is shallow; a deep
    product of few tiles split over the SMs, less so where fewer SMs are left to it."""
    from jaxgemm import _jaxgemm

    split = _jaxgemm.sm90_conv_wgrad_split
    for m, n, k in ((576, 64, 802816), (4608, 512, 3136), (64, 64, 200), (9 * 2048, 2048, 784)):
        assert 1 <= split(m, n, k, 132) <= max(1, min(128, -(-k // 64) // 4)), (m, n, k)
    assert split(64, 64, 200, 132) == 1  # 4 k-tiles: no room for two chunks
    assert split(9 * 2048, 2048, 784, 132) == 1  # 2304 tiles: several waves already
    deep = split(576, 64, 802816, 132)  # 5 tiles (3 x 3 x 64 channels by 64), 12544 k-tiles
    assert deep > 8 and split(576, 64, 802816, 116) <= deep
