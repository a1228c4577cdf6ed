"""jaxgemm.fp8: rowwise quantization, and the fp8 dense layer's forward and straight-through
gradient against float64 products of the same quantized operands (exact on the CPU's FFI
reference; the fp8 kernel's bound on a Hopper GPU) and against the unquantized layer
(within e4m3's rounding); jit, vmap, sharded jit (data parallel); bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from test_scaled import FP8_KERNEL_BOUND, _ffi_gemm_operands, _fp8_kernel_platform, _hopper

import jaxgemm
from jaxgemm.fp8 import E4M3_MAX, quantize_rows

# e4m3 keeps 3 mantissa bits: a value rounds by up to 1/16 of itself. The layer against its
# unquantized twin, measured on the CPU (64 x 256 x 128, gelu): forward 3.8e-2, dx 4.7e-2,
# dw 5.1e-2, dbias 1.0e-2.
QUANTIZATION_BOUND = 0.1

CURRENT_SCALINGS = ("rowwise", "blockwise")  # (scaling="delayed" takes a history: test_fp8_delayed.py)


def _exact_bound():
    return FP8_KERNEL_BOUND if _hopper() else 1e-5


def _rel(out, ref):
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return np.linalg.norm(out - ref) / np.linalg.norm(ref)


def _layer(seed, m=64, k=256, n=128, dtype=jnp.float32):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((m, k)), dtype)
    w = jnp.asarray(rng.standard_normal((k, n)) / 16, dtype)
    b = jnp.asarray(rng.standard_normal(n) / 10, dtype)
    return x, w, b


def _dequantized64(a):
    """float64 values of quantize_rows(a), as the product sees them."""
    q, s = quantize_rows(a)
    return np.asarray(q.astype(jnp.float32), np.float64) * np.asarray(s, np.float64)


def _product64(a, b):
    """a (M, K) @ b (N, K)^T of the rowwise-quantized operands, in float64."""
    return _dequantized64(a) @ _dequantized64(b).T


def test_quantize_rows():
    """Each row's largest magnitude becomes 448 (e4m3's largest), values round by at most
    1/16 of themselves (subnormals aside), and an all-zero row keeps scale 1."""
    x = jnp.asarray(np.random.default_rng(0).standard_normal((5, 300)) * np.logspace(-3, 3, 5)[:, None], jnp.float32)
    x = x.at[2].set(0.0)
    q, s = quantize_rows(x)
    assert q.dtype == jnp.float8_e4m3fn and s.shape == (5, 1) and s.dtype == jnp.float32
    qf = np.asarray(q.astype(jnp.float32))
    np.testing.assert_array_equal(np.abs(qf).max(axis=1), [E4M3_MAX, E4M3_MAX, 0, E4M3_MAX, E4M3_MAX])
    assert float(s[2, 0]) == 1.0
    back, xf = qf * np.asarray(s), np.asarray(x)
    normal = np.abs(qf) >= 2.0**-6  # e4m3's smallest normal
    assert np.all(np.abs(back - xf)[normal] <= np.abs(xf)[normal] / 16 * (1 + 1e-6))


@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
def test_forward(activation):
    x, w, b = _layer(1)
    y = jaxgemm.fp8.dense(x, w, b, activation)
    z = _product64(x, w.T) + np.asarray(b, np.float64)
    ref = np.asarray(jaxgemm.activations.apply(activation, jnp.asarray(z)), np.float64)
    assert y.shape == (64, 128) and y.dtype == x.dtype
    assert _rel(y, ref) <= _exact_bound()
    unquantized = jaxgemm.activations.apply(activation, jnp.dot(x, w, precision="highest") + b)
    assert _rel(y, unquantized) <= QUANTIZATION_BOUND


def test_gradient_is_straight_through():
    """dz = dy * act'(z); dx = dz @ w^T, dw = x^T @ dz on rowwise-quantized copies of each
    operand (x^T and dz^T scaled per feature over the batch); dbias = sum(dz)."""
    x, w, b = _layer(2)
    dy = jnp.asarray(np.random.default_rng(3).standard_normal((64, 128)), jnp.float32)
    _, vjp = jax.vjp(lambda x, w, b: jaxgemm.fp8.dense(x, w, b, "gelu"), x, w, b)
    dx, dw, db = vjp(dy)
    # dz from the layer's own z (its kernel's sums, not float64's): a z a rounding away
    # moves values of dz across e4m3 steps of 1/16 (3.3e-3 in dx on an H100).
    z = jaxgemm.fp8.dense(x, w, b)
    dz = dy * jaxgemm.activations.derivative("gelu", z)
    assert _rel(dx, _product64(dz, w)) <= _exact_bound()
    assert _rel(dw, _product64(x.T, dz.T)) <= _exact_bound()
    assert _rel(db, np.asarray(dz, np.float64).sum(axis=0)) <= 1e-5
    exact = jax.vjp(lambda x, w, b: jax.nn.gelu(jnp.dot(x, w, precision="highest") + b), x, w, b)[1](dy)
    for ours, theirs in zip((dx, dw, db), exact):
        assert _rel(ours, theirs) <= QUANTIZATION_BOUND


def _dequantized64_as(a, dtype):
    """float64 values of quantize_rows(a, dtype)."""
    q, s = quantize_rows(a, dtype)
    return np.asarray(q.astype(jnp.float32), np.float64) * np.asarray(s, np.float64)


def assert_e5m2_products_on_the_kernel(backward, *args):
    """Where the fp8 kernel runs (a Hopper GPU, the CPU's FFI reference), the backward's
    two products are fp8 GEMM calls of an e5m2 operand beside an e4m3 one: dz w^T
    (e5m2 first) and x^T dz (e5m2 second); none dequantizes."""
    backend = jax.default_backend()
    if (backend == "gpu" and not _hopper()) or (backend == "cpu" and jaxgemm.xla_cpu.enabled("cpu")):
        return
    hlo = backward.lower(*args).compile().as_text()
    calls = _ffi_gemm_operands(hlo) + _ffi_gemm_operands(hlo, "jaxgemm_block_scaled_gemm")
    firsts = sorted(c.split("f8")[1].split("[")[0] for c in calls)
    assert len(calls) == 2 and firsts == ["e4m3fn", "e5m2"] and all("f8e5m2[" in c for c in calls), calls


@pytest.mark.parametrize("scaling", CURRENT_SCALINGS)
def test_e5m2_gradients(scaling):
    """grad_format="e5m2" (the HYBRID recipe): the same forward, dz quantized to e5m2 in both
    backward products (and nothing else), the gradients within e5m2's rounding of the
    unquantized layer's; rowwise, dx exactly the product of e5m2 dz and e4m3 w."""
    x, w, b = _layer(9, m=128, k=256, n=128)
    dy = jnp.asarray(np.random.default_rng(10).standard_normal((128, 128)), jnp.float32)
    def layer(fmt):
        return lambda x, w, b: jaxgemm.fp8.dense(x, w, b, "gelu", scaling=scaling, grad_format=fmt)

    y4, vjp4 = jax.vjp(layer("e4m3"), x, w, b)
    y5, vjp5 = jax.vjp(layer("e5m2"), x, w, b)
    np.testing.assert_array_equal(np.asarray(y4), np.asarray(y5))
    grads4, grads5 = vjp4(dy), vjp5(dy)
    exact = jax.vjp(lambda x, w, b: jax.nn.gelu(jnp.dot(x, w, precision="highest") + b), x, w, b)[1](dy)
    for g4, g5, theirs in zip(grads4[:2], grads5[:2], exact):
        assert _rel(g5, theirs) <= 2 * QUANTIZATION_BOUND  # (e5m2 rounds to 1/8 of a value)
        assert _rel(g5, theirs) >= _rel(g4, theirs)  # coarser
    assert _rel(grads5[2], grads4[2]) <= 1e-5  # dbias = sum(dz): no format in it (summed in another order)
    jaxpr = str(jax.make_jaxpr(lambda x: vjp5(dy))(x))
    assert "f8_e5m2" in jaxpr and "f8_e4m3fn" in jaxpr
    assert_e5m2_products_on_the_kernel(jax.jit(vjp5), dy)
    if scaling == "rowwise" and not _hopper():
        z = jaxgemm.fp8.dense(x, w, b)
        dz = dy * jaxgemm.activations.derivative("gelu", z)
        want = _dequantized64_as(dz, jnp.float8_e5m2) @ _dequantized64(w).T
        assert _rel(grads5[0], want) <= 1e-5


def test_quantizers_name_a_k_that_is_not_whole_blocks():
    with pytest.raises(ValueError, match=r"quantize_blocks: needs x \(\.\.\., R, K\) with K a multiple of block=128, got shape \(8, 200\)"):
        jaxgemm.fp8.quantize_blocks(jnp.ones((8, 200)))
    with pytest.raises(ValueError, match=r"quantize_tiles: .* block=64, got shape \(256, 96\)"):
        jaxgemm.fp8.quantize_tiles(jnp.ones((256, 96)), block=64)
    with pytest.raises(ValueError, match=r"quantize_tiles: needs a 2-D array, got shape \(2, 128, 128\)"):
        jaxgemm.fp8.quantize_tiles(jnp.ones((2, 128, 128)))
    q, s = jaxgemm.fp8.quantize_blocks(jnp.ones((2, 8, 256)))  # leading dims, whole blocks: fine
    assert q.shape == (2, 8, 256) and s.shape == (2, 8, 2)


def test_bad_grad_format():
    x, w, b = _layer(11)
    with pytest.raises(ValueError, match="grad_format must be one of"):
        jaxgemm.fp8.dense(x, w, b, grad_format="e3m4")


@pytest.mark.parametrize("scaling", CURRENT_SCALINGS)
def test_dtypes_batch_dims_jit_and_vmap(scaling):
    """bf16 inputs: bf16 results and gradients; (..., K) inputs; jit(grad) and vmap."""
    x, w, b = _layer(4, dtype=jnp.bfloat16)
    x3 = x.reshape(4, 16, 256)
    loss = lambda x, w, b: jnp.sum(jaxgemm.fp8.dense(x, w, b, "relu", scaling=scaling).astype(jnp.float32) ** 2)
    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(x3, w, b)
    assert [g.dtype for g in grads] == [jnp.bfloat16] * 3 and grads[0].shape == x3.shape
    flat = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(x, w, b)  # (both jitted: the same fusions)
    np.testing.assert_array_equal(np.asarray(grads[0]).reshape(64, 256), np.asarray(flat[0]))
    mapped = jax.vmap(lambda x: jaxgemm.fp8.dense(x, w, b, scaling=scaling))(x3)
    np.testing.assert_array_equal(np.asarray(mapped), np.asarray(jaxgemm.fp8.dense(x3, w, b, scaling=scaling)))


@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
def test_backward_reads_z_in_the_output_dtype(activation):
    """bf16 outputs: the forward keeps what act'(z) needs in bf16 (z rounded once; y for
    relu; nothing without an activation), so dz = dy * act'(bf16(z)), as jaxgemm.dense's
    backward reads its aux. dbias (float32 here) is sum(dz) to float32's rounding."""
    x, w, _ = _layer(6, dtype=jnp.bfloat16)
    b = jnp.asarray(np.random.default_rng(7).standard_normal(128) / 10, jnp.float32)
    dy = jnp.asarray(np.random.default_rng(8).standard_normal((64, 128)), jnp.bfloat16)
    _, vjp = jax.vjp(lambda x, w, b: jaxgemm.fp8.dense(x, w, b, activation), x, w, b)
    db = vjp(dy)[2]
    rounded = jaxgemm.fp8.dense(x, w, b)  # the layer's own z, rounded once to bfloat16
    want = np.asarray(dy, np.float64) * np.asarray(jaxgemm.activations.derivative(activation, rounded), np.float64)
    assert db.dtype == jnp.float32 and _rel(db, want.sum(axis=0)) <= 1e-5


# (x, w, b) specs on a 4-device mesh "x" and the seed of each layer.
LAYOUTS = {
    "data parallel": ((P("x", None), P(), P()), 5),  # the scales of x^T and dz^T reduce over the split batch
    "column parallel": ((P(), P(None, "x"), P("x")), 9),  # dx: partial products over the split features
    # The forward's partial products over the split K, its epilogue after their sum; x's row
    # and w's column amax over the devices that split K.
    "row parallel": ((P(None, "x"), P("x", None), P()), 11),
}


@pytest.mark.skipif(len(jax.devices()) < 4, reason="needs 4 devices")
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_sharded_jit(name):
    """Under sharded jit: the same loss and gradients as one device, and no gather (the
    partial products and the scales' amax are all-reduced). A last-bit difference in dz
    (XLA's sharded gelu') may move a value across an e4m3 rounding boundary, a step of 1/16
    of it: 3e-4 in the data-parallel gradients measured."""
    specs, seed = LAYOUTS[name]
    x, w, b = _layer(seed)
    mesh = jax.make_mesh((4,), ("x",), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:4])
    loss = lambda x, w, b: jnp.sum(jaxgemm.fp8.dense(x, w, b, "gelu") ** 2)
    grad = jax.value_and_grad(loss, argnums=(0, 1, 2))
    jitted = jax.jit(grad, in_shardings=tuple(NamedSharding(mesh, spec) for spec in specs))
    (value, grads), (ref_value, ref_grads) = jitted(x, w, b), grad(x, w, b)
    hlo = jitted.lower(x, w, b).compile().as_text()
    assert "all-gather" not in hlo and "all-to-all" not in hlo
    assert _rel(value, ref_value) <= 1e-5
    for ours, theirs in zip(grads, ref_grads):
        assert _rel(ours, theirs) <= 2e-3


@pytest.mark.skipif(len(jax.devices()) < 4, reason="needs 4 devices")
@pytest.mark.parametrize("scaling", CURRENT_SCALINGS)
def test_e5m2_gradients_compose(scaling):
    """grad_format="e5m2" under vmap of grad and under data-parallel sharded jit: the
    unbatched, unsharded gradients, and no gather (whole 128-row blocks a device)."""
    x, w, b = _layer(12, m=512)
    loss = lambda x, w, b: jnp.sum(jaxgemm.fp8.dense(x, w, b, "gelu", scaling=scaling, grad_format="e5m2") ** 2)
    grad = jax.value_and_grad(loss, argnums=(0, 1, 2))
    value, grads = grad(x, w, b)
    mapped = jax.jit(jax.vmap(jax.grad(loss), in_axes=(0, None, None)))(x.reshape(2, 256, 256), w, b)
    for i, half in enumerate(jnp.split(x, 2)):
        assert _rel(mapped[i], jax.grad(loss)(half, w, b)) <= 1e-5
    mesh = jax.make_mesh((4,), ("x",), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:4])
    specs = (P("x", None), P(), P())
    jitted = jax.jit(grad, in_shardings=tuple(NamedSharding(mesh, spec) for spec in specs))
    sharded_value, sharded_grads = jitted(x, w, b)
    hlo = jitted.lower(x, w, b).compile().as_text()
    assert "all-gather" not in hlo and "all-to-all" not in hlo and "all-reduce" in hlo
    assert _rel(sharded_value, value) <= 1e-5
    for ours, theirs in zip(sharded_grads, grads):
        assert _rel(ours, theirs) <= 2e-3  # (as test_sharded_jit: a rounding step of dz)


@pytest.mark.skipif(len(jax.devices()) < 4, reason="needs 4 devices")
def test_data_parallel_explicit_mode():
    """The same on an Explicit mesh: the output typed split like x, the gradients typed
    like their primals (dw contracts the split batch: typed replicated, like w)."""
    x, w, b = _layer(8)
    mesh = jax.make_mesh((4,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,), devices=jax.devices()[:4])
    loss = lambda w, b, x: jnp.sum(jaxgemm.fp8.dense(x, w, b, "gelu") ** 2)
    ref_grads = jax.grad(loss, argnums=(0, 1))(w, b, x)
    with jax.set_mesh(mesh):
        put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))
        xs, ws, bs = put(x, P("data", None)), put(w, P()), put(b, P())
        y = jax.jit(lambda w, b, x: jaxgemm.fp8.dense(x, w, b))(ws, bs, xs)
        assert jax.typeof(y).sharding.spec == P("data", None)
        grads = jax.jit(jax.grad(loss, argnums=(0, 1)))(ws, bs, xs)
        for ours, theirs in zip(grads, ref_grads):
            assert jax.typeof(ours).sharding.spec in (P(), P(None), P(None, None))
            assert _rel(ours, theirs) <= 2e-3  # (as test_data_parallel_jit)


@pytest.mark.skipif(len(jax.devices()) < 4, reason="needs 4 devices")
def test_out_sharding():
    """out_sharding, as jaxgemm.dense takes it: on an Explicit mesh the result is typed (and
    resharded) as asked, a PartitionSpec resolved against the mesh; under an Auto mesh a
    NamedSharding constrains it. The values are the unsharded layer's."""
    x, w, b = _layer(9)
    want = jaxgemm.fp8.dense(x, w, b, "relu")
    explicit = jax.make_mesh((4,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,), devices=jax.devices()[:4])
    with jax.set_mesh(explicit):
        xs = jax.device_put(x, NamedSharding(explicit, P("data", None)))
        y = jax.jit(lambda x: jaxgemm.fp8.dense(x, w, b, "relu", out_sharding=P(None, "data")))(xs)
        assert jax.typeof(y).sharding.spec == P(None, "data")
        assert _rel(y, want) <= 1e-6
    auto = jax.make_mesh((4,), ("data",), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:4])
    spec = NamedSharding(auto, P(None, "data"))
    y = jax.jit(lambda x: jaxgemm.fp8.dense(x, w, b, "relu", out_sharding=spec))(x)
    assert y.sharding.is_equivalent_to(spec, 2) and _rel(y, want) <= 1e-6
    with pytest.raises(ValueError, match="needs a mesh"):
        jaxgemm.fp8.dense(x, w, b, out_sharding=P(None, "data"))


@pytest.mark.skipif(len(jax.devices()) < 4, reason="needs 4 devices")
@pytest.mark.parametrize("scaling", CURRENT_SCALINGS)
def test_grad_in_shard_map(scaling):
    """Inside shard_map (default checks) each device quantizes its own shard (its x^T and
    dz^T scales per feature over its rows). The gradient of the replicated w and b is the
    sum of the per-shard gradients (psummed by the varying cast's transpose, as for jnp's
    dots), not the one-device layer's."""
    x, w, b = _layer(7)
    mesh = jax.make_mesh((4,), ("data",), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:4])
    loss = lambda w, b, x: jnp.sum(jaxgemm.fp8.dense(x, w, b, "gelu", scaling=scaling) ** 2)
    local = jax.grad(loss, argnums=(0, 1))
    grads = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), P("data")), out_specs=(P(), P())))(w, b, x)
    shards = [jax.grad(loss, argnums=(0, 1))(w, b, part) for part in jnp.split(x, 4)]
    for ours, parts in zip(grads, zip(*shards)):
        assert _rel(ours, sum(np.asarray(p, np.float64) for p in parts)) <= 1e-5


@pytest.mark.parametrize("args, error, words", [
    (((8, 32), (16, 8)), ValueError, "x (..., K) and w (K, N)"),
    (((8, 32), (32, 8), (4,)), ValueError, "bias must have shape (8,)"),
])  # fmt: skip
def test_bad_shapes(args, error, words):
    arrays = [jnp.ones(s, jnp.float32) for s in args]
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        jaxgemm.fp8.dense(*arrays)


def test_bad_dtypes_and_forward_mode():
    x, w, b = _layer(6)
    with pytest.raises(TypeError, match="x must be a 16- or 32-bit float"):
        jaxgemm.fp8.dense(x.astype(jnp.float8_e4m3fn), w, b)
    with pytest.raises(TypeError, match="w must be a 16- or 32-bit float"):
        jaxgemm.fp8.dense(x, w.astype(jnp.int32), b)
    with pytest.raises(TypeError, match="forward-mode"):  # (a custom VJP: documented)
        jax.jvp(lambda x: jaxgemm.fp8.dense(x, w, b), (x,), (x,))


@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
def test_rowwise_forward_is_one_kernel(activation):
    """Where the fp8 kernel runs (a Hopper GPU, the CPU's FFI reference), the rowwise
    forward is one jaxgemm_gemm call that takes the e4m3 operands, both scales and the bias
    and returns y (and z for gelu): no float32 product, no XLA pass of scales, bias or
    activation after it."""
    _fp8_kernel_platform()
    x, w, b = _layer(10, dtype=jnp.bfloat16)
    hlo = jax.jit(lambda x, w, b: jaxgemm.fp8.dense(x, w, b, activation)).lower(x, w, b).compile().as_text()
    (call,) = _ffi_gemm_operands(hlo)
    assert call.count("f8e4m3fn[") == 2 and call.count("f32[1,64]") == 1 and call.count("f32[1,128]") == 1, call
    assert call.count("bf16[1,128]") == 1, call  # the bias, in the output's dtype
    results = [line for line in hlo.splitlines() if 'custom_call_target="jaxgemm_gemm"' in line][0].split("=")[1]
    assert results.count("bf16[1,64,128]") == (2 if activation == "gelu" else 1), results
    assert "f32[64,128]" not in hlo and "f32[1,64,128]" not in hlo


def test_rowwise_backward_keeps_fp8_copies_not_x():
    """Rowwise, the backward reads x^T and w quantized by the forward: the residuals hold
    x^T in e4m3 (1 byte a value), not x in its 16-bit type, beside w (a parameter), the
    bias and z."""
    x, w, b = _layer(12, dtype=jnp.bfloat16)
    _, vjp = jax.vjp(lambda x, w, b: jaxgemm.fp8.dense(x, w, b, "gelu"), x, w, b)
    kept = [(leaf.shape, jnp.dtype(leaf.dtype)) for leaf in jax.tree_util.tree_leaves(vjp) if hasattr(leaf, "shape")]
    assert (x.shape, jnp.dtype(x.dtype)) not in kept, kept
    assert (x.shape[::-1], jnp.dtype(jnp.float8_e4m3fn)) in kept, kept
    blockwise = jax.vjp(lambda x, w, b: jaxgemm.fp8.dense(x, w, b, "gelu", scaling="blockwise"), x, w, b)[1]
    assert (x.shape, jnp.dtype(x.dtype)) in [(leaf.shape, leaf.dtype) for leaf in jax.tree_util.tree_leaves(blockwise)]
