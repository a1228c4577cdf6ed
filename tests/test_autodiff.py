"""Forward-mode and higher-order autodiff of `jaxgemm.matmul` (every epilogue),
`jaxgemm.dense` and `jaxgemm.conv2d`: jvp, jacfwd, hessian, grad-of-grad, linearize and
(first-order) grad, each against the same function written with jnp / lax in float32
(precision HIGHEST). Single device, small shapes."""

import dataclasses
import zlib
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxgemm

TOL = 1e-4  # relative Frobenius error, float32 throughout (jaxgemm has no float64)
HIGHEST = lax.Precision.HIGHEST

# The activations written out in jnp (independent of jaxgemm.activations).
ACT = {
    None: lambda z: z,
    "relu": jax.nn.relu,
    "gelu": lambda z: jax.nn.gelu(z, approximate=True),
    "gelu_exact": lambda z: jax.nn.gelu(z, approximate=False),
    "silu": jax.nn.silu,
    "sigmoid": jax.nn.sigmoid,
    "tanh": jnp.tanh,
}


def test_reference_knows_every_activation():
    assert set(jaxgemm.ACTIVATIONS) <= set(ACT)


# ---------------------------------------------------------------------------------------
# The functions: jaxgemm and its jnp / lax twin, both of a dict of float32 arrays.


def _mm_ref(a, b, *, bias=None, act=None, alpha=1.0, beta=0.0, c=None, residual=None, ta=False, tb=False,
            pre=False):  # fmt: skip
    a = jnp.swapaxes(a, -1, -2) if ta else a
    b = jnp.swapaxes(b, -1, -2) if tb else b
    z = alpha * jnp.matmul(a, b, precision=HIGHEST)
    if c is not None:
        z = z + beta * c
    if bias is not None:
        z = z + bias
    y = ACT[act](z)
    if residual is not None:
        y = y + residual
    return (y, z) if pre else y


def _conv_ref(x, w, *, stride=1, padding="SAME", dilation=1, groups=1, bias=None, act=None, residual=None):
    z = lax.conv_general_dilated(
        x,
        w,
        (stride, stride),
        padding,
        rhs_dilation=(dilation, dilation),
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
        feature_group_count=groups,
        precision=HIGHEST,
    )
    if bias is not None:
        z = z + bias
    y = ACT[act](z)
    return y + residual if residual is not None else y


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    shapes: dict  # name -> shape of every (differentiated) input
    ours: Callable  # dict -> output (array or tuple)
    ref: Callable


def _matmul_case(name, shapes, *, act=None, alpha=1.0, beta=0.0, ta=False, tb=False, pre=False):
    def ours(p):
        return jaxgemm.matmul(p["a"], p["b"], bias=p.get("bias"), activation=act, alpha=alpha, beta=beta,
                              c=p.get("c"), residual=p.get("residual"), transpose_a=ta, transpose_b=tb,
                              return_pre_activation=pre)  # fmt: skip

    def ref(p):
        return _mm_ref(p["a"], p["b"], bias=p.get("bias"), act=act, alpha=alpha, beta=beta, c=p.get("c"),
                       residual=p.get("residual"), ta=ta, tb=tb, pre=pre)  # fmt: skip

    return Case("matmul_" + name, shapes, ours, ref)


def _dense_case(name, shapes, act):
    def ours(p):
        return jaxgemm.dense(p["x"], p["w"], p.get("bias"), activation=act)

    def ref(p):
        y = jnp.matmul(p["x"], p["w"], precision=HIGHEST)
        return ACT[act](y + p["bias"] if "bias" in p else y)

    return Case("dense_" + name, shapes, ours, ref)


def _conv_case(name, shapes, *, act=None, **kw):
    def ours(p):
        return jaxgemm.conv2d(p["x"], p["w"], bias=p.get("bias"), activation=act, residual=p.get("residual"), **kw)

    def ref(p):
        return _conv_ref(p["x"], p["w"], bias=p.get("bias"), act=act, residual=p.get("residual"), **kw)

    return Case("conv2d_" + name, shapes, ours, ref)


M, K, N = 8, 16, 12
MM = dict(a=(M, K), b=(K, N))
CONV_X, CONV_W = (2, 6, 6, 4), (3, 3, 4, 8)

CASES = (
    [
        _matmul_case("plain", MM),
    ]
    + [_matmul_case(f"bias_{act}", dict(MM, bias=(N,)), act=act) for act in jaxgemm.ACTIVATIONS]
    + [
        _matmul_case("residual_tanh", dict(MM, residual=(M, N)), act="tanh"),
        _matmul_case("c_beta_alpha", dict(MM, c=(M, N)), alpha=0.75, beta=0.5),
        _matmul_case("pre_activation_gelu", dict(MM, bias=(N,), residual=(M, N)), act="gelu", pre=True),
        _matmul_case("pre_activation_relu_c", dict(MM, bias=(N,), c=(M, N)), act="relu", beta=1.5, pre=True),
        _matmul_case("transposed_silu", dict(a=(K, M), b=(N, K), bias=(N,)), act="silu", ta=True, tb=True),
        _matmul_case("batched_bias_gelu", dict(a=(2, 4, K), b=(K, N), bias=(N,)), act="gelu"),
        _dense_case("no_bias", dict(x=(2, 4, K), w=(K, N)), None),
        _dense_case("bias", dict(x=(M, K), w=(K, N), bias=(N,)), None),
        _dense_case("relu", dict(x=(M, K), w=(K, N)), "relu"),
        _dense_case("bias_gelu", dict(x=(M, K), w=(K, N), bias=(N,)), "gelu"),
        _dense_case("bias_relu", dict(x=(2, 4, K), w=(K, N), bias=(N,)), "relu"),
        _conv_case("bias_relu", dict(x=CONV_X, w=CONV_W, bias=(8,)), act="relu"),
        _conv_case("bias_gelu", dict(x=CONV_X, w=CONV_W, bias=(8,)), act="gelu"),
        _conv_case("residual_silu", dict(x=CONV_X, w=CONV_W, bias=(8,), residual=(2, 6, 6, 8)), act="silu"),
        _conv_case("stride2", dict(x=CONV_X, w=CONV_W, bias=(8,)), act="tanh", stride=2),
        _conv_case("dilation2_valid", dict(x=CONV_X, w=CONV_W), dilation=2, padding="VALID"),
        _conv_case("groups2", dict(x=CONV_X, w=(3, 3, 2, 8), bias=(8,)), act="relu", groups=2),
        _conv_case("first_layer_c3", dict(x=(2, 6, 6, 3), w=(3, 3, 3, 8), bias=(8,)), act="gelu"),
        _conv_case("1x1", dict(x=CONV_X, w=(1, 1, 4, 8), bias=(8,)), act="sigmoid"),
    ]
)
CASE_IDS = [c.name for c in CASES]


# ---------------------------------------------------------------------------------------
# Helpers.


def _seed(*parts) -> int:
    return zlib.crc32("/".join(map(str, parts)).encode())


def _random_tree(shapes, seed):
    rng = np.random.default_rng(seed)
    return {k: jnp.asarray(rng.standard_normal(s), jnp.float32) for k, s in shapes.items()}


def _params(case, what="primal"):
    """Fresh standard normals (never zeros). Weights are scaled by 1/sqrt(fan-in) so every
    activation sees O(1) pre-activations, where its derivatives are not all ~0 or ~1."""
    p = _random_tree(case.shapes, _seed(case.name, what))
    if what == "primal":
        if "b" in p:  # matmul's b: every case has K inner
            p["b"] = p["b"] / np.sqrt(K)
        if "w" in p:  # dense (K, N), conv (R, S, C/groups, K)
            p["w"] = p["w"] / np.sqrt(np.prod(p["w"].shape[:-1]))
    return p


def _rel(out, ref, scale):
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert np.all(np.isfinite(out)), "non-finite values"
    denom = np.linalg.norm(ref)
    return np.linalg.norm(out - ref) / (denom if denom > 0 else scale)


def assert_close(out, ref, tol=TOL):
    """Every leaf of `out` within `tol` relative Frobenius error of the same leaf of `ref`
    (an all-zero reference leaf: relative to the whole tree's norm)."""
    out_leaves, out_tree = jax.tree_util.tree_flatten(out)
    ref_leaves, ref_tree = jax.tree_util.tree_flatten(ref)
    assert out_tree == ref_tree, (out_tree, ref_tree)
    scale = max(np.sqrt(sum(float(np.sum(np.square(np.asarray(r, np.float64)))) for r in ref_leaves)), 1e-30)
    paths = [jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_flatten_with_path(ref)[0]]
    errors = {p: _rel(o, r, scale) for p, o, r in zip(paths, out_leaves, ref_leaves)}
    bad = {p: e for p, e in errors.items() if not e <= tol}
    assert not bad, f"relative errors above {tol}: {bad}"


def _loss(f):
    """A scalar loss with non-trivial second derivatives in the outputs."""
    return lambda p: sum(jnp.sum(jnp.sin(y)) for y in jax.tree_util.tree_leaves(f(p)))


# ---------------------------------------------------------------------------------------
# The checks: each runs the same transformation on ours and on the reference.


def _jit(f):
    # XLA:CPU's compile time dominates these tiny programs; LLVM's -O0 halves it.
    return jax.jit(f, compiler_options={"xla_backend_optimization_level": 0})


def _jvp(f, p, t):
    return _jit(lambda p, t: jax.jvp(f, (p,), (t,)))(p, t)


def _jacfwd(f, p, t):
    return _jit(jax.jacfwd(f))(p)


def _hessian(f, p, t):
    return _jit(jax.hessian(_loss(f)))(p)


def _grad_of_grad(f, p, t):
    loss = _loss(f)
    outer = lambda p: sum(jnp.sum(g**2) for g in jax.tree_util.tree_leaves(jax.grad(loss)(p)))  # noqa: E731
    return _jit(jax.value_and_grad(outer))(p)


def _linearize(f, p, t):
    # The linear function applied to two tangents (a jitted linearize can only return values).
    t2 = jax.tree_util.tree_map(lambda x: -0.5 * x + 1.0, t)

    def run(p, t, t2):
        y, f_jvp = jax.linearize(f, p)
        return y, f_jvp(t), f_jvp(t2)

    return _jit(run)(p, t, t2)


def _grad(f, p, t):
    return _jit(jax.value_and_grad(_loss(f)))(p)


CHECKS = {
    "jvp": _jvp,
    "jacfwd": _jacfwd,
    "hessian": _hessian,
    "grad_of_grad": _grad_of_grad,
    "linearize": _linearize,
    "grad": _grad,
}


@pytest.mark.parametrize("check", list(CHECKS))
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_autodiff(case, check):
    p, t = _params(case), _params(case, "tangent")
    want = CHECKS[check](case.ref, p, t)
    got = CHECKS[check](case.ours, p, t)
    assert_close(got, want)


def test_jvp_of_plain_matmul_is_bilinear():
    """jvp of a @ b along (da, db) is da @ b + a @ db, in one pass (the primal too)."""
    rng = np.random.default_rng(0)
    a, b, da, db = (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in [(M, K), (K, N), (M, K), (K, N)])
    y, dy = jax.jvp(jaxgemm.matmul, (a, b), (da, db))
    assert_close(y, jnp.matmul(a, b, precision=HIGHEST))
    assert_close(dy, jnp.matmul(da, b, precision=HIGHEST) + jnp.matmul(a, db, precision=HIGHEST))


def test_reference_side_is_sound():
    """The jnp references agree with float64 numpy on one forward (guards the test itself)."""
    rng = np.random.default_rng(1)
    a, b, bias = rng.standard_normal((M, K)), rng.standard_normal((K, N)), rng.standard_normal(N)
    z = a @ b + bias
    want = 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z**3)))
    got = _mm_ref(*(jnp.asarray(v, jnp.float32) for v in (a, b)), bias=jnp.asarray(bias, jnp.float32), act="gelu")
    assert _rel(got, want, 1.0) <= 1e-5
