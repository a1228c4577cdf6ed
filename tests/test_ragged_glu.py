"""jaxgemm.ragged_glu against a float64 reference and the sliced jnp formulation: values over
group-size patterns (rows past the sum, empty groups), biases and activations, dtypes; jvp,
grad and hessian; vmap; sharded jit (rows and k split); bad input; and on a Hopper GPU the
gated grouped kernel (one jaxgemm_ragged_glu call)."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxgemm
from jaxgemm import ragged_glu

PATTERNS = {"balanced": [11, 10, 11, 10, 11], "rows_past_the_sum": [5, 9, 0, 3, 20], "one_group": [0, 53, 0, 0, 0]}
TOL = {jnp.float32: 1e-5, jnp.bfloat16: 1e-2, jnp.float16: 2e-3}


def rel(x, ref):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    return np.linalg.norm(x - ref) / max(np.linalg.norm(ref), 1e-30)


def inputs(seed, dtype=jnp.float32, m=53, k=24, n=40, g=5):
    keys = jax.random.split(jax.random.key(seed), 5)
    lhs = jax.random.normal(keys[0], (m, k), jnp.float32).astype(dtype)
    w_gate, w_up = ((jax.random.normal(key, (g, k, n), jnp.float32) / np.sqrt(k)).astype(dtype) for key in keys[1:3])
    bias_gate, bias_up = (jax.random.normal(key, (g, n), jnp.float32) for key in keys[3:5])
    return lhs, w_gate, w_up, bias_gate, bias_up


def reference(lhs, w_gate, w_up, sizes, activation="silu", bias_gate=None, bias_up=None):
    """Group by group in float64; rows past the sum zero."""
    lhs, w_gate, w_up = (np.asarray(x, np.float64) for x in (lhs, w_gate, w_up))
    out, start = np.zeros((lhs.shape[0], w_gate.shape[2])), 0
    for j, size in enumerate(np.asarray(sizes)):
        rows = lhs[start:start + size]
        gate = rows @ w_gate[j] + (0 if bias_gate is None else np.asarray(bias_gate, np.float64)[j])
        up = rows @ w_up[j] + (0 if bias_up is None else np.asarray(bias_up, np.float64)[j])
        act = np.asarray(jaxgemm.activations.apply(activation, jnp.asarray(gate)), np.float64)
        out[start:start + size] = act * up
        start += size
    return out


def sliced(lhs, w_gate, w_up, sizes, bias_gate, bias_up, activation="silu"):
    """The same in jnp with static slices (differentiable to any order)."""
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    dot = lambda x, w: jnp.dot(x, w, precision=lax.Precision.HIGHEST)  # noqa: E731
    parts = [jaxgemm.activations.apply(activation, dot(lhs[a:b], w_gate[j]) + bias_gate[j]) * (dot(lhs[a:b], w_up[j]) + bias_up[j])
             for j, (a, b) in enumerate(itertools.pairwise(bounds))]  # fmt: skip
    return jnp.concatenate(parts + [jnp.zeros((lhs.shape[0] - bounds[-1], w_gate.shape[2]), lhs.dtype)])


@pytest.mark.parametrize("pattern", list(PATTERNS))
@pytest.mark.parametrize("activation", ["silu", "gelu", None])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_values(pattern, activation, dtype):
    lhs, w_gate, w_up, bias_gate, bias_up = inputs(0, dtype)
    sizes = jnp.array(PATTERNS[pattern], jnp.int32)
    out = jax.jit(lambda *a: ragged_glu(*a, activation=activation, bias_gate=bias_gate, bias_up=bias_up))(
        lhs, w_gate, w_up, sizes)
    assert out.dtype == dtype and out.shape == (53, 40)
    assert rel(out, reference(lhs, w_gate, w_up, sizes, activation, bias_gate, bias_up)) <= TOL[dtype]
    plain = jax.jit(ragged_glu)(lhs, w_gate, w_up, sizes)  # no biases, silu
    assert rel(plain, reference(lhs, w_gate, w_up, sizes)) <= TOL[dtype]


def test_jvp_grad_and_hessian():
    """jvp in all five differentiable operands; hessians in w_up and bias_gate (through
    act' and act''), against the sliced formulation."""
    keys = jax.random.split(jax.random.key(3), 5)
    lhs = jax.random.normal(keys[0], (9, 3))
    w_gate, w_up = jax.random.normal(keys[1], (3, 3, 4)), jax.random.normal(keys[2], (3, 3, 4))
    bias_gate, bias_up = jax.random.normal(keys[3], (3, 4)), jax.random.normal(keys[4], (3, 4))
    sizes = np.array([3, 0, 4], np.int32)  # 2 rows past the sum
    ours = lambda *a: ragged_glu(a[0], a[1], a[2], jnp.asarray(sizes), "gelu", bias_gate=a[3], bias_up=a[4])  # noqa: E731
    theirs = lambda *a: sliced(a[0], a[1], a[2], sizes, a[3], a[4], "gelu")  # noqa: E731
    args = (lhs, w_gate, w_up, bias_gate, bias_up)
    tangents = tuple(jax.random.normal(jax.random.key(10 + i), a.shape) for i, a in enumerate(args))
    (y, t), (y_ref, t_ref) = jax.jvp(ours, args, tangents), jax.jvp(theirs, args, tangents)
    assert rel(y, y_ref) <= 1e-5 and rel(t, t_ref) <= 1e-5
    loss = lambda f: lambda *a: jnp.sum(jnp.sin(f(*a)))  # noqa: E731
    for got, want in zip(jax.grad(loss(ours), argnums=range(5))(*args), jax.grad(loss(theirs), argnums=range(5))(*args)):
        assert rel(got, want) <= 1e-5
    for argnum in (2, 3):
        got = jax.hessian(loss(ours), argnums=argnum)(*args)
        assert rel(got, jax.hessian(loss(theirs), argnums=argnum)(*args)) <= 1e-5, argnum


def test_vmap():
    sizes = np.array([PATTERNS["rows_past_the_sum"], PATTERNS["balanced"]], np.int32)
    batched = [inputs(20 + i) for i in range(2)]
    lhs, w_gate, w_up, bias_gate, bias_up = (jnp.stack([b[i] for b in batched]) for i in range(5))
    f = lambda l, wg, wu, s, bg, bu: ragged_glu(l, wg, wu, s, bias_gate=bg, bias_up=bu)  # noqa: E731
    out = jax.jit(jax.vmap(f))(lhs, w_gate, w_up, jnp.asarray(sizes), bias_gate, bias_up)
    for i in range(2):
        assert rel(out[i], reference(lhs[i], w_gate[i], w_up[i], sizes[i], "silu", bias_gate[i], bias_up[i])) <= 1e-5
    loss = lambda wg: jnp.sum(jax.vmap(f)(lhs, wg, w_up, jnp.asarray(sizes), bias_gate, bias_up) ** 2)  # noqa: E731
    want = jax.grad(lambda wg: sum(jnp.sum(sliced(lhs[i], wg[i], w_up[i], sizes[i], bias_gate[i], bias_up[i]) ** 2)
                                   for i in range(2)))(w_gate)  # fmt: skip
    assert rel(jax.grad(loss)(w_gate), want) <= 1e-5


def collectives(hlo: str) -> dict:
    return {op: hlo.count(f" {op}(") + hlo.count(f" {op}-start(") for op in ("all-gather", "all-reduce", "reduce-scatter")}


@pytest.mark.skipif(len(jax.devices()) < 2, reason="needs several devices (tests/conftest.py asks for 8)")
@pytest.mark.parametrize("split", ["rows", "k"])
def test_sharded_jit(split):
    """Rows split: no collective in the forward; k split: the two partial products summed (one
    all-reduce each, or XLA's combination of them) before the gate acts. Values and
    gradients as on one device."""
    n_dev = 2 ** int(np.log2(min(len(jax.devices()), 8)))
    mesh = jax.make_mesh((n_dev,), ("x",), axis_types=(AxisType.Auto,), devices=jax.devices()[:n_dev])
    lhs, w_gate, w_up, bias_gate, bias_up = inputs(30, m=64, k=32)
    sizes = jnp.array([10, 0, 30, 4, 4], jnp.int32)
    specs = {"rows": (P("x", None), P(), P()), "k": (P(None, "x"), P(None, "x", None), P(None, "x", None))}[split]
    shardings = tuple(NamedSharding(mesh, spec) for spec in specs)
    f = lambda l, wg, wu: ragged_glu(l, wg, wu, sizes, bias_gate=bias_gate, bias_up=bias_up)  # noqa: E731
    fwd = jax.jit(f, in_shardings=shardings)
    assert rel(fwd(lhs, w_gate, w_up), reference(lhs, w_gate, w_up, sizes, "silu", bias_gate, bias_up)) <= 1e-5
    loss = lambda *a: jnp.sum(jnp.sin(f(*a)))  # noqa: E731
    got = jax.jit(jax.grad(loss, argnums=(0, 1, 2)), in_shardings=shardings)(lhs, w_gate, w_up)
    for g, want in zip(got, jax.grad(loss, argnums=(0, 1, 2))(lhs, w_gate, w_up)):
        assert rel(g, want) <= 1e-5
    counts = collectives(fwd.lower(lhs, w_gate, w_up).compile().as_text())
    assert counts["all-gather"] == 0 and counts["reduce-scatter"] == 0, counts
    assert (counts["all-reduce"] > 0) == (split == "k"), counts


@pytest.mark.skipif(len(jax.devices()) < 2, reason="needs several devices (tests/conftest.py asks for 8)")
def test_shard_map_and_explicit_mode():
    """Token groups per device inside shard_map (default checks), forward and the gradient of
    the replicated weights; and rows split in Explicit mode, the result typed like them."""
    n_dev = 2 ** int(np.log2(min(len(jax.devices()), 8)))
    lhs, w_gate, w_up, _, _ = inputs(50, m=8 * n_dev)
    sizes = np.array([[2, 1, 0, 3, 0]] * n_dev, np.int32)  # two rows of each device's eight past the sum
    mesh = jax.make_mesh((n_dev,), ("x",), axis_types=(AxisType.Auto,), devices=jax.devices()[:n_dev])
    f = jax.shard_map(lambda a, wg, wu, s: ragged_glu(a, wg, wu, s[0]), mesh=mesh, in_specs=(P("x"), P(), P(), P("x")),
                      out_specs=P("x"))  # fmt: skip
    out = jax.jit(f)(lhs, w_gate, w_up, jnp.asarray(sizes))
    want = np.concatenate([reference(lhs[8 * i:8 * i + 8], w_gate, w_up, sizes[i]) for i in range(n_dev)])
    assert rel(out, want) <= 1e-5
    grad = jax.jit(jax.grad(lambda wg: jnp.sum(f(lhs, wg, w_up, jnp.asarray(sizes)) ** 2)))(w_gate)
    want_grad = sum(jax.grad(lambda wg: jnp.sum(sliced(lhs[8 * i:8 * i + 8], wg, w_up, sizes[i], jnp.zeros((5, 40)),
                                                       jnp.zeros((5, 40))) ** 2))(w_gate) for i in range(n_dev))  # fmt: skip
    assert rel(grad, want_grad) <= 1e-5
    explicit = jax.make_mesh((n_dev,), ("x",), axis_types=(AxisType.Explicit,), devices=jax.devices()[:n_dev])
    with jax.set_mesh(explicit):
        x = jax.device_put(lhs, NamedSharding(explicit, P("x", None)))
        all_sizes = jnp.array([20, 0, 30, 4, 10], jnp.int32)
        typed = jax.jit(lambda a: ragged_glu(a, w_gate, w_up, all_sizes))(x)
        assert jax.typeof(typed).sharding.spec == P("x", None)
    assert rel(typed, reference(lhs, w_gate, w_up, all_sizes)) <= 1e-5


def test_bad_input_names_the_shapes():
    lhs, w_gate, w_up, bias_gate, _ = inputs(4)
    sizes = jnp.array(PATTERNS["balanced"], jnp.int32)
    with pytest.raises(ValueError, match=r"\(53, 24\), \(5, 24, 40\), \(5, 24, 39\)"):
        ragged_glu(lhs, w_gate, w_up[..., :39], sizes)
    with pytest.raises(ValueError, match="disagree on k"):
        ragged_glu(lhs[:, :20], w_gate, w_up, sizes)
    with pytest.raises(ValueError, match=r"bias_up of shape \(40,\)"):
        ragged_glu(lhs, w_gate, w_up, sizes, bias_up=bias_gate[0])
    with pytest.raises(TypeError, match="integers"):
        ragged_glu(lhs, w_gate, w_up, sizes.astype(jnp.float32))
    with pytest.raises(ValueError, match="unknown activation"):
        ragged_glu(lhs, w_gate, w_up, sizes, "swish_plus")
    with pytest.raises(ValueError, match=r"jaxgemm.ragged_glu: group_sizes .* sum to at most m = 53 \(sum 54\)"):
        ragged_glu(lhs, w_gate, w_up, sizes.at[0].add(1))
    with pytest.raises(ValueError, match=">= 0"):
        ragged_glu(lhs, w_gate, w_up, sizes.at[0].set(-1))


@pytest.mark.gpu
@pytest.mark.parametrize("sizes", [[0, 129, 1, 300, 70, 0], [117, 117, 116, 117, 116, 117]], ids=["ragged", "balanced"])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_gated_kernel(sizes, dtype):
    """The gated grouped kernel (one jaxgemm_ragged_glu call; n = 264: a last item of 8
    columns), values against float64 and gradients (through its two pre-activations)
    against the sliced formulation in float32."""
    sizes = jnp.array(sizes, jnp.int32)
    lhs, w_gate, w_up, bias_gate, bias_up = inputs(40, dtype, m=700, k=136, n=264, g=6)
    f = lambda *a: ragged_glu(*a[:3], sizes, bias_gate=a[3], bias_up=a[4])  # noqa: E731
    args = (lhs, w_gate, w_up, bias_gate, bias_up)
    hlo = jax.jit(f).lower(*args).compile().as_text()
    assert hlo.count('custom_call_target="jaxgemm_ragged_glu"') == 1, "not the gated grouped kernel"
    tol = TOL[dtype]
    assert rel(jax.jit(f)(*args), reference(lhs, w_gate, w_up, sizes, "silu", bias_gate, bias_up)) <= tol
    f32 = [a.astype(jnp.float32) for a in args]
    loss = lambda fn: lambda *a: jnp.sum(jnp.sin(fn(*a).astype(jnp.float32)))  # noqa: E731
    unfused = lambda *a: sliced(*a[:3], np.asarray(sizes), a[3], a[4])  # noqa: E731
    got = jax.jit(jax.grad(loss(f), argnums=range(5)))(*args)
    for name, g, want in zip(("lhs", "w_gate", "w_up", "bias_gate", "bias_up"), got,
                             jax.grad(loss(unfused), argnums=range(5))(*f32)):  # fmt: skip
        assert rel(g, want) <= 3 * tol, (name, rel(g, want))
