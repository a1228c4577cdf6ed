"""NaN and inf through the fused activations: every op gives NaN exactly where the jax.nn
reference does (relu(NaN) is NaN, as jnp.maximum gives; gelu(-inf) and silu(-inf) are
-inf * 0 = NaN) and the reference's values elsewhere. On a CPU both lowerings run (the FFI
reference handlers and XLA's own ops), on a GPU the CUDA kernels."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxgemm
from reference import TOLERANCE, rel_error, to64

JAX_NN = {
    "relu": jax.nn.relu,
    "gelu": functools.partial(jax.nn.gelu, approximate=True),
    "gelu_exact": functools.partial(jax.nn.gelu, approximate=False),
    "silu": jax.nn.silu,
    "sigmoid": jax.nn.sigmoid,
    "tanh": jnp.tanh,
}
assert set(JAX_NN) == set(jaxgemm.ACTIVATIONS), "an activation without its jax.nn reference here"

DTYPES = [jnp.float32, jnp.bfloat16]
M, K, N = 8, 16, 24
SIZES = np.array([3, 0, 5], np.int32)  # ragged groups of x's rows (one empty)
NAN_ROW, INF_ROW = 1, 5  # in groups 0 and 2


@pytest.fixture(params=["cuda"] if jax.default_backend() == "gpu" else ["ffi", "xla"])
def route(request, monkeypatch):
    """The CPU lowering (JAXGEMM_CPU, read when an op is lowered), or the GPU's kernels."""
    if request.param != "cuda":
        monkeypatch.setenv("JAXGEMM_CPU", request.param)
    return request.param


def run(route, f, *args):
    """f jitted afresh (so lowered on this route); on a CPU, checks the route's ops ran."""
    compiled = jax.jit(f).lower(*args).compile()
    if route != "cuda":
        assert ('custom_call_target="jaxgemm' in compiled.as_text()) == (route == "ffi")
    return compiled(*args)


def assert_matches(got, want, dtype):
    """NaN exactly where `want` has it, its infs, and its values elsewhere (`want` in float32)."""
    got, want = to64(got), to64(want)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    special = ~np.isfinite(want)
    assert np.isnan(want).any()
    np.testing.assert_array_equal(got[special], want[special])
    assert rel_error(got[~special], want[~special]) <= TOLERANCE[jnp.dtype(dtype)]


def operands(dtype, *shapes):
    keys = jax.random.split(jax.random.key(0), len(shapes))
    return [jax.random.normal(key, s, jnp.float32).astype(dtype) for key, s in zip(keys, shapes)]


def f32_dot(x, w):
    return jnp.matmul(x.astype(jnp.float32), w.astype(jnp.float32), precision="highest")


def rows_with_nan_and_inf(x):
    return x.at[NAN_ROW, 3].set(jnp.nan).at[INF_ROW, 7].set(jnp.inf)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", jaxgemm.ACTIVATIONS)
def test_dense_and_matmul(act, dtype, route):
    x, w, b = operands(dtype, (M, K), (K, N), (N,))
    x = rows_with_nan_and_inf(x)
    want = JAX_NN[act](f32_dot(x, w) + b.astype(jnp.float32))
    assert_matches(run(route, lambda x, w, b: jaxgemm.dense(x, w, b, act), x, w, b), want, dtype)
    assert_matches(run(route, lambda x, w, b: jaxgemm.matmul(x, w, bias=b, activation=act), x, w, b), want, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", jaxgemm.ACTIVATIONS)
def test_conv2d(act, dtype, route):
    x, w, b = operands(dtype, (2, 6, 6, 8), (3, 3, 8, 16), (16,))
    x = x.at[0, 2, 3, 1].set(jnp.nan).at[1, 4, 1, 5].set(jnp.inf)
    z = lax.conv_general_dilated(x.astype(jnp.float32), w.astype(jnp.float32), (1, 1), "SAME",
                                 dimension_numbers=("NHWC", "HWIO", "NHWC"), precision="highest")  # fmt: skip
    got = run(route, lambda x, w, b: jaxgemm.conv2d(x, w, bias=b, activation=act), x, w, b)
    assert_matches(got, JAX_NN[act](z + b.astype(jnp.float32)), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", jaxgemm.ACTIVATIONS)
def test_ragged_dot_and_glu(act, dtype, route):
    x, wg, wu, bg, bu = operands(dtype, (M, K), (3, K, N), (3, K, N), (3, N), (3, N))
    x, sizes = rows_with_nan_and_inf(x), jnp.asarray(SIZES)
    group = np.repeat(np.arange(len(SIZES)), SIZES)  # each row's group (SIZES sum to M)

    def ref(w, b):  # row i times w[group[i]], plus b[group[i]]
        return jnp.einsum("mk,mkn->mn", x.astype(jnp.float32), w[group].astype(jnp.float32),
                          precision="highest") + b[group].astype(jnp.float32)  # fmt: skip

    got = run(route, lambda x, w, b: jaxgemm.ragged_dot(x, w, sizes, bias=b, activation=act), x, wg, bg)
    assert_matches(got, JAX_NN[act](ref(wg, bg)), dtype)
    glu = lambda x, wg, wu, bg, bu: jaxgemm.ragged_glu(x, wg, wu, sizes, act, bias_gate=bg, bias_up=bu)  # noqa: E731
    assert_matches(run(route, glu, x, wg, wu, bg, bu), JAX_NN[act](ref(wg, bg)) * ref(wu, bu), dtype)
