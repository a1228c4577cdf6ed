"""jaxgemm.all_gather_matmul and matmul_reduce_scatter (collective.py) inside shard_map:
values, gradients, vmap, jvp and a hessian-vector product against lax.all_gather /
lax.psum_scatter with jnp products, the rings' collectives in the compiled HLO
(collective-permutes, no all-gather or reduce-scatter), the SMs the ring GEMMs leave free
when asked, and bad input."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxgemm
from jaxgemm.gemm import ring_sm_margin

pytestmark = pytest.mark.skipif(len(jax.devices()) < 2, reason="needs several devices (tests/conftest.py asks for 8)")

TOLERANCE = {jnp.dtype(jnp.float32): 1e-5, jnp.dtype(jnp.bfloat16): 1e-2}


@pytest.fixture(autouse=True)
def exact_float32_reference():
    """jnp's float32 products in exact fp32, as jaxgemm's (precision None): on a GPU their
    default is tf32 (~3e-4 from the exact product)."""
    with jax.default_matmul_precision("highest"):
        yield


def mesh_of(shape, names, axis_type=AxisType.Auto):
    """The mesh, its leading axes halved until it fits the devices there are."""
    shape = list(shape)
    while int(np.prod(shape)) > len(jax.devices()):
        shape[next(i for i, d in enumerate(shape) if d > 1)] //= 2
    return jax.make_mesh(tuple(shape), names, axis_types=(axis_type,) * len(shape))


def normal(seed, shape, dtype=jnp.float32, scale=1.0):
    return (jax.random.normal(jax.random.key(seed), shape, jnp.float32) * scale).astype(dtype)


def rel_error(out, ref):
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    assert out.shape == ref.shape and np.all(np.isfinite(out)), (out.shape, ref.shape)
    return np.linalg.norm(out - ref) / np.linalg.norm(ref)


def f32(*arrays):
    return [None if a is None else a.astype(jnp.float32) for a in arrays]


def collectives(hlo):
    ops = ("all-gather", "all-reduce", "reduce-scatter", "collective-permute")
    return {op: len(re.findall(rf"(?<![\w\-]){op}(?:-start)?\(", hlo)) for op in ops}


def check_against(ours, ref, mesh, specs, args, dtype):
    """Forward and the gradient of sum(sin(.)) with respect to every argument, ours
    against the reference (float32 inputs) under the same shard_map; returns the compiled
    forward's and gradient's HLO."""
    out_spec, in_specs = specs
    sm = lambda f: jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_spec)  # noqa: E731
    loss = lambda f: lambda *a: jnp.sum(jnp.sin(sm(f)(*a).astype(jnp.float32)))  # noqa: E731
    argnums = tuple(range(len(args)))
    tol = TOLERANCE[jnp.dtype(dtype)]
    assert rel_error(jax.jit(sm(ours))(*args), sm(ref)(*f32(*args))) <= tol
    grads = jax.jit(jax.grad(loss(ours), argnums))(*args)
    for got, want in zip(grads, jax.grad(loss(ref), argnums)(*f32(*args))):
        assert rel_error(got, want) <= tol
    fwd = jax.jit(sm(ours)).lower(*args).compile().as_text()
    return fwd, jax.jit(jax.grad(loss(ours), argnums)).lower(*args).compile().as_text()


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("epilogue", [False, True], ids=["plain", "bias_gelu"])
@pytest.mark.parametrize("layout", ["rows", "sequence"])
def test_all_gather_matmul(dtype, epilogue, layout):
    """Column-parallel: x's rows (or a batch's sequence axis) gathered over "model", w and
    bias split by columns; on a 2 x 4 mesh the batch is also split over "data". Values and
    gradients as all_gather then the product; the forward holds n - 1 collective-permutes
    and no all-gather."""
    mesh = mesh_of((2, 4), ("data", "model"))
    n = mesh.shape["model"]
    if layout == "rows":
        x, axis, x_spec, out_spec = normal(1, (16, 24), dtype), 0, P("model"), P(None, "model")
    else:
        x, axis, x_spec, out_spec = normal(1, (4, 12, 24), dtype), 1, P("data", "model"), P("data", None, "model")
    w = normal(2, (24, 8 * n), dtype, 0.2)
    b = normal(3, (8 * n,), dtype) if epilogue else None
    act = "gelu" if epilogue else None

    def ours(x, w, b=None):
        return jaxgemm.all_gather_matmul(x, w, "model", axis=axis, bias=b, activation=act)

    def ref(x, w, b=None):
        y = lax.all_gather(x, "model", axis=axis, tiled=True) @ w
        return y if b is None else jax.nn.gelu(y + b)

    args, specs = (x, w), (x_spec, P(None, "model"))
    if epilogue:
        args, specs = args + (b,), specs + (P("model"),)
    fwd, _ = check_against(ours, ref, mesh, (out_spec, specs), args, dtype)
    assert collectives(fwd) == {"all-gather": 0, "all-reduce": 0, "reduce-scatter": 0, "collective-permute": n - 1}


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("epilogue", [False, True], ids=["plain", "bias_relu_residual"])
def test_matmul_reduce_scatter(dtype, epilogue):
    """Row-parallel: x's features and w's rows split over "model", the summed product
    scattered by rows; the epilogue acts once on each device's summed block. Values and
    gradients as the product then psum_scatter; the forward holds n - 1
    collective-permutes and no reduce-scatter or all-reduce."""
    mesh = mesh_of((2, 4), ("data", "model"))
    n = mesh.shape["model"]
    x, w = normal(4, (4 * n, 8 * n), dtype), normal(5, (8 * n, 16), dtype, 0.2)
    b, r = normal(6, (16,), dtype), normal(7, (4 * n, 16), dtype)

    def ours(x, w, b=None, r=None):
        extra = dict(bias=b, activation="relu", residual=r) if epilogue else {}
        return jaxgemm.matmul_reduce_scatter(x, w, "model", **extra)

    def ref(x, w, b=None, r=None):
        y = lax.psum_scatter(x @ w, "model", scatter_dimension=0, tiled=True)
        return jax.nn.relu(y + b) + r if epilogue else y

    args = (x, w, b, r) if epilogue else (x, w)
    specs = (P(None, "model"), P("model", None), P(), P("model"))[: len(args)]
    fwd, grad = check_against(ours, ref, mesh, (P("model"), specs), args, dtype)
    assert collectives(fwd) == {"all-gather": 0, "all-reduce": 0, "reduce-scatter": 0, "collective-permute": n - 1}
    # the gradient of the replicated bias is summed over the devices (as the reference's)
    assert collectives(grad)["reduce-scatter"] == 0 and collectives(grad)["all-gather"] == 0


def test_sequence_parallel_block_explicit_mode():
    """A Megatron MLP block with sequence parallelism, on an Explicit-mode mesh (the default
    of jax.make_mesh) with device_put inputs: tokens split over "model" enter an
    all_gather_matmul (bias + gelu fused) and leave a matmul_reduce_scatter (bias and the
    residual fused); values and every gradient as the all_gather / psum_scatter block."""
    mesh = mesh_of((8,), ("model",), AxisType.Explicit)
    n = mesh.shape["model"]
    d, hidden = 16, 8 * n
    x, w1, b1 = normal(8, (4 * n, d)), normal(9, (d, hidden), scale=0.3), normal(10, (hidden,))
    w2, b2 = normal(11, (hidden, d), scale=0.3), normal(12, (d,))

    def ours(x, w1, b1, w2, b2):
        h = jaxgemm.all_gather_matmul(x, w1, "model", bias=b1, activation="gelu")
        return jaxgemm.matmul_reduce_scatter(h, w2, "model", bias=b2, residual=x)

    def ref(x, w1, b1, w2, b2):
        h = jax.nn.gelu(lax.all_gather(x, "model", tiled=True) @ w1 + b1)
        return lax.psum_scatter(h @ w2, "model", tiled=True) + b2 + x

    specs = (P("model"), P(None, "model"), P("model"), P("model", None), P())
    args = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip((x, w1, b1, w2, b2), specs)]
    with jax.set_mesh(mesh):
        check_against(ours, ref, mesh, (P("model"), specs), args, jnp.float32)


def test_ring_gemms_leave_sms_free(monkeypatch):
    """With JAXGEMM_RING_SM_MARGIN set, the ring's products (and their gradients' GEMMs)
    carry it in their kernel attributes; a plain matmul beside them keeps every SM."""
    monkeypatch.setenv("JAXGEMM_RING_SM_MARGIN", "8")
    assert ring_sm_margin() == 8
    mesh = mesh_of((4,), ("model",))
    x, w = normal(13, (16, 8)), normal(14, (8, 4 * mesh.shape["model"]))

    def block(x, w):
        return jaxgemm.all_gather_matmul(x, w, "model") + jaxgemm.matmul(lax.all_gather(x, "model", tiled=True), w)

    f = jax.shard_map(block, mesh=mesh, in_specs=(P("model"), P(None, "model")), out_specs=P(None, "model"))
    hlo = jax.jit(jax.grad(lambda x, w: jnp.sum(f(x, w)), (0, 1))).lower(x, w).compile().as_text()
    margins = re.findall(r'custom_call_target="jaxgemm_gemm".*?sm_margin = (\d+)', hlo)
    assert sorted(set(int(m) for m in margins)) == [0, 8], margins
    assert margins.count("8") > mesh.shape["model"], margins  # forward and gradients


@pytest.mark.parametrize(
    "op,x_shape,w_shape,kw,match",
    [
        ("all_gather_matmul", (8,), (8, 4), {}, "rank"),
        ("all_gather_matmul", (8, 6), (8, 4), {}, "differ"),
        ("all_gather_matmul", (8, 6), (6, 4), dict(axis=1), "axis=1"),
        ("all_gather_matmul", (8, 6), (6, 4), dict(axis=-1), "axis=-1"),
        ("matmul_reduce_scatter", (7, 8), (8, 4), {}, "not divisible"),
        ("matmul_reduce_scatter", (8, 8), (2, 8, 4), {}, "rank"),
    ],
)
def test_bad_input(op, x_shape, w_shape, kw, match):
    """Wrong ranks, mismatched K, the last axis named, rows that do not split: a ValueError
    naming the shapes, at trace time."""
    mesh = mesh_of((4,), ("model",))
    f = jax.shard_map(lambda x, w: getattr(jaxgemm, op)(x, w, "model", **kw), mesh=mesh, in_specs=(P(), P()),
                      out_specs=P(), check_vma=False)  # fmt: skip
    with pytest.raises(ValueError, match=match):
        jax.jit(f).lower(jnp.ones(x_shape), jnp.ones(w_shape))


def test_rings_under_vmap_and_jvp():
    """vmap over stacked weights (inside shard_map) and a jvp through both rings, against
    the all_gather / psum_scatter block."""
    mesh = mesh_of((4,), ("model",))
    n = mesh.shape["model"]
    x, w1, w2 = normal(15, (2 * n, 8)), normal(16, (3, 8, 4 * n), scale=0.3), normal(17, (4 * n, 8), scale=0.3)

    def ours(x, w1, w2):
        h = jax.vmap(lambda w: jaxgemm.all_gather_matmul(x, w, "model", activation="gelu"))(w1).sum(0)
        return jaxgemm.matmul_reduce_scatter(h, w2, "model")

    def ref(x, w1, w2):
        h = jax.nn.gelu(jnp.einsum("mk,ekn->emn", lax.all_gather(x, "model", tiled=True), w1)).sum(0)
        return lax.psum_scatter(h @ w2, "model", tiled=True)

    specs = dict(mesh=mesh, in_specs=(P("model"), P(None, None, "model"), P("model")), out_specs=P("model"))
    args = (x, w1, w2)
    tangents = tuple(normal(18 + i, a.shape) for i, a in enumerate(args))
    out, t = jax.jit(lambda a, t: jax.jvp(jax.shard_map(ours, **specs), a, t))(args, tangents)
    want, t_want = jax.jvp(jax.shard_map(ref, **specs), args, tangents)
    assert rel_error(out, want) <= 1e-5 and rel_error(t, t_want) <= 1e-5


def test_rings_hessian_vector_product():
    """Forward-over-reverse through both rings (a gelu between them, so the second
    derivative is not zero), against the all_gather / psum_scatter block."""
    mesh = mesh_of((4,), ("model",))
    n = mesh.shape["model"]
    x, w1, w2 = normal(21, (2 * n, 8)), normal(22, (8, 4 * n), scale=0.3), normal(23, (4 * n, 8), scale=0.3)

    def ours(x, w1, w2):
        h = jaxgemm.all_gather_matmul(x, w1, "model", activation="gelu")
        return jaxgemm.matmul_reduce_scatter(h, w2, "model")

    def ref(x, w1, w2):
        h = jax.nn.gelu(lax.all_gather(x, "model", tiled=True) @ w1)
        return lax.psum_scatter(h @ w2, "model", tiled=True)

    specs = dict(mesh=mesh, in_specs=(P("model"), P(None, "model"), P("model")), out_specs=P("model"))

    def hvp(block, w1, v):
        loss = lambda w1: jnp.sum(jax.shard_map(block, **specs)(x, w1, w2) ** 2)  # noqa: E731
        return jax.jvp(jax.grad(loss), (w1,), (v,))[1]

    v = normal(24, w1.shape)
    assert rel_error(jax.jit(hvp, static_argnums=0)(ours, w1, v), hvp(ref, w1, v)) <= 1e-5
