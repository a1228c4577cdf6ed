"""On a CPU the ops lower to XLA's dot and convolution (jaxgemm/xla_cpu.py): same values and
gradients as the references, no jaxgemm custom call left, sharding rules kept."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxgemm
from reference import random, rel_error, to64

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU lowering")


@pytest.fixture(autouse=True)
def xla_lowering(monkeypatch):
    monkeypatch.setenv("JAXGEMM_CPU", "xla")


def _custom_calls(f, *args):
    return re.findall(r'custom_call_target="(jaxgemm[^"]*)"', jax.jit(f).lower(*args).compile().as_text())


def _gelu_ref(x, w, b):
    return jax.nn.gelu(jnp.matmul(x, w, precision="highest") + b)


def _conv_ref(x, w, b, stride, groups):
    z = lax.conv_general_dilated(x, w, (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                 feature_group_count=groups, precision="highest")  # fmt: skip
    return jax.nn.relu(z + b)


@pytest.mark.parametrize("act", [None, *jaxgemm.ACTIVATIONS])
def test_matmul_epilogues_and_grads(act):
    rng = np.random.default_rng(1)
    a, b, bias, res = (random(rng, s, jnp.float32) for s in [(2, 6, 5), (5, 7), (7,), (2, 6, 7)])
    ref_act = {None: lambda z: z, "gelu_exact": lambda z: jax.nn.gelu(z, approximate=False),
               "gelu": jax.nn.gelu, "tanh": jnp.tanh}.get(act) or getattr(jax.nn, act)  # fmt: skip

    def ours(a, b, bias, res):
        return jaxgemm.matmul(a, b, bias=bias, activation=act, residual=res, alpha=0.5)

    def ref(a, b, bias, res):
        return ref_act(0.5 * jnp.matmul(a, b, precision="highest") + bias) + res

    args = (a, b, bias, res)
    assert rel_error(ours(*args), to64(ref(*args))) <= 1e-5
    loss = lambda f: lambda *args: jnp.sum(f(*args) ** 2)  # noqa: E731
    for got, want in zip(jax.grad(loss(ours), (0, 1, 2, 3))(*args), jax.grad(loss(ref), (0, 1, 2, 3))(*args)):
        assert rel_error(got, to64(want)) <= 1e-5
    assert _custom_calls(jax.grad(loss(ours), (0, 1, 2, 3)), *args) == []


@pytest.mark.parametrize("stride,groups,c", [(1, 1, 8), (2, 1, 3), (1, 2, 8)])
def test_conv_fwd_bwd(stride, groups, c):
    rng = np.random.default_rng(2)
    x, w, b = random(rng, (2, 9, 9, c), jnp.float32), random(rng, (3, 3, c // groups, 8), jnp.float32), random(
        rng, (8,), jnp.float32)  # fmt: skip

    def ours(x, w, b):
        return jaxgemm.conv2d(x, w, stride=stride, groups=groups, bias=b, activation="relu")

    def ref(x, w, b):
        return _conv_ref(x, w, b, stride, groups)

    assert rel_error(ours(x, w, b), to64(ref(x, w, b))) <= 1e-5
    loss = lambda f: lambda *args: jnp.sum(f(*args) ** 2)  # noqa: E731
    for got, want in zip(jax.grad(loss(ours), (0, 1, 2))(x, w, b), jax.grad(loss(ref), (0, 1, 2))(x, w, b)):
        assert rel_error(got, to64(want)) <= 1e-5
    assert _custom_calls(jax.grad(loss(ours), (0, 1, 2)), x, w, b) == []


def test_bf16_dense_grad_dtypes_and_values():
    rng = np.random.default_rng(3)
    x, w, b = (random(rng, s, jnp.bfloat16) for s in [(16, 32), (32, 24), (24,)])
    loss = lambda f: lambda x, w, b: jnp.sum(f(x, w, b).astype(jnp.float32) ** 2)  # noqa: E731
    got = jax.grad(loss(lambda x, w, b: jaxgemm.dense(x, w, b, "gelu")), (0, 1, 2))(x, w, b)
    want = jax.grad(loss(_gelu_ref), (0, 1, 2))(*(t.astype(jnp.float32) for t in (x, w, b)))
    for g, r in zip(got, want):
        assert g.dtype == jnp.bfloat16 and rel_error(g, to64(r)) <= 2e-2


def test_sharded_row_parallel_dense():
    """K sharded: partial products, one all-reduce, the epilogue after it."""
    if len(jax.devices()) < 4:
        pytest.skip("needs 4 devices")
    mesh = jax.make_mesh((4,), ("x",), axis_types=(AxisType.Auto,))
    rng = np.random.default_rng(4)
    x, w, b = (random(rng, s, jnp.float32) for s in [(16, 32), (32, 24), (24,)])
    shardings = (NamedSharding(mesh, P(None, "x")), NamedSharding(mesh, P("x", None)), NamedSharding(mesh, P()))
    f = jax.jit(lambda x, w, b: jaxgemm.dense(x, w, b, "gelu"), in_shardings=shardings)
    assert rel_error(f(x, w, b), to64(_gelu_ref(x, w, b))) <= 1e-5
    hlo = f.lower(x, w, b).compile().as_text()
    assert len(re.findall(r"all-reduce(?:-start)?\(", hlo)) == 1 and "all-gather" not in hlo


def test_explicit_mode_data_parallel_grad():
    """The README's example: batch-sharded x, replicated w, Explicit axes."""
    if len(jax.devices()) < 4:
        pytest.skip("needs 4 devices")
    mesh = jax.make_mesh((4,), ("x",), axis_types=(AxisType.Explicit,))
    rng = np.random.default_rng(5)
    x, w, b = (random(rng, s, jnp.float32) for s in [(16, 32), (32, 24), (24,)])
    loss = lambda f: lambda w, x: jnp.mean(f(x, w, b) ** 2)  # noqa: E731
    want = jax.grad(loss(_gelu_ref))(w, x)
    with jax.set_mesh(mesh):
        xs, ws = jax.device_put(x, P("x", None)), jax.device_put(w, P())
        got = jax.jit(jax.grad(loss(lambda x, w, b: jaxgemm.dense(x, w, b, "gelu"))))(ws, xs)
        assert jax.typeof(got).sharding.spec == jax.typeof(ws).sharding.spec
    assert rel_error(got, to64(want)) <= 1e-5


def test_shard_map_conv_grad():
    """col2im's and the conv gradients' XLA forms keep shard_map's varying axes."""
    if len(jax.devices()) < 2:
        pytest.skip("needs 2 devices")
    mesh = jax.make_mesh((2,), ("x",), axis_types=(AxisType.Explicit,))
    rng = np.random.default_rng(6)
    x, w, b = random(rng, (4, 6, 6, 3), jnp.float32), random(rng, (3, 3, 3, 8), jnp.float32), random(rng, (8,), jnp.float32)

    def step(conv):
        local = lambda w, x: jax.lax.psum(jnp.sum(conv(x, w, b) ** 2), "x")  # noqa: E731
        return jax.shard_map(local, mesh=mesh, in_specs=(P(), P("x")), out_specs=P())

    ours = lambda x, w, b: jaxgemm.conv2d(x, w, bias=b, activation="relu")  # noqa: E731
    want = jax.grad(lambda w, x: jnp.sum(_conv_ref(x, w, b, 1, 1) ** 2))(w, x)
    with jax.set_mesh(mesh):
        got = jax.jit(jax.grad(step(ours)))(jax.device_put(w, P()), jax.device_put(x, P("x")))
    assert rel_error(got, to64(want)) <= 1e-5
