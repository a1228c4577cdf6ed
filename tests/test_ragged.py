"""jaxgemm.ragged_dot against jax.lax.ragged_dot (float64 where it can): values over group
patterns (balanced, all rows in one group, empty groups, sizes that are no multiple of
anything, rows past the sizes' sum), dtypes, the fused bias and activation; jit, vmap
(folded into one wider product), grad, jvp, grad of grad; bad input."""

import itertools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxgemm
from jaxgemm.ragged import ragged_dot

M, K, N, G = 53, 24, 40, 5
PATTERNS = {
    "balanced": [11, 10, 11, 10, 11],
    "one_group": [0, 0, 53, 0, 0],
    "empty_ends": [0, 20, 13, 20, 0],
    "ragged": [1, 7, 30, 2, 13],
    "rows_past_the_sum": [5, 9, 0, 3, 20],  # 37 of 53 rows
}
TOL = {jnp.float32: 1e-5, jnp.bfloat16: 1e-2, jnp.float16: 2e-3}


def rel(x, ref):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    return np.linalg.norm(x - ref) / max(np.linalg.norm(ref), 1e-30)


def inputs(seed, dtype=jnp.float32, m=M):
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    lhs = jax.random.normal(k1, (m, K), jnp.float32).astype(dtype)
    rhs = (jax.random.normal(k2, (G, K, N), jnp.float32) / np.sqrt(K)).astype(dtype)
    bias = jax.random.normal(k3, (G, N), jnp.float32).astype(dtype)
    return lhs, rhs, bias


def reference(lhs, rhs, sizes, bias=None, activation=None, residual=None):
    """Group by group in float64 (numpy), rows past the sum zero (plus the residual)."""
    lhs, rhs = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
    out, start = np.zeros((lhs.shape[0], rhs.shape[2])), 0
    for j, size in enumerate(np.asarray(sizes)):
        z = lhs[start:start + size] @ rhs[j] + (0 if bias is None else np.asarray(bias, np.float64)[j])
        out[start:start + size] = np.asarray(jaxgemm.activations.apply(activation, jnp.asarray(z)), np.float64)
        start += size
    return out if residual is None else out + np.asarray(residual, np.float64)


@pytest.mark.parametrize("pattern", list(PATTERNS))
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_values(pattern, dtype):
    lhs, rhs, _ = inputs(0, dtype)
    sizes = jnp.array(PATTERNS[pattern], jnp.int32)
    out = jax.jit(ragged_dot)(lhs, rhs, sizes)
    assert out.dtype == dtype and out.shape == (M, N)
    assert rel(out, reference(lhs, rhs, sizes)) <= TOL[dtype]


@pytest.mark.parametrize("activation", [None, "relu", jax.nn.gelu, "silu"])
@pytest.mark.parametrize("pattern", ["ragged", "rows_past_the_sum"])
def test_bias_and_activation(activation, pattern):
    lhs, rhs, bias = inputs(1)
    sizes = jnp.array(PATTERNS[pattern], jnp.int32)
    name = jaxgemm.activations.canonical(activation)
    out = ragged_dot(lhs, rhs, sizes, bias=bias, activation=activation)
    assert rel(out, reference(lhs, rhs, sizes, bias, name)) <= 1e-5


@pytest.mark.parametrize("pattern", ["ragged", "rows_past_the_sum"])
def test_residual_values_and_gradients(pattern):
    lhs, rhs, bias = inputs(12)
    residual = jax.random.normal(jax.random.key(13), (M, N), jnp.float32)
    sizes = jnp.array(PATTERNS[pattern], jnp.int32)
    out = ragged_dot(lhs, rhs, sizes, bias=bias, activation="gelu", residual=residual)
    assert rel(out, reference(lhs, rhs, sizes, bias, "gelu", residual)) <= 1e-5
    loss = lambda r, res: jnp.sum(jnp.sin(ragged_dot(lhs, r, sizes, residual=res)))  # noqa: E731
    d_rhs, d_res = jax.grad(loss, argnums=(0, 1))(rhs, residual)
    want = jax.grad(lambda r, res: jnp.sum(jnp.sin(sliced(lhs, r, np.asarray(sizes)) + res)), argnums=(0, 1))(rhs, residual)
    assert rel(d_rhs, want[0]) <= 1e-5 and rel(d_res, want[1]) <= 1e-5
    with pytest.raises(ValueError, match=r"residual of shape \(53, 39\)"):
        ragged_dot(lhs, rhs, sizes, residual=residual[:, :39])


def test_preferred_element_type_and_promotion():
    lhs, rhs, _ = inputs(2, jnp.bfloat16)
    sizes = jnp.array(PATTERNS["balanced"], jnp.int32)
    out = ragged_dot(lhs, rhs, sizes, preferred_element_type=jnp.float32)
    assert out.dtype == jnp.float32 and rel(out, reference(lhs, rhs, sizes)) <= 1e-5
    assert ragged_dot(lhs, rhs.astype(jnp.float32), sizes).dtype == jnp.float32


@pytest.mark.parametrize("pattern", ["balanced", "one_group", "rows_past_the_sum"])
def test_grad_and_jvp_equal_lax(pattern):
    lhs, rhs, bias = inputs(3)
    sizes = jnp.array(PATTERNS[pattern], jnp.int32)
    hi = lax.Precision.HIGHEST

    def ours(lhs, rhs, bias):
        return jnp.sum(jnp.sin(ragged_dot(lhs, rhs, sizes, bias=bias, activation="gelu")))

    def theirs(lhs, rhs, bias):
        z = lax.ragged_dot(lhs, rhs, sizes, precision=hi)
        rows = np.repeat(np.arange(G), np.asarray(sizes))
        live = np.arange(M) < len(rows)
        group = np.concatenate([rows, np.zeros(M - len(rows), int)])
        y = jnp.where(live[:, None], jax.nn.gelu(z + bias[group]), 0)
        return jnp.sum(jnp.sin(y))

    args = (lhs, rhs, bias)
    for got, want in zip(jax.jit(jax.grad(ours, argnums=(0, 1, 2)))(*args), jax.grad(theirs, argnums=(0, 1, 2))(*args)):
        assert rel(got, want) <= 1e-5
    tangents = inputs(4)
    _, t_ours = jax.jvp(ours, args, tangents)
    _, t_theirs = jax.jvp(theirs, args, tangents)
    assert rel(t_ours, t_theirs) <= 1e-5


def sliced(lhs, rhs, sizes):
    """The product group by group with static slices: differentiable to any order (lax's
    ragged dot is not: its weight gradient has no transpose)."""
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    parts = [jnp.dot(lhs[a:b], rhs[j], precision=lax.Precision.HIGHEST) for j, (a, b) in enumerate(itertools.pairwise(bounds))]
    return jnp.concatenate(parts + [jnp.zeros((lhs.shape[0] - bounds[-1], rhs.shape[2]), lhs.dtype)])


def test_grad_of_grad():
    """Second order through both primitives (each transposes into the other)."""
    lhs, rhs, _ = inputs(5)
    sizes = np.array(PATTERNS["rows_past_the_sum"], np.int32)

    def f(dot):
        return lambda lhs, rhs: jnp.sum(jnp.tanh(dot(lhs, rhs)) ** 2)

    ours = f(lambda l, r: ragged_dot(l, r, jnp.asarray(sizes)))
    theirs = f(lambda l, r: sliced(l, r, sizes))
    gg = lambda fn: jax.grad(lambda l, r: jnp.sum(jax.grad(fn, argnums=1)(l, r) ** 2), argnums=(0, 1))  # noqa: E731
    for got, want in zip(gg(ours)(lhs, rhs), gg(theirs)(lhs, rhs)):
        assert rel(got, want) <= 1e-5


def test_hessian():
    """jax.hessian (forward over reverse: the JVPs of both primitives' transposes) in each
    operand, against the sliced product's."""
    keys = jax.random.split(jax.random.key(14), 2)
    lhs, rhs = jax.random.normal(keys[0], (7, 3)), jax.random.normal(keys[1], (2, 3, 4))
    sizes = np.array([3, 2], np.int32)  # two rows past the sum
    for argnum in (0, 1):
        def loss(dot):
            return lambda l, r: jnp.sum(jnp.tanh(dot(l, r)) ** 2)

        got = jax.hessian(loss(lambda l, r: ragged_dot(l, r, jnp.asarray(sizes))), argnums=argnum)(lhs, rhs)
        want = jax.hessian(loss(lambda l, r: sliced(l, r, sizes)), argnums=argnum)(lhs, rhs)
        assert rel(got, want) <= 1e-5, argnum


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU's two lowerings (on a GPU the kernel runs)")
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("lowering", ["ffi", "xla"])
def test_cpu_lowerings_agree(lowering, dtype, monkeypatch):
    """On a CPU, the FFI reference handlers (JAXGEMM_CPU=ffi, as the other tests run) and XLA's
    own ragged dot (the default) give the reference's values and gradients, with and
    without the epilogue; only the first calls jaxgemm's handlers."""
    monkeypatch.setenv("JAXGEMM_CPU", lowering)
    lhs, rhs, bias = inputs(25, dtype)
    residual = jax.random.normal(jax.random.key(26), (M, N), jnp.float32).astype(dtype)
    sizes = jnp.array(PATTERNS["rows_past_the_sum"], jnp.int32)
    fused = lambda l, r, b: ragged_dot(l, r, sizes, bias=b, activation="silu", residual=residual)  # noqa: E731
    hlo = jax.jit(fused).lower(lhs, rhs, bias).compile().as_text()
    assert ("jaxgemm_ragged_epilogue" in hlo) == (lowering == "ffi")
    assert rel(jax.jit(fused)(lhs, rhs, bias), reference(lhs, rhs, sizes, bias, "silu", residual)) <= TOL[dtype]
    assert rel(jax.jit(lambda l, r: ragged_dot(l, r, sizes))(lhs, rhs), reference(lhs, rhs, sizes)) <= TOL[dtype]
    f32 = lambda x: x.astype(jnp.float32)  # noqa: E731
    loss = lambda l, r, b: jnp.sum(jnp.sin(f32(fused(l, r, b))))  # noqa: E731
    unfused = lambda l, r, b: sliced_epilogue(f32(l), f32(r), np.asarray(sizes), f32(b), "silu", f32(residual))  # noqa: E731
    want = jax.grad(lambda *a: jnp.sum(jnp.sin(unfused(*a))), argnums=(0, 1, 2))
    for got, expected in zip(jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(lhs, rhs, bias), want(lhs, rhs, bias)):
        assert rel(got, expected) <= 3 * TOL[dtype]


def sliced_epilogue(lhs, rhs, sizes, bias, activation, residual):
    """The epilogue on the sliced product, in jnp: rows past the sum take only the residual."""
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    parts = [jaxgemm.activations.apply(activation, jnp.dot(lhs[a:b], rhs[j], precision=lax.Precision.HIGHEST) + bias[j])
             for j, (a, b) in enumerate(itertools.pairwise(bounds))]  # fmt: skip
    out = jnp.concatenate(parts + [jnp.zeros((lhs.shape[0] - bounds[-1], rhs.shape[2]), lhs.dtype)])
    return out + residual


@pytest.mark.parametrize("activation", ["sigmoid", "gelu", "relu", None])
def test_epilogue_jvp_and_hessian(activation):
    """The epilogue's primitive: jvp in all four differentiable operands, and the hessian in
    rhs and in the bias through the activation, against the sliced jnp formulation (rows past
    the sum: sigmoid(0) = 0.5 must not reach them)."""
    keys = jax.random.split(jax.random.key(15), 4)  # small: the hessian vmaps over every entry
    lhs, rhs = jax.random.normal(keys[0], (9, 3)), jax.random.normal(keys[1], (3, 3, 4))
    bias, residual = jax.random.normal(keys[2], (3, 4)), jax.random.normal(keys[3], (9, 4))
    sizes = np.array([3, 0, 4], np.int32)  # 2 rows past the sum
    def ours(l, r, b, res):
        return ragged_dot(l, r, jnp.asarray(sizes), bias=b, activation=activation, residual=res)

    theirs = lambda l, r, b, res: sliced_epilogue(l, r, sizes, b, activation, res)  # noqa: E731
    args = (lhs, rhs, bias, residual)
    tangents = tuple(jax.random.normal(jax.random.key(17 + i), a.shape, a.dtype) for i, a in enumerate(args))
    (y, t), (y_ref, t_ref) = jax.jvp(ours, args, tangents), jax.jvp(theirs, args, tangents)
    assert rel(y, y_ref) <= 1e-5 and rel(t, t_ref) <= 1e-5
    for argnum in (1, 2):
        loss = lambda f: lambda *a: jnp.sum(jnp.sin(f(*a)))  # noqa: E731
        got = jax.hessian(loss(ours), argnums=argnum)(*args)
        want = jax.hessian(loss(theirs), argnums=argnum)(*args)
        assert rel(got, want) <= 1e-5, argnum


def test_epilogue_vmap_keeps_rows_past_the_sum_out():
    """vmap of the epilogue: each batch's rows past its sum come out as the residual alone,
    values and gradients (the folded product puts them in an extra group, which must take
    no bias or activation)."""
    sizes = np.array([PATTERNS["rows_past_the_sum"], PATTERNS["ragged"]], np.int32)
    batched = [inputs(20 + i) for i in range(2)]
    lhs, rhs, bias = (jnp.stack([b[i] for b in batched]) for i in range(3))
    residual = jax.random.normal(jax.random.key(22), (2, M, N), jnp.float32)
    f = lambda l, r, b, res, s: ragged_dot(l, r, s, bias=b, activation="sigmoid", residual=res)  # noqa: E731
    out = jax.jit(jax.vmap(f))(lhs, rhs, bias, residual, jnp.asarray(sizes))
    for i in range(2):
        assert rel(out[i], reference(lhs[i], rhs[i], sizes[i], bias[i], "sigmoid", residual[i])) <= 1e-5
    loss = lambda l, r, b: jnp.sum(jax.vmap(f)(l, r, b, residual, jnp.asarray(sizes)) ** 2)  # noqa: E731
    ref = lambda l, r, b: sum(jnp.sum(sliced_epilogue(l[i], r[i], sizes[i], b[i], "sigmoid", residual[i]) ** 2)  # noqa: E731
                              for i in range(2))  # fmt: skip
    grads = zip(jax.grad(loss, argnums=(0, 1, 2))(lhs, rhs, bias), jax.grad(ref, argnums=(0, 1, 2))(lhs, rhs, bias))
    for got, want in grads:
        assert rel(got, want) <= 1e-5


@pytest.mark.parametrize("in_axes", [(0, 0, 0), (0, None, None), (None, 0, 0), (0, None, 0)])
def test_vmap_folds_into_one_product(in_axes):
    sizes = np.array([PATTERNS["ragged"], PATTERNS["rows_past_the_sum"], PATTERNS["one_group"]], np.int32)
    batched = [inputs(10 + i) for i in range(3)]
    args = (jnp.stack([b[0] for b in batched]), jnp.stack([b[1] for b in batched]), jnp.asarray(sizes))
    args = tuple(a if ax == 0 else a[0] for a, ax in zip(args, in_axes))
    out = jax.jit(jax.vmap(ragged_dot, in_axes=in_axes))(*args)
    for i in range(3):
        one = [a[i] if ax == 0 else a for a, ax in zip(args, in_axes)]
        assert rel(out[i], reference(*one)) <= 1e-5
    # and its gradient (ragged_wgrad_p batched the same way)
    loss = lambda *a: jnp.sum(jax.vmap(ragged_dot, in_axes=in_axes)(*a) ** 2)  # noqa: E731
    ref_loss = lambda *a: sum(  # noqa: E731
        jnp.sum(ragged_dot(*[x[i] if ax == 0 else x for x, ax in zip(a, in_axes)]) ** 2) for i in range(3))
    for got, want in zip(jax.grad(loss, argnums=(0, 1))(*args), jax.grad(ref_loss, argnums=(0, 1))(*args)):
        assert rel(got, want) <= 1e-5


# Traced sizes that break the contract, with the sizes lax.ragged_dot's result equals: a
# leading negative size and a sum past m keep lax's groups apart (lax's own sizes); a
# negative size between groups makes lax add two groups' products for the rows both claim,
# where every jaxgemm route keeps them in the first group.
INVALID_SIZES = {
    "negative_first": ([-2, 20, 20, 10, 5], [-2, 20, 20, 10, 5]),
    "past_m": ([30, 30, 0, 7, 0], [30, 30, 0, 7, 0]),
    "overlap": ([M, -M, M, 0, 2], [M, 0, 0, 0, 0]),
}


@pytest.mark.parametrize("route", ["ffi", "xla"])  # the CPU's two routes; on a GPU the grouped kernel twice
@pytest.mark.parametrize("case", list(INVALID_SIZES))
def test_invalid_sizes_under_jit_agree_on_every_route(case, route, monkeypatch):
    monkeypatch.setenv("JAXGEMM_CPU", route)
    sizes, lax_sizes = (jnp.array(s, jnp.int32) for s in INVALID_SIZES[case])
    lhs, rhs, bias = inputs(7, jnp.bfloat16)  # 16-bit: the grouped kernel on a GPU
    f32 = lambda *xs: [x.astype(jnp.float32) for x in xs]  # noqa: E731
    loss = lambda f: lambda l, r, s: (f(l, r, s) * jnp.arange(N, dtype=jnp.float32)).sum()  # noqa: E731
    ours = lambda l, r, s: ragged_dot(l, r, s, preferred_element_type=jnp.float32)  # noqa: E731
    theirs = lambda l, r, s: lax.ragged_dot(*f32(l, r), s)  # noqa: E731
    out = jax.jit(ours)(lhs, rhs, sizes)  # (concrete sizes raise: test_bad_input_names_the_shapes)
    assert rel(out, theirs(lhs, rhs, lax_sizes)) < 1e-2
    if case == "overlap":  # (lax's own result differs: rows in two groups)
        assert rel(theirs(lhs, rhs, sizes), theirs(lhs, rhs, lax_sizes)) > 0.1
    grads = jax.jit(jax.grad(loss(ours), argnums=(0, 1)))(lhs, rhs, sizes)
    ref = jax.grad(loss(theirs), argnums=(0, 1))(*f32(lhs, rhs), lax_sizes)
    for got, want in zip(grads, ref):
        assert rel(got, want) < 1e-2
    glu = jax.jit(lambda l, r, s: jaxgemm.ragged_glu(l, r, r[::-1], s, preferred_element_type=jnp.float32))
    want = jax.nn.silu(theirs(lhs, rhs, lax_sizes)) * theirs(lhs, rhs[::-1], lax_sizes)
    assert rel(glu(lhs, rhs, sizes), want) < 1e-2


def test_bad_input_names_the_shapes():
    lhs, rhs, bias = inputs(6)
    sizes = jnp.array(PATTERNS["balanced"], jnp.int32)
    with pytest.raises(ValueError, match=r"\(1, 53, 24\), \(5, 24, 40\)"):
        ragged_dot(lhs[None], rhs, sizes)
    with pytest.raises(ValueError, match="disagree on k or g"):
        ragged_dot(lhs[:, :20], rhs, sizes)
    with pytest.raises(ValueError, match="disagree on k or g"):
        ragged_dot(lhs, rhs, sizes[:4])
    with pytest.raises(TypeError, match="integers"):
        ragged_dot(lhs, rhs, sizes.astype(jnp.float32))
    with pytest.raises(TypeError, match="float64|int32"):
        ragged_dot(lhs.astype(jnp.int32), rhs, sizes)
    with pytest.raises(ValueError, match=r"bias of shape \(40,\)"):
        ragged_dot(lhs, rhs, sizes, bias=bias[0])
    with pytest.raises(ValueError, match="unknown activation"):
        ragged_dot(lhs, rhs, sizes, activation="swish_plus")
    with pytest.raises(ValueError, match=r"sum to at most m = 53 \(sum 54\)"):
        ragged_dot(lhs, rhs, sizes.at[0].add(1))
    with pytest.raises(ValueError, match=">= 0"):
        ragged_dot(lhs, rhs, sizes.at[0].set(-1))


def collectives(hlo: str) -> dict:
    return {op: hlo.count(f" {op}(") + hlo.count(f" {op}-start(") for op in ("all-gather", "all-reduce", "reduce-scatter")}


SHARDED = [  # (name, lhs spec, rhs spec, collectives of the forward, of the gradients of lhs and rhs)
    ("rows", ("x", None), (), {}, {"all-reduce": 1}),  # the weight gradient's partial sums
    ("rows_2d_mesh", (("x", "y"), None), (), {}, {"all-reduce": 1}),
    ("k", (None, "x"), (None, "x"), {"all-reduce": 1}, {}),
    ("n", (), (None, None, "x"), {}, {"all-reduce": 1}),  # d lhs sums over the split n
    ("experts", (), ("x",), None, None),  # gathered: values only
]


def _mesh(axis_type, two_d=False):
    """The largest power-of-two mesh of at most 8 devices: 1-D ("x"), or 2 x n/2 ("x", "y")."""
    n = 2 ** int(np.log2(min(len(jax.devices()), 8)))
    shape, names = ((2, n // 2), ("x", "y")) if two_d else ((n,), ("x",))
    return jax.make_mesh(shape, names, axis_types=(axis_type,) * len(shape), devices=jax.devices()[:n])


@pytest.mark.skipif(len(jax.devices()) < 2, reason="needs several devices (tests/conftest.py asks for 8)")
@pytest.mark.parametrize("case", SHARDED, ids=lambda c: c[0])
def test_sharded_jit_auto_mode(case):
    """Sharded jit (Auto mode): one device's values and gradients, with the collectives the
    rule implies and no others (rows split: none in the product; the weight gradient's
    partial sums all-reduced)."""
    name, lhs_spec, rhs_spec, fwd_collectives, grad_collectives = case
    mesh = _mesh(AxisType.Auto, two_d=name == "rows_2d_mesh")
    lhs, rhs, _ = inputs(7, m=64)
    rhs = jnp.concatenate([rhs] * 2)[:8]  # 8 experts: divisible by the mesh
    sizes = jnp.array([10, 0, 30, 4, 4, 4, 4, 4], jnp.int32)  # groups cut across the row shards
    shardings = (NamedSharding(mesh, P(*lhs_spec)), NamedSharding(mesh, P(*rhs_spec)))
    loss = lambda l, r: jnp.sum(jnp.sin(ragged_dot(l, r, sizes)))  # noqa: E731
    f = jax.jit(lambda l, r: ragged_dot(l, r, sizes), in_shardings=shardings)
    g = jax.jit(jax.grad(loss, argnums=(0, 1)), in_shardings=shardings)
    assert rel(f(lhs, rhs), reference(lhs, rhs, sizes)) <= 1e-5
    for got, want in zip(g(lhs, rhs), jax.grad(loss, argnums=(0, 1))(lhs, rhs)):
        assert rel(got, want) <= 1e-5
    if fwd_collectives is not None:
        none = {"all-gather": 0, "all-reduce": 0, "reduce-scatter": 0}
        assert collectives(f.lower(lhs, rhs).compile().as_text()) == {**none, **fwd_collectives}
        assert collectives(g.lower(lhs, rhs).compile().as_text()) == {**none, **fwd_collectives, **grad_collectives}


@pytest.mark.skipif(len(jax.devices()) < 2, reason="needs several devices (tests/conftest.py asks for 8)")
@pytest.mark.parametrize("split", ["rows", "k"])
def test_sharded_epilogue_acts_once(split):
    """The epilogue under sharded jit: rows split, each device's rows take their own groups'
    bias (no collective in the forward); k split, the bias, activation and residual act once
    on the all-reduced product. Values and gradients as on one device."""
    mesh = _mesh(AxisType.Auto)
    lhs, rhs, bias = inputs(23, m=64)
    rhs, bias = jnp.concatenate([rhs] * 2)[:8], jnp.concatenate([bias] * 2)[:8]
    if split == "k":  # k = 32: divisible by the mesh
        lhs, rhs = jnp.concatenate([lhs] * 2, axis=1)[:, :32], jnp.concatenate([rhs] * 2, axis=1)[:, :32]
    residual = jax.random.normal(jax.random.key(24), (64, N), jnp.float32)
    sizes = jnp.array([10, 0, 30, 4, 4, 4, 4, 4], jnp.int32)
    specs = {"rows": (P("x", None), P()), "k": (P(None, "x"), P(None, "x", None))}[split]
    shardings = tuple(NamedSharding(mesh, spec) for spec in specs)
    f = lambda l, r, b: ragged_dot(l, r, sizes, bias=b, activation="gelu", residual=residual)  # noqa: E731
    loss = lambda l, r, b: jnp.sum(jnp.sin(f(l, r, b)))  # noqa: E731
    fwd = jax.jit(f, in_shardings=(*shardings, None))
    assert rel(fwd(lhs, rhs, bias), reference(lhs, rhs, sizes, bias, "gelu", residual)) <= 1e-5
    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)), in_shardings=(*shardings, None))(lhs, rhs, bias)
    for got, want in zip(grads, jax.grad(loss, argnums=(0, 1, 2))(lhs, rhs, bias)):
        assert rel(got, want) <= 1e-5
    got = collectives(fwd.lower(lhs, rhs, bias).compile().as_text())
    assert got == {"all-gather": 0, "all-reduce": int(split == "k"), "reduce-scatter": 0}, got


@pytest.mark.skipif(len(jax.devices()) < 2, reason="needs several devices (tests/conftest.py asks for 8)")
@pytest.mark.parametrize("axis_type", [AxisType.Auto, AxisType.Explicit], ids=["auto", "explicit"])
def test_rows_split_experts_sharded_as_parameters(axis_type):
    """Data parallelism with the experts' weights sharded over the same axis (FSDP-like):
    the forward gathers the weights once, and the weight gradient's partial sums come back
    reduce-scattered over the experts, each device keeping its experts' share (not an
    all-reduce of every expert's gradient)."""
    mesh = _mesh(axis_type)
    lhs, rhs, _ = inputs(12, m=64)
    rhs = jnp.concatenate([rhs] * 2)[:8]
    sizes = jnp.array([10, 0, 30, 4, 4, 4, 4, 4], jnp.int32)
    x_sharding, w_sharding = NamedSharding(mesh, P("x", None)), NamedSharding(mesh, P("x", None, None))
    loss = lambda l, r: jnp.sum(jnp.sin(ragged_dot(l, r, sizes)))  # noqa: E731
    grad = jax.grad(loss, argnums=(0, 1))
    with jax.set_mesh(mesh):
        x, w = jax.device_put(lhs, x_sharding), jax.device_put(rhs, w_sharding)
        g = jax.jit(grad, out_shardings=(x_sharding, w_sharding))
        dx, dw = g(x, w)
        hlo = g.lower(x, w).compile().as_text()
    assert dw.sharding.is_equivalent_to(w_sharding, 3)
    want = jax.grad(lambda l, r: jnp.sum(jnp.sin(sliced(l, r, np.asarray(sizes)))), argnums=(0, 1))(lhs, rhs)
    assert rel(dx, want[0]) <= 1e-5 and rel(dw, want[1]) <= 1e-5
    assert collectives(hlo) == {"all-gather": 1, "all-reduce": 0, "reduce-scatter": 1}, collectives(hlo)
    scattered = re.findall(r"= f32\[([\d,]+)\]\{[\d,]*\} reduce-scatter", hlo)
    assert scattered == [f"{8 // mesh.size},{lhs.shape[1]},{rhs.shape[2]}"], scattered


@pytest.mark.skipif(len(jax.devices()) < 2, reason="needs several devices (tests/conftest.py asks for 8)")
def test_explicit_mode_rows_split():
    """Explicit mode: rows split give an output typed like them and the gradient of a
    replicated weight typed replicated (lax.ragged_dot raises here)."""
    mesh = _mesh(AxisType.Explicit)
    lhs, rhs, _ = inputs(9, m=64)
    sizes = jnp.array([20, 0, 30, 4, 10], jnp.int32)
    with jax.set_mesh(mesh):
        x = jax.device_put(lhs, NamedSharding(mesh, P("x", None)))
        w = jax.device_put(rhs, NamedSharding(mesh, P()))
        out = jax.jit(lambda l, r: ragged_dot(l, r, sizes))(x, w)
        assert jax.typeof(out).sharding.spec == P("x", None)
        dx, dw = jax.jit(jax.grad(lambda l, r: jnp.sum(ragged_dot(l, r, sizes) ** 2), argnums=(0, 1)))(x, w)
        assert jax.typeof(dx).sharding.spec == P("x", None) and jax.typeof(dw).sharding.spec == P(None, None, None)
    assert rel(out, reference(lhs, rhs, sizes)) <= 1e-5
    want = jax.grad(lambda l, r: jnp.sum(sliced(l, r, np.asarray(sizes)) ** 2), argnums=(0, 1))(lhs, rhs)
    assert rel(dx, want[0]) <= 1e-5 and rel(dw, want[1]) <= 1e-5


@pytest.mark.skipif(len(jax.devices()) < 2, reason="needs several devices (tests/conftest.py asks for 8)")
def test_explicit_mode_contraction_split_needs_out_sharding():
    """k split in both operands: ambiguous without out_sharding, as for jnp.matmul; with it,
    the partial products' sum comes back typed as asked."""
    mesh = _mesh(AxisType.Explicit)
    lhs, rhs, bias = inputs(10, m=64)
    rhs = jnp.concatenate([rhs] * 2, axis=1)[:, :32]  # k = 32: divisible by the mesh
    lhs = jnp.concatenate([lhs] * 2, axis=1)[:, :32]
    sizes = jnp.array([20, 0, 30, 4, 10], jnp.int32)
    with jax.set_mesh(mesh):
        x = jax.device_put(lhs, NamedSharding(mesh, P(None, "x")))
        w = jax.device_put(rhs, NamedSharding(mesh, P(None, "x", None)))
        with pytest.raises(Exception, match="out_sharding"):
            jax.jit(lambda l, r: ragged_dot(l, r, sizes))(x, w)
        out = jax.jit(lambda l, r: ragged_dot(l, r, sizes, out_sharding=P("x", None)))(x, w)
        assert jax.typeof(out).sharding.spec == P("x", None)
        # the epilogue on the reduce-scattered rows: each device's rows take their groups' bias
        fused = jax.jit(lambda l, r: ragged_dot(l, r, sizes, bias=bias, activation="gelu", out_sharding=P("x", None)))
        out_fused = fused(x, w)
        assert jax.typeof(out_fused).sharding.spec == P("x", None)
    assert rel(out, reference(lhs, rhs, sizes)) <= 1e-5
    assert rel(out_fused, reference(lhs, rhs, sizes, bias, "gelu")) <= 1e-5
    with pytest.raises(NotImplementedError, match="group_offset"):
        ragged_dot(lhs, rhs, sizes, group_offset=jnp.zeros((1,), jnp.int32))


@pytest.mark.skipif(len(jax.devices()) < 2, reason="needs several devices (tests/conftest.py asks for 8)")
def test_shard_map_forward_and_grad():
    """Token groups per device (rows and their group sizes sharded, experts replicated), as
    expert routing leaves them: forward and the gradient of the replicated weights (its
    psum), with shard_map's default checks."""
    mesh = _mesh(AxisType.Auto)
    n = mesh.size
    lhs, rhs, bias = inputs(8, m=M * n)
    sizes = np.array([PATTERNS[name] for name in PATTERNS] * n, np.int32)[:n]

    def local(l, r, s):
        return ragged_dot(l, r, s[0])

    f = jax.shard_map(local, mesh=mesh, in_specs=(P("x"), P(), P("x")), out_specs=P("x"))
    out = jax.jit(f)(lhs, rhs, jnp.asarray(sizes))
    want = np.concatenate([reference(lhs[i * M:(i + 1) * M], rhs, sizes[i]) for i in range(n)])
    assert rel(out, want) <= 1e-5
    grad = jax.jit(jax.grad(lambda r: jnp.sum(f(lhs, r, jnp.asarray(sizes)) ** 2)))(rhs)
    want_grad = sum(jax.grad(lambda r: jnp.sum(sliced(lhs[i * M:(i + 1) * M], r, sizes[i]) ** 2))(rhs)
                    for i in range(n))  # fmt: skip
    assert rel(grad, want_grad) <= 1e-5
    # with the epilogue (its primitive) inside: the gradient of the replicated bias too
    f_epi = jax.shard_map(lambda l, r, b, s: ragged_dot(l, r, s[0], bias=b, activation="gelu"), mesh=mesh,
                          in_specs=(P("x"), P(), P(), P("x")), out_specs=P("x"))  # fmt: skip
    loss = lambda r, b: jnp.sum(f_epi(lhs, r, b, jnp.asarray(sizes)) ** 2)  # noqa: E731
    got = jax.jit(jax.grad(loss, argnums=(0, 1)))(rhs, bias)
    ref = lambda r, b: sum(jnp.sum(sliced_epilogue(lhs[i * M:(i + 1) * M], r, sizes[i], b, "gelu", 0.0) ** 2)  # noqa: E731
                           for i in range(n))  # fmt: skip
    for g, want in zip(got, jax.grad(ref, argnums=(0, 1))(rhs, bias)):
        assert rel(g, want) <= 1e-5


@pytest.mark.skipif(len(jax.devices()) < 2, reason="needs several devices (tests/conftest.py asks for 8)")
def test_expert_parallel_shard_map():
    """Expert parallelism: tokens and experts split over the devices (two experts each); each
    device sends every token to its expert's device (all_to_all, a fixed capacity per
    device and expert, padding rows multiplied and dropped), runs its experts as one
    ragged_dot, and sends the results back. Values and the gradients of the tokens and of
    the expert weights against the dense per-token reference."""
    mesh = _mesh(AxisType.Auto)
    n = mesh.size
    experts, per_device, d, f = 2 * n, 12, 16, 24
    keys = jax.random.split(jax.random.key(11), 3)
    x = jax.random.normal(keys[0], (n * per_device, d), jnp.float32)
    w = jax.random.normal(keys[1], (experts, d, f), jnp.float32) / np.sqrt(d)
    choice = jax.random.randint(keys[2], (n * per_device,), 0, experts)  # each token's expert
    capacity = per_device  # any device may send all its tokens to one expert

    def local(x, w, choice):  # x (per_device, d), w (2, d, f), choice (per_device,)
        slot = jnp.sum(jnp.tril(choice[:, None] == choice[None, :], -1), axis=1)  # rank among same-expert tokens
        send = jnp.zeros((experts, capacity, d), x.dtype).at[choice, slot].set(x)
        got = jax.lax.all_to_all(send, "x", 0, 0, tiled=True)  # (n * 2, capacity, d): [source, local expert]
        rows = got.reshape(n, 2, capacity, d).swapaxes(0, 1).reshape(-1, d)  # by local expert, then source
        y = ragged_dot(rows, w, jnp.full((2,), n * capacity, jnp.int32))
        back = y.reshape(2, n, capacity, f).swapaxes(0, 1).reshape(experts, capacity, f)
        back = jax.lax.all_to_all(back, "x", 0, 0, tiled=True)  # to the tokens' devices
        return back[choice, slot]

    f_ep = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P("x"), P("x"), P("x")), out_specs=P("x")))
    dense = lambda x, w: jnp.einsum("td,tdf->tf", x, w[choice], precision=lax.Precision.HIGHEST)  # noqa: E731
    assert rel(f_ep(x, w, choice), dense(x, w)) <= 1e-5
    loss = lambda fn: lambda x, w: jnp.sum(jnp.sin(fn(x, w)))  # noqa: E731
    got = jax.grad(loss(lambda x, w: f_ep(x, w, choice)), argnums=(0, 1))(x, w)
    want = jax.grad(loss(dense), argnums=(0, 1))(x, w)
    assert rel(got[0], want[0]) <= 1e-5 and rel(got[1], want[1]) <= 1e-5


# ---------------------------------------------------------------------------------------
# The grouped Hopper kernel (GPU): tiles cut by group ends, k and n that are no multiple of
# the 128 x 256 x 64 tile, every mode (forward, input gradient, weight gradient).

GPU_SIZES = {
    "ragged": [0, 129, 1, 300, 70, 0],  # 500 of 700 rows: 200 past the sum
    "one_group": [0, 0, 700, 0, 0, 0],
    "balanced": [117, 117, 116, 117, 116, 117],
}


# The grouped kernel's work items (gemm/sm90/grouped_items.h, walked on the host as the
# kernel walks them): sizes against its 128 x 256 tiles, with negative sizes, sums past m
# and long skewed groups.
WALK_SIZES = {
    "tiles_and_edges": ([300, 0, 100, 256, 1], 900),
    "one_group": ([0, 700, 0], 700),
    "past_m": ([500, -3, 600], 800),
    "skewed": ([2000, 5, 130, 0, 257, 700, 1], 4000),
}


def _covered(walk, rows, n, tile_m):
    """count[group][r, c]: how many items cover row r of D (its slab's row in the
    contraction) at column tile c."""
    count = {}
    for _, group, row0, row_end, n0, *_ in walk:
        counts = count.setdefault(group, np.zeros((rows, -(-n // 256)), int))
        counts[row0:min(row0 + tile_m, row_end), n0 // 256] += 1
    return count


@pytest.mark.parametrize("blocks", [1, 7, 132])
@pytest.mark.parametrize("case", list(WALK_SIZES))
def test_grouped_items_cover_every_tile_once(case, blocks):
    sizes, m = WALK_SIZES[case]
    n, k = 600, 136
    tile_m, _, tile_k = jaxgemm._jaxgemm.grouped_tile
    ends = np.minimum(np.cumsum(np.maximum(sizes, 0)), m)
    begins = np.concatenate([[0], ends[:-1]])
    # Row modes: every row of D once per column tile, in its own group (rows past the
    # groups: group len(sizes), no k-tiles); the whole contraction.
    walk = jaxgemm._jaxgemm.grouped_walk(sizes, m, n, k, False, blocks)
    count = _covered(walk, m, n, tile_m)
    total = sum(count.values())
    assert (total == 1).all(), np.argwhere(total != 1)[:5]
    for g, (a, b) in enumerate(zip(begins, ends)):
        assert (count.get(g, np.zeros_like(total))[a:b] == 1).all(), g
    assert {w[7] for w in walk if w[1] < len(sizes)} <= {-(-k // tile_k)}
    assert all(w[7] == 0 and w[2] >= ends[-1] for w in walk if w[1] == len(sizes))
    assert all(w[0] < blocks for w in walk)
    # Contraction: every group's (k, n) slab once, over the group's rows.
    walk = jaxgemm._jaxgemm.grouped_walk(sizes, m, n, k, True, blocks)
    count = _covered(walk, k, n, tile_m)
    assert sorted(count) == list(range(len(sizes)))
    assert all((c == 1).all() for c in count.values())
    for _, group, _, _, _, k_begin, k_end, k_tiles in walk:
        assert (k_begin, k_end) == (begins[group], ends[group]) and k_tiles == -(-(k_end - k_begin) // tile_k)


def test_grouped_walk_deals_the_longest_contractions_first_in_snake_order():
    """Weight gradient: one item per group here (k = 128, n = 256), ranked by rows (2000,
    500, 64, 10, 0), dealt to 3 blocks: block b takes the b-th item of even waves and the
    b-th from the end of odd ones (in order and round-robin: [[0, 3], [1, 4], [2]])."""
    sizes = [10, 500, 0, 2000, 64]
    walk = jaxgemm._jaxgemm.grouped_walk(sizes, 2600, 256, 128, True, 3)
    assert [[w[1] for w in walk if w[0] == b] for b in range(3)] == [[3], [1, 2], [4, 0]]


def grouped_reference(lhs, rhs, sizes, ct):
    """(out, d lhs, d rhs) in float64 for the cotangent ct, group by group."""
    lhs, rhs, ct = (np.asarray(a, np.float64) for a in (lhs, rhs, ct))
    out, dlhs, drhs = np.zeros((lhs.shape[0], rhs.shape[2])), np.zeros_like(lhs), np.zeros_like(rhs)
    for j, (a, b) in enumerate(itertools.pairwise(np.concatenate([[0], np.cumsum(sizes)]))):
        out[a:b] = lhs[a:b] @ rhs[j]
        dlhs[a:b] = ct[a:b] @ rhs[j].T
        drhs[j] = lhs[a:b].T @ ct[a:b]
    return out, dlhs, drhs


@pytest.mark.gpu
@pytest.mark.parametrize("pattern", list(GPU_SIZES))
@pytest.mark.parametrize("dtype,out_dtype", [(jnp.bfloat16, None), (jnp.float16, None), (jnp.bfloat16, jnp.float32)])
def test_grouped_kernel_forward_and_gradients(pattern, dtype, out_dtype):
    m, k, n = 700, 136, 264
    sizes = jnp.array(GPU_SIZES[pattern], jnp.int32)
    keys = jax.random.split(jax.random.key(7), 3)
    lhs = jax.random.normal(keys[0], (m, k), jnp.float32).astype(dtype)
    rhs = (jax.random.normal(keys[1], (len(sizes), k, n), jnp.float32) / np.sqrt(k)).astype(dtype)
    ct = jax.random.normal(keys[2], (m, n), jnp.float32).astype(out_dtype or dtype)

    def f(lhs, rhs):
        out, vjp = jax.vjp(lambda x, w: ragged_dot(x, w, sizes, preferred_element_type=out_dtype), lhs, rhs)
        return (out, *vjp(ct))

    hlo = jax.jit(f).lower(lhs, rhs).compile().as_text()
    assert hlo.count('custom_call_target="jaxgemm_ragged_dot"') == 3, "not the grouped kernel"
    tol = 2e-3 if dtype == jnp.float16 else 1e-2
    for name, got, want in zip(("out", "d lhs", "d rhs"), jax.jit(f)(lhs, rhs), grouped_reference(lhs, rhs, sizes, ct)):
        assert rel(got, want) <= tol, (name, rel(got, want))


@pytest.mark.gpu
@pytest.mark.parametrize("pattern", ["ragged", "balanced"])
@pytest.mark.parametrize("activation", ["gelu", "sigmoid", None])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_grouped_kernel_epilogue(pattern, activation, dtype):
    """The grouped kernel's epilogue (one jaxgemm_ragged_epilogue call): bias per group,
    activation and residual, rows past the sum (sigmoid(0) must not reach them), n not a
    multiple of the tile, against float64; and under grad, its aux z against the unfused
    formulation's gradients."""
    m, k, n = 700, 136, 264
    sizes = jnp.array(GPU_SIZES[pattern], jnp.int32)
    keys = jax.random.split(jax.random.key(9), 5)
    lhs = jax.random.normal(keys[0], (m, k), jnp.float32).astype(dtype)
    rhs = (jax.random.normal(keys[1], (len(sizes), k, n), jnp.float32) / np.sqrt(k)).astype(dtype)
    bias = jax.random.normal(keys[2], (len(sizes), n), jnp.float32)
    residual = jax.random.normal(keys[3], (m, n), jnp.float32).astype(dtype)
    f = lambda x, w, b, r: ragged_dot(x, w, sizes, bias=b, activation=activation, residual=r)  # noqa: E731
    hlo = jax.jit(f).lower(lhs, rhs, bias, residual).compile().as_text()
    assert hlo.count('custom_call_target="jaxgemm_ragged_epilogue"') == 1, "not the fused grouped kernel"
    tol = 2e-3 if dtype == jnp.float16 else 1e-2
    got = jax.jit(f)(lhs, rhs, bias, residual)
    assert rel(got, reference(lhs, rhs, sizes, bias, activation, residual)) <= tol
    loss = lambda fn: lambda *a: jnp.sum(jnp.sin(fn(*a).astype(jnp.float32)))  # noqa: E731
    unfused = lambda x, w, b, r: sliced_epilogue(x.astype(jnp.float32), w.astype(jnp.float32), np.asarray(sizes), b,  # noqa: E731
                                                 activation, r.astype(jnp.float32))  # fmt: skip
    grads = jax.jit(jax.grad(loss(f), argnums=(0, 1, 2, 3)))(lhs, rhs, bias, residual)
    for name, g, want in zip(("lhs", "rhs", "bias", "residual"), grads,
                             jax.grad(loss(unfused), argnums=(0, 1, 2, 3))(lhs, rhs, bias, residual)):  # fmt: skip
        assert rel(g, want) <= 3 * tol, (name, rel(g, want))


@pytest.mark.gpu
def test_grouped_kernel_epilogue_columns():
    """The epilogue's bias stage where an item's columns pass n inside a tile of 256 (n =
    520: the last item has 8 columns, the stage's others are 0), the items of a group
    taking the stage in turn, with the residual's words. (n is a multiple of 8 wherever the
    kernel runs: _grouped_kernel_runs.)"""
    n = 520
    m, k = 700, 72
    sizes = jnp.array(GPU_SIZES["ragged"], jnp.int32)
    keys = jax.random.split(jax.random.key(11), 4)
    lhs = jax.random.normal(keys[0], (m, k), jnp.float32).astype(jnp.bfloat16)
    rhs = (jax.random.normal(keys[1], (len(sizes), k, n), jnp.float32) / np.sqrt(k)).astype(jnp.bfloat16)
    bias = jax.random.normal(keys[2], (len(sizes), n), jnp.float32)
    residual = jax.random.normal(keys[3], (m, n), jnp.float32).astype(jnp.bfloat16)
    f = jax.jit(lambda x, w, b, r: ragged_dot(x, w, sizes, bias=b, activation="silu", residual=r))
    hlo = f.lower(lhs, rhs, bias, residual).compile().as_text()
    assert hlo.count('custom_call_target="jaxgemm_ragged_epilogue"') == 1, "not the fused grouped kernel"
    assert rel(f(lhs, rhs, bias, residual), reference(lhs, rhs, sizes, bias, "silu", residual)) <= 1e-2


@pytest.mark.gpu
def test_grouped_kernel_moe_shape():
    """Eight experts of a few hundred rows each, skewed, at sizes where each group spans many tiles."""
    m, k, n, g = 4096, 512, 1024, 8
    sizes = jnp.array([1500, 0, 700, 513, 1, 900, 382, 100], jnp.int32)
    keys = jax.random.split(jax.random.key(8), 3)
    lhs = jax.random.normal(keys[0], (m, k), jnp.float32).astype(jnp.bfloat16)
    rhs = (jax.random.normal(keys[1], (g, k, n), jnp.float32) / np.sqrt(k)).astype(jnp.bfloat16)
    ct = jax.random.normal(keys[2], (m, n), jnp.float32).astype(jnp.bfloat16)
    out, vjp = jax.vjp(lambda x, w: ragged_dot(x, w, sizes), lhs, rhs)
    for name, got, want in zip(("out", "d lhs", "d rhs"), (out, *vjp(ct)), grouped_reference(lhs, rhs, sizes, ct)):
        assert rel(got, want) <= 1e-2, (name, rel(got, want))
