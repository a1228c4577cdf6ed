"""jaxgemm.fp8.dense(scaling="blockwise"): 1 x 128 blocks of x and dz, 128 x 128 tiles of w
(quantize_blocks, quantize_tiles); the layer's forward and straight-through gradient
against float64 products of the same quantized operands (the CPU's FFI reference, or the
block-scaled kernel on a Hopper GPU) and against the unquantized layer; the rowwise
fallback where a contraction is not a multiple of 128; where the block-scaled kernel runs;
sharded jit; bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from test_block_scaled import BLOCK_KERNEL_BOUND
from test_fp8 import QUANTIZATION_BOUND, _rel
from test_fp8 import _layer as _rowwise_layer
from test_scaled import FP8_KERNEL_BOUND, _hopper

import jaxgemm
from jaxgemm.fp8 import E4M3_MAX, quantize_blocks, quantize_rows, quantize_tiles
from jaxgemm.scaled import GROUPS_ON_CUDA_VARIABLE


def _layer(seed, m=256, k=256, n=384, dtype=jnp.float32):
    return _rowwise_layer(seed, m, k, n, dtype)


def _values64(q, s):
    """float64 values of quantized (R, K) operands with scales (R, KB)."""
    q, s = np.asarray(q.astype(jnp.float32), np.float64), np.asarray(s, np.float64)
    return q * np.repeat(s, q.shape[1] // s.shape[1], axis=1)


def _product64(a, b, b_is_weight=False):
    """a (M, K) @ b (N, K)^T of blockwise-quantized operands (rowwise where K is not a
    multiple of 128), in float64."""
    if a.shape[1] % 128:
        return _values64(*quantize_rows(a)) @ _values64(*quantize_rows(b)).T
    qb = quantize_tiles(b) if b_is_weight else quantize_blocks(b)
    return _values64(*quantize_blocks(a)) @ _values64(*qb).T


def _bound():
    return BLOCK_KERNEL_BOUND if _hopper() else 1e-5


def test_quantize_blocks_and_tiles():
    """Each 1 x 128 block (each 128 x 128 tile, the last row tile shorter) has its largest
    magnitude at 448; the scales come repeated over a tile's rows, as scaled_matmul takes
    them; values round by at most 1/16 of themselves."""
    x = jnp.asarray(np.random.default_rng(0).standard_normal((3, 384)) * np.logspace(-3, 3, 384), jnp.float32)
    q, s = quantize_blocks(x)
    assert q.shape == (3, 384) and s.shape == (3, 3)
    np.testing.assert_array_equal(np.abs(np.asarray(q.astype(jnp.float32))).reshape(3, 3, 128).max(-1), E4M3_MAX)
    w = jnp.asarray(np.random.default_rng(1).standard_normal((200, 256)), jnp.float32)
    qw, sw = quantize_tiles(w)
    assert qw.shape == (200, 256) and sw.shape == (200, 2)
    np.testing.assert_array_equal(sw[:128], np.broadcast_to(sw[0], (128, 2)))
    np.testing.assert_array_equal(sw[128:], np.broadcast_to(sw[128], (72, 2)))
    tile_max = np.abs(np.asarray(qw.astype(jnp.float32)))[128:, 128:].max()
    assert tile_max == E4M3_MAX
    back, wf = _values64(qw, sw), np.asarray(w, np.float64)
    normal = np.abs(np.asarray(qw.astype(jnp.float32))) >= 2.0**-6
    assert np.all(np.abs(back - wf)[normal] <= np.abs(wf)[normal] / 16 * (1 + 1e-6))


def test_tile_scales_in_either_form():
    """scaled_matmul on quantize_tiles's weights gives the same product whether their scales
    come repeated over each tile's rows or in the tiled form (one row per tile)."""
    x = jnp.asarray(np.random.default_rng(2).standard_normal((40, 256)), jnp.float32)
    w = jnp.asarray(np.random.default_rng(3).standard_normal((200, 256)), jnp.float32)
    (qx, sx), (qw, sw) = quantize_blocks(x), quantize_tiles(w)
    rows = jaxgemm.scaled_matmul(qx[None], qw[None], sx[None], sw[None])
    tiles = jaxgemm.scaled_matmul(qx[None], qw[None], sx[None], sw[None, ::128])
    np.testing.assert_allclose(tiles, rows, rtol=1e-6, atol=0)


def test_forward_and_gradient():
    """y = gelu(x @ w + b) and dx, dw, db from the blockwise-quantized products, and within
    e4m3's rounding of the unquantized layer (measured on the CPU: y 3.8e-2, dx 4.7e-2, dw
    4.6e-2, db 3.0e-2; rowwise scaling's the same within 5 %)."""
    x, w, b = _layer(2)
    dy = jnp.asarray(np.random.default_rng(3).standard_normal((256, 384)), jnp.float32)
    layer = lambda x, w, b: jaxgemm.fp8.dense(x, w, b, "gelu", scaling="blockwise")
    y, vjp = jax.vjp(layer, x, w, b)
    dx, dw, db = vjp(dy)
    z = _product64(x, w.T, b_is_weight=True) + np.asarray(b, np.float64)
    assert _rel(y, jax.nn.gelu(jnp.asarray(z))) <= _bound()
    # dz from the layer's own z (test_fp8.test_gradient_is_straight_through says why).
    dz = dy * jaxgemm.activations.derivative("gelu", jaxgemm.fp8.dense(x, w, b, scaling="blockwise"))
    assert _rel(dx, _product64(dz, w, b_is_weight=True)) <= _bound()
    assert _rel(dw, _product64(x.T, dz.T)) <= _bound()
    assert _rel(db, np.asarray(dz, np.float64).sum(axis=0)) <= 1e-5
    exact_fn = lambda x, w, b: jax.nn.gelu(jnp.dot(x, w, precision="highest") + b)
    exact_y, exact_vjp = jax.vjp(exact_fn, x, w, b)
    for ours, theirs in zip((y, dx, dw, db), (exact_y, *exact_vjp(dy))):
        assert _rel(ours, theirs) <= QUANTIZATION_BOUND


def test_rowwise_where_blocks_do_not_fit():
    """A batch of 64 rows: dw's contraction (the batch) is scaled rowwise, the rest blockwise."""
    x, w, b = _layer(4, m=64)
    dy = jnp.ones((64, 384), jnp.float32)
    dw = jax.vjp(lambda w: jaxgemm.fp8.dense(x, w, b, scaling="blockwise"), w)[1](dy)[0]
    assert _rel(dw, _product64(x.T, dy.T)) <= (FP8_KERNEL_BOUND if _hopper() else 1e-5)


def test_runs_on_the_block_scaled_kernel(monkeypatch):
    """On a Hopper GPU (or the CPU's FFI reference) the forward's one product and the
    backward's two are block-scaled kernel calls; the two that read w take its scales one
    per 64 rows (its 128 x 128 tiles), dw per row."""
    platform = jax.default_backend().replace("gpu", "cuda")
    if platform == "cuda" and not _hopper() or platform == "cpu" and jaxgemm.xla_cpu.enabled("cpu"):
        pytest.skip("no block-scaled kernel here")
    monkeypatch.setenv(GROUPS_ON_CUDA_VARIABLE, "1")
    x, w, b = _layer(5, dtype=jnp.bfloat16)
    loss = lambda x, w: jnp.sum(jaxgemm.fp8.dense(x, w, b, "gelu", scaling="blockwise").astype(jnp.float32))
    hlo = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(x, w).compile().as_text()
    calls = [line for line in hlo.splitlines() if 'custom_call_target="jaxgemm_block_scaled_gemm"' in line]
    assert len(calls) == 3
    assert sorted("b_scale_rows = 64" in call for call in calls) == [False, True, True], calls


COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


def _collectives(hlo):
    return {op: sum(f" {op}(" in line or f" {op}-start(" in line for line in hlo.splitlines()) for op in COLLECTIVES}


# (x, w, b) specs on a 4-device mesh "x", and the layer's sizes: each shard's batch (data
# parallel) or features (column parallel) whole 128-blocks and tiles.
LAYOUTS = {
    "data parallel": ((P("x", None), P(), P()), dict(m=512)),
    "column parallel": ((P(), P(None, "x"), P("x")), dict(m=512, n=512)),
}


@pytest.mark.skipif(len(jax.devices()) < 4, reason="needs 4 devices")
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_sharded_jit(name):
    """The same loss and gradients as one device, and the collectives of jnp's layer under
    the same shardings (one all-reduce, into which XLA combines the loss, dw and db or
    dx's partial sums): every block's amax is local, where rowwise scaling all-reduces
    the amax of the rows it splits."""
    specs, sizes = LAYOUTS[name]
    x, w, b = _layer(6, **sizes)
    mesh = jax.make_mesh((4,), ("x",), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:4])
    shardings = tuple(NamedSharding(mesh, spec) for spec in specs)
    loss = lambda x, w, b: jnp.sum(jaxgemm.fp8.dense(x, w, b, "gelu", scaling="blockwise") ** 2)
    grad = jax.value_and_grad(loss, argnums=(0, 1, 2))
    jitted = jax.jit(grad, in_shardings=shardings)
    (value, grads), (ref_value, ref_grads) = jitted(x, w, b), grad(x, w, b)
    assert _rel(value, ref_value) <= 1e-5
    for ours, theirs in zip(grads, ref_grads):
        assert _rel(ours, theirs) <= 2e-3  # (test_fp8.test_sharded_jit: e4m3 steps of dz)
    jnp_loss = lambda x, w, b: jnp.sum(jax.nn.gelu(x @ w + b) ** 2)
    jnp_hlo = jax.jit(jax.value_and_grad(jnp_loss, argnums=(0, 1, 2)), in_shardings=shardings).lower(x, w, b)
    expected = _collectives(jnp_hlo.compile().as_text())
    assert _collectives(jitted.lower(x, w, b).compile().as_text()) == expected == {**dict.fromkeys(COLLECTIVES, 0),
                                                                                  "all-reduce": 1}


@pytest.mark.skipif(len(jax.devices()) < 4, reason="needs 4 devices")
def test_column_shards_off_the_tiles_are_gathered():
    """Column shards of 96 features cut w's 128 x 128 tiles: XLA gathers w for its
    quantization (a documented limit), and the values stay right."""
    x, w, b = _layer(6, m=512)  # n = 384: 96 a shard
    mesh = jax.make_mesh((4,), ("x",), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:4])
    shardings = tuple(NamedSharding(mesh, spec) for spec in (P(), P(None, "x"), P("x")))
    loss = lambda x, w, b: jnp.sum(jaxgemm.fp8.dense(x, w, b, "gelu", scaling="blockwise") ** 2)
    grad = jax.grad(loss, argnums=(0, 1, 2))
    jitted = jax.jit(grad, in_shardings=shardings)
    assert _collectives(jitted.lower(x, w, b).compile().as_text())["all-gather"] > 0
    for ours, theirs in zip(jitted(x, w, b), grad(x, w, b)):
        assert _rel(ours, theirs) <= 2e-3


def test_bad_scaling():
    x, w, b = _layer(7, m=8)
    with pytest.raises(ValueError, match="scaling must be one of"):
        jaxgemm.fp8.dense(x, w, b, scaling="tensorwise")
