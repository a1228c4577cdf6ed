"""jaxgemm.fp8.dense with scaling="delayed": one scale per tensor from its amax history,
each tensor quantized by one pass that records this step's amax; the history's gradient is
the updated history. The layer against float64 products of the same per-tensor quantized
operands (exact on the CPU's FFI reference, the fp8 kernel's bound on a Hopper GPU) and
against the unquantized layer; the first step (scale 1) and a stale history (saturation);
jit, sharded jit, shard_map, e5m2 gradients; bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from test_fp8 import QUANTIZATION_BOUND, _exact_bound, _layer, _rel, assert_e5m2_products_on_the_kernel

import jaxgemm
from jaxgemm.fp8 import E4M3_MAX, AmaxHistory, amax_history
from jaxgemm.quantize import scales_of, to_fp8


def _seen(x, w, dz, length=4):
    """A history whose largest entries are the layer's own amax (as after a step on the
    same values), older entries smaller."""
    def one(a):
        amax = float(jnp.max(jnp.abs(a)))
        return jnp.asarray([amax, amax / 2] + [amax / 4] * (length - 2), jnp.float32)

    return AmaxHistory(one(x), one(w), one(dz))


def _dequantized64(a, history_entry, dtype=jnp.float8_e4m3fn):
    """float64 values of a quantized with the history's scale, as the product sees them."""
    scale = scales_of(jnp.max(history_entry), dtype)
    return np.asarray(to_fp8(jnp.asarray(a, jnp.float32), scale, dtype).astype(jnp.float32), np.float64) * float(scale)


def _dz(x, w, b, dy, history):
    """dy * gelu'(z), z from the layer's own forward (its kernel's sums)."""
    z = jaxgemm.fp8.dense(x, w, b, scaling="delayed", history=history)
    return dy * jaxgemm.activations.derivative("gelu", z)


@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
def test_forward_with_the_history_scales(activation):
    x, w, b = _layer(1)
    history = _seen(x * 1.5, w, x)
    y = jaxgemm.fp8.dense(x, w, b, activation, scaling="delayed", history=history)
    z = _dequantized64(x, history.x) @ _dequantized64(w, history.w) + np.asarray(b, np.float64)
    ref = np.asarray(jaxgemm.activations.apply(activation, jnp.asarray(z)), np.float64)
    assert y.shape == (64, 128) and y.dtype == x.dtype
    assert _rel(y, ref) <= _exact_bound()
    unquantized = jaxgemm.activations.apply(activation, jnp.dot(x, w, precision="highest") + b)
    assert _rel(y, unquantized) <= QUANTIZATION_BOUND


def test_gradient_and_the_updated_history():
    """dx, dw straight through on the per-tensor quantized dz, w and x; dbias = sum(dz);
    the history's cotangent is each history with this step's amax in front."""
    x, w, b = _layer(2)
    dy = jnp.asarray(np.random.default_rng(3).standard_normal((64, 128)), jnp.float32)
    history = _seen(x, w, dy)
    dz = _dz(x, w, b, dy, history)
    layer = lambda x, w, b, h: jaxgemm.fp8.dense(x, w, b, "gelu", scaling="delayed", history=h)  # noqa: E731
    _, vjp = jax.jit(lambda *a: jax.vjp(layer, *a))(x, w, b, history)
    dx, dw, db, new = vjp(dy)
    assert _rel(dx, _dequantized64(dz, history.dz) @ _dequantized64(w, history.w).T) <= _exact_bound()
    assert _rel(dw, _dequantized64(x, history.x).T @ _dequantized64(dz, history.dz)) <= _exact_bound()
    assert _rel(db, np.asarray(dz, np.float64).sum(axis=0)) <= 1e-5
    exact = jax.vjp(lambda x, w, b: jax.nn.gelu(jnp.dot(x, w, precision="highest") + b), x, w, b)[1](dy)
    for ours, theirs in zip((dx, dw, db), exact):
        assert _rel(ours, theirs) <= QUANTIZATION_BOUND
    assert isinstance(new, AmaxHistory)
    for got, old, tensor in zip(new, history, (x, w, dz)):
        assert got.shape == old.shape and got.dtype == jnp.float32
        np.testing.assert_allclose(got[0], jnp.max(jnp.abs(tensor)), rtol=1e-6)
        np.testing.assert_array_equal(got[1:], old[:-1])


def test_first_step_and_a_stale_history():
    """A zero history scales by 1 (TransformerEngine's start): values below e4m3's smallest
    subnormal (2^-9) flush to zero. A history far below the tensor saturates it at
    448 x scale (clipped, not NaN); the step after, the history has caught up."""
    x, w, b = _layer(4)
    small = x * 1e-4
    y0 = jaxgemm.fp8.dense(small, w, None, scaling="delayed", history=amax_history(8))
    assert np.all(np.asarray(y0) == 0)
    step = jax.jit(jax.grad(lambda x, h: jnp.sum(jaxgemm.fp8.dense(x, w, None, scaling="delayed", history=h)),
                            argnums=1))  # fmt: skip
    history = step(small, amax_history(8))
    y1 = jaxgemm.fp8.dense(small, w, None, scaling="delayed", history=history)
    assert _rel(y1, jnp.dot(small, w, precision="highest")) <= QUANTIZATION_BOUND
    stale = history._replace(x=history.x / 100)
    y = jaxgemm.fp8.dense(small, w, None, scaling="delayed", history=stale)
    limit = float(scales_of(jnp.max(stale.x))) * E4M3_MAX  # (= the stale history's max)
    clipped = np.clip(np.asarray(small, np.float64), -limit, limit)
    assert np.all(np.isfinite(np.asarray(y))) and np.mean(np.abs(np.asarray(small)) > limit) > 0.3
    assert _rel(y, clipped @ np.asarray(w, np.float64)) <= QUANTIZATION_BOUND


def test_e5m2_gradients():
    x, w, b = _layer(9, m=128)
    dy = jnp.asarray(np.random.default_rng(10).standard_normal((128, 128)), jnp.float32)
    history = _seen(x, w, dy)
    dz = _dz(x, w, b, dy, history)
    layer = lambda x, w, b, h: jaxgemm.fp8.dense(x, w, b, "gelu", scaling="delayed", history=h,  # noqa: E731
                                                 grad_format="e5m2")  # fmt: skip
    backward = jax.vjp(layer, x, w, b, history)[1]
    dx, dw, db, new = backward(dy)
    assert_e5m2_products_on_the_kernel(jax.jit(backward), dy)
    exact = jax.vjp(lambda x, w, b: jax.nn.gelu(jnp.dot(x, w, precision="highest") + b), x, w, b)[1](dy)
    for ours, theirs in zip((dx, dw, db), exact):
        assert _rel(ours, theirs) <= 2 * QUANTIZATION_BOUND
    want = _dequantized64(dz, history.dz, jnp.float8_e5m2) @ _dequantized64(w, history.w).T
    assert _rel(dx, want) <= _exact_bound()
    np.testing.assert_allclose(new.dz[0], jnp.max(jnp.abs(dz)), rtol=1e-6)


@pytest.mark.parametrize("dtype, out_dtype", [(jnp.bfloat16, None), (jnp.bfloat16, jnp.float32), (jnp.float16, None)])
def test_dtypes_batch_dims_and_jit(dtype, out_dtype):
    """16-bit inputs, leading batch dims: y in out_dtype (default x's), dx, dw, dbias in
    their primals' dtypes, the history float32; jit gives the same arrays."""
    x, w, b = _layer(11, dtype=dtype)
    x = x.reshape(4, 16, 256)
    history = _seen(x.astype(jnp.float32), w.astype(jnp.float32), x.astype(jnp.float32))
    def loss(x, w, b, h):
        y = jaxgemm.fp8.dense(x, w, b, "gelu", out_dtype=out_dtype, scaling="delayed", history=h)
        assert y.shape == (4, 16, 128) and y.dtype == jnp.dtype(out_dtype or dtype)
        return jnp.sum(y.astype(jnp.float32) ** 2)

    grads = jax.grad(loss, argnums=(0, 1, 2, 3))(x, w, b, history)
    assert [g.dtype for g in grads[:3]] == [jnp.dtype(dtype)] * 3
    assert all(h.dtype == jnp.float32 and h.shape == (4,) for h in grads[3])
    jitted = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(x, w, b, history)
    for got, want in zip(jax.tree_util.tree_leaves(jitted), jax.tree_util.tree_leaves(grads)):
        assert _rel(got, want) <= 1e-2 if got.dtype != jnp.float32 else _rel(got, want) <= 1e-6


def _mesh(axis_type):
    return jax.make_mesh((4,), ("data",), axis_types=(axis_type,), devices=jax.devices()[:4])


@pytest.mark.skipif(len(jax.devices()) < 4, reason="needs 4 devices")
@pytest.mark.parametrize("axis_type", [jax.sharding.AxisType.Auto, jax.sharding.AxisType.Explicit])
def test_sharded_jit_data_parallel(axis_type):
    """The batch split over 4 devices: the same y, gradients and new history as on one
    device (the amax a max over all), with all-reduces only (w's and b's gradients and
    the amax: nothing gathers x or dz)."""
    x, w, b = _layer(7)
    history = _seen(x, w, x)
    def loss(x, w, b, h):
        return jnp.sum(jaxgemm.fp8.dense(x, w, b, "gelu", scaling="delayed", history=h) ** 2)

    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))
    want = step(x, w, b, history)
    mesh = _mesh(axis_type)
    with jax.set_mesh(mesh):
        placed = [jax.device_put(a, NamedSharding(mesh, P("data") if a is x else P())) for a in (x, w, b)]
        placed.append(jax.device_put(history, NamedSharding(mesh, P())))
        got = step(*placed)
        hlo = step.lower(*placed).compile().as_text()
    for g, v in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        assert _rel(g, v) <= 1e-6  # (the batch's partial sums added in another order)
    assert "all-reduce" in hlo
    assert "all-gather" not in hlo and "all-to-all" not in hlo and "collective-permute" not in hlo


@pytest.mark.skipif(len(jax.devices()) < 4, reason="needs 4 devices")
def test_grad_in_shard_map():
    """Inside shard_map each device quantizes its own rows with the shared history scales;
    the new history's amax is the max over the devices (invariant, as the history), the
    weight gradient the sum of the per-shard gradients."""
    x, w, b = _layer(8)
    history = _seen(x, w, x)
    def loss(w, b, h, x):
        return jnp.sum(jaxgemm.fp8.dense(x, w, b, "gelu", scaling="delayed", history=h) ** 2)

    local = jax.grad(loss, argnums=(0, 1, 2))
    grads = jax.jit(jax.shard_map(local, mesh=_mesh(jax.sharding.AxisType.Auto), in_specs=(P(), P(), P(), P("data")),
                                  out_specs=(P(), P(), P())))(w, b, history, x)  # fmt: skip
    shards = [local(w, b, history, part) for part in jnp.split(x, 4)]
    for ours, parts in zip(grads[:2], zip(*[s[:2] for s in shards])):
        assert _rel(ours, sum(np.asarray(p, np.float64) for p in parts)) <= 1e-5
    whole = local(w, b, history, x)[2]
    for got, want in zip(grads[2], whole):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_bad_input():
    x, w, b = _layer(6)
    with pytest.raises(TypeError, match="needs history=an AmaxHistory"):
        jaxgemm.fp8.dense(x, w, b, scaling="delayed")
    with pytest.raises(ValueError, match=r"float32 vectors of one length.*\(4,\), \(3,\)"):
        jaxgemm.fp8.dense(x, w, b, scaling="delayed", history=AmaxHistory(jnp.zeros(4), jnp.zeros(3), jnp.zeros(4)))
    with pytest.raises(ValueError, match="scaling='rowwise' takes none"):
        jaxgemm.fp8.dense(x, w, b, history=amax_history())
    with pytest.raises(ValueError, match="length must be a positive int"):
        amax_history(0)
    with pytest.raises(TypeError, match="forward-mode"):  # (a custom VJP, as the other scalings)
        jax.jvp(lambda x: jaxgemm.fp8.dense(x, w, b, scaling="delayed", history=amax_history()), (x,), (x,))


def test_vmap_forward_is_each_example():
    """vmap over examples (the history shared): each example's forward, as a loop gives it.
    (The history's cotangent is not batched: under vmap its gradient would be summed.)"""
    x, w, b = _layer(12)
    history = _seen(x, w, x)
    xs = x.reshape(4, 16, 256)
    layer = lambda x: jaxgemm.fp8.dense(x, w, b, "gelu", scaling="delayed", history=history)  # noqa: E731
    np.testing.assert_array_equal(jax.vmap(layer)(xs), jnp.stack([layer(e) for e in xs]))
