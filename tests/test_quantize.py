"""jaxgemm.quantize: a matrix (or a layer's dz = dy * act'(at)) quantized to e4m3 (or e5m2) in both
orientations by the two passes (amax, then q and qt), against jnp's per-row quantizer on
the matrix and its transpose: the kernels where the shape fits (rows % 16, columns % 8),
jnp elsewhere; NaN and zero rows; sharded jit (amax all-reduces only); vmap; bad input.
Then the single passes: blockwise (1 x 128 blocks or 128 x 128 tiles), and per-tensor with
a given scale (delayed scaling's, which also writes the amax and the column sums)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxgemm import activations, xla_cpu
from jaxgemm.fp8 import quantize_blocks, quantize_rows, quantize_tiles
from jaxgemm.quantize import _blockwise_jnp, quantize_blocks_both, quantize_both, quantize_tensor, to_fp8


def _on_host(f, *args):
    """f(*args) run by XLA's CPU backend: the references are IEEE there (1 / scale rounded
    once, one rounding to e4m3), as the kernels are; XLA's GPU code can land a value that
    sits on an e4m3 rounding tie one step away (seen on an H100)."""
    return jax.jit(f)(*jax.device_put(args, jax.devices("cpu")[0]))


def _want(s):
    """jnp's quantizer on s (float32) and on s^T."""
    return _on_host(lambda s: quantize_rows(s) + quantize_rows(s.T), s)


def _check_dbias(got, dz, activation, dtype):
    """The column sums of dz against float64's, within a few float32 roundings of the sum of
    |dz| (a column's sum may cancel to near zero); where a GPU approximates act' for a 16-bit
    source (_nearly), within 1e-3 of it per value."""
    approximated = jax.default_backend() == "gpu" and dtype != jnp.float32 and activation not in (None, "relu")
    dz = np.asarray(dz, np.float64)
    bound = (1e-3 if approximated else 1e-5) * np.abs(dz).sum(axis=0) + 1e-5
    assert np.all(np.abs(np.asarray(got, np.float64) - dz.sum(axis=0)) <= bound)


def test_tiny_amax_scales_no_zero_into_nan():
    """A row, column or block whose largest magnitude is below 448 x float32's smallest
    normal (~5e-36) has the smallest normal as its scale: 1 / scale stays finite, so its
    zeros stay zero (they were NaN) and its values come back as well as e4m3 keeps them."""
    x = np.zeros((256, 256), np.float32)
    x[:, 0] = x[0, :] = 1e-37
    x[5, 9] = -3e-38
    for quantize in (quantize_both, quantize_blocks_both):
        q, qs, qt, qts = jax.jit(quantize)(jnp.asarray(x, jnp.bfloat16))
        for values, scales, ref in ((q, qs, x), (qt, qts, x.T)):
            values = np.asarray(values, np.float32)
            assert not np.isnan(values).any() and np.all(values[ref == 0] == 0)
            scale = np.repeat(np.asarray(scales, np.float32), values.shape[1] // scales.shape[1], axis=1)
            assert np.abs(values * scale - ref).max() <= 0.07 * 1e-37


def test_e5m2():
    """dtype=float8_e5m2 (fp8.dense's grad_format="e5m2") in the gradient's form: the two
    passes and the block pass against the e5m2 quantizers' values and scales."""
    rng = np.random.default_rng(12)
    dy, at = (jnp.asarray(rng.standard_normal((256, 128)), jnp.float32) for _ in range(2))
    dz = dy * activations.derivative("gelu", at)
    e5m2 = jnp.float8_e5m2
    got = jax.jit(lambda dy, at: quantize_both(dy, at, "gelu", dtype=e5m2))(dy, at)
    want = quantize_rows(dz, e5m2) + quantize_rows(dz.T, e5m2)
    blocks = jax.jit(lambda dy, at: quantize_blocks_both(dy, at, "gelu", dtype=e5m2))(dy, at)
    want_blocks = quantize_blocks(dz, dtype=e5m2) + quantize_blocks(dz.T, dtype=e5m2)
    for g, w in zip(got + blocks, want + want_blocks):  # (act' in and outside the pass: a rounding apart)
        assert g.dtype == w.dtype and g.shape == w.shape
        values = g.dtype == e5m2
        g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
        if values:
            assert np.mean(g != w) <= 2e-3 and np.linalg.norm(g - w) <= 1e-2 * np.linalg.norm(w)
        else:
            np.testing.assert_allclose(g, w, rtol=1e-5)


def _e5m2_values(shape, seed):
    """float32 values over e5m2's whole range at scale 1 / 64: subnormals (below 2^-14 x
    scale), normals, some beyond 57344 x scale (saturated), a zero row. (No NaN: XLA's CPU
    max drops it in long rows, so jnp's reference would; test_nan_and_zero_rows has one.)"""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-22, 12, shape)).astype(np.float32)
    x[2] = 0.0
    return jnp.asarray(x, jnp.float32)


@pytest.mark.parametrize("shape", [(256, 384), (17, 24)])  # the last: jnp
def test_e5m2_passes_match_jnp_bit_for_bit(shape):
    """The kernels' e5m2 (cvt's rounding and saturation; the CPU reference's own
    conversion) as jnp's e5m2 quantizer: both passes, and the single pass with a given scale."""
    e5m2 = jnp.float8_e5m2
    x = _e5m2_values(shape, shape[0])
    both = jax.jit(lambda x: quantize_both(x, dtype=e5m2))
    on_kernel = shape[0] % 16 == 0 and not xla_cpu.enabled(jax.default_backend())
    assert ("jaxgemm_fp8_quantize" in both.lower(x).as_text()) == on_kernel
    got = both(x)
    _exact(got, _on_host(lambda s: quantize_rows(s, e5m2) + quantize_rows(s.T, e5m2), x))
    scale = jnp.float32(1 / 64)
    got = jax.jit(lambda x: quantize_tensor(x, scale, dtype=e5m2))(x)
    want = _on_host(lambda s: (to_fp8(s, scale, e5m2), to_fp8(s.T, scale, e5m2), jnp.max(jnp.abs(s))), x)
    _exact(got, want)
    q = np.asarray(got[0], np.float32)
    assert np.nanmax(q) == 57344.0 and np.any((q != 0) & (np.abs(q) < 2.0**-14))  # (saturated; subnormals)


@pytest.mark.parametrize("tiles", [False, True])
def test_e5m2_blocks_match_jnp_bit_for_bit(tiles):
    """The block pass in e5m2 (its scales amax / 57344) as jnp's definition."""
    e5m2 = jnp.float8_e5m2
    x = _e5m2_values((256, 384), 7)
    blocks = jax.jit(lambda x: quantize_blocks_both(x, tiles=tiles, dtype=e5m2))
    assert ("jaxgemm_fp8_block_quantize" in blocks.lower(x).as_text()) == (not xla_cpu.enabled(jax.default_backend()))
    _exact(blocks(x), _on_host(lambda s: _blockwise_jnp(s, tiles, e5m2), x))


def _exact(got, want):
    """Equal values (NaN where NaN; -0 and +0 alike: XLA may turn dy * relu'(at) into a select)."""
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(w, np.float32))


def _nearly(got, want):
    """act' computed otherwise than jnp's autodiff of the activation (the kernels' closed
    forms; on a GPU, approximated for 16-bit sources, as bias_act_grad's): the scales within
    a few float32 roundings (bfloat16's on a GPU), a rare e4m3 value one step off."""
    for g, w in zip(got, want):
        e4m3 = g.dtype == jnp.float8_e4m3fn
        g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
        if e4m3:
            assert np.mean(g != w) <= 2e-3 and np.linalg.norm(g - w) <= 1e-2 * np.linalg.norm(w)
        else:
            np.testing.assert_allclose(g, w, rtol=1e-2 if jax.default_backend() == "gpu" else 1e-5)


@pytest.mark.parametrize("shape", [(256, 384), (48, 40), (130, 72), (17, 24)])  # the last two: jnp
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_both_orientations_match_the_row_quantizer(shape, dtype):
    x = jnp.asarray(np.random.default_rng(shape[0]).standard_normal(shape) * 3, dtype)
    q, rs, qt, cs = jax.jit(quantize_both)(x)
    _exact((q, rs, qt, cs), _want(x.astype(jnp.float32)))


# Each activation is a kernel instance of its own on a GPU (source.cuh, WithQuantizeSource).
ACTIVATIONS = [None, "relu", "gelu", "gelu_exact", "silu", "sigmoid", "tanh"]


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_the_gradient_form(activation, dtype):
    """dz = dy * act'(at), quantized both ways, and its column sums (dbias), never written."""
    rng = np.random.default_rng(1)
    dy = jnp.asarray(rng.standard_normal((144, 200)), dtype)
    at = jnp.asarray(rng.standard_normal((144, 200)), dtype) if activation else None
    got = jax.jit(lambda dy, at: quantize_both(dy, at, activation, want_sum=True))(dy, at)
    dz = dy.astype(jnp.float32) * (activations.derivative(activation, at) if activation else 1.0)
    check = _exact if activation in (None, "relu") else _nearly
    check(got[:4], _want(dz))
    _check_dbias(got[4], dz, activation, dtype)


def test_nan_and_zero_rows():
    """A NaN is its row's and column's amax (as in jnp.max), which scales_of maps to 1 as it
    maps a zero row's; the NaN stays NaN in q and qt. As jnp's quantizer, bit for bit."""
    x = np.random.default_rng(2).standard_normal((32, 16)).astype(np.float32)
    x[3, 5] = np.nan
    x[7] = 0.0
    q, rs, qt, cs = quantize_both(jnp.asarray(x))
    assert rs[3, 0] == 1.0 and cs[5, 0] == 1.0 and rs[7, 0] == 1.0
    assert np.isnan(np.asarray(q, np.float32)[3, 5]) and np.isnan(np.asarray(qt, np.float32)[5, 3])
    assert np.sum(np.isnan(np.asarray(q, np.float32))) == 1 and np.all(np.asarray(q[7], np.float32) == 0)
    _exact((q, rs, qt, cs), _want(jnp.asarray(x)))


def _sharded_like_one_device(quantize, shape, spec, seed):
    """quantize(dy, at) under jit with dy and at placed by `spec` on a 2 x 2 mesh against one
    device: the same e4m3 copies and scales, the column sums within float32 rounding, and
    no collective that moves the matrix (all-gather, all-to-all, collective-permute).
    Returns the compiled HLO."""
    devices = np.array(jax.devices()[:4])
    if devices.size < 4:
        pytest.skip("needs 4 devices")
    mesh = jax.sharding.Mesh(devices.reshape(2, 2), ("x", "y"))
    rng = np.random.default_rng(seed)
    dy, at = (jnp.asarray(rng.standard_normal(shape), jnp.float32) for _ in range(2))
    f = jax.jit(quantize)
    want = f(dy, at)
    placed = [jax.device_put(a, NamedSharding(mesh, spec)) for a in (dy, at)]
    got = f(*placed)
    _exact(got[:4], want[:4])
    np.testing.assert_allclose(np.asarray(got[4]), np.asarray(want[4]), rtol=1e-5, atol=1e-5)
    hlo = f.lower(*placed).compile().as_text()
    assert "all-gather" not in hlo and "all-to-all" not in hlo and "collective-permute" not in hlo
    return hlo


@pytest.mark.parametrize("spec", [P("x", None), P(None, "x"), P("x", "y")])
def test_sharded_matches_one_device_with_amax_all_reduces_only(spec):
    """Rows and columns split: every scale is the whole matrix's (all-reduced amax vectors),
    the quantized copies are split as x is (qt transposed), and nothing gathers x."""
    hlo = _sharded_like_one_device(lambda dy, at: quantize_both(dy, at, "gelu", want_sum=True), (256, 128), spec, 3)
    assert "all-reduce" in hlo


def test_vmap_matches_each_matrix():
    x = jnp.asarray(np.random.default_rng(4).standard_normal((3, 32, 24)), jnp.float32)
    got = jax.vmap(quantize_both)(x)
    for i in range(3):
        _exact([g[i] for g in got], quantize_both(x[i]))


@pytest.mark.parametrize("call, results, words", [
    ("jaxgemm_fp8_amax", [(32,), (24,), (3, 24)], r"col_partials must be float32 \(1, cols\)"),
    ("jaxgemm_fp8_quantize", [(32, 24), (32, 24), (0,), (0,)], r"q \(rows, cols\) and qt \(cols, rows\)"),
    ("jaxgemm_fp8_quantize", [(32, 24), (24, 32), (2,), (0,)], r"amax must be float32 \(1,\)"),
    ("jaxgemm_fp8_quantize", [(32, 24), (24, 32), (1,), (2, 24)], r"col_partials must be float32 \(1, cols\)"),
    ("jaxgemm_fp8_block_quantize", [(32, 24)] * 4 + [(0,)], "multiples of 128"),
])  # fmt: skip
def test_ffi_contract(call, results, words):
    """The handlers' contract (ffi_src/ffi/fp8_quantize_decode.h): a wrong buffer is an error
    that names the call and x's shape, not a kernel launch (on the CPU's FFI reference)."""
    if jax.default_backend() != "cpu" or xla_cpu.enabled("cpu"):
        pytest.skip("the CPU's FFI handlers")
    x = jnp.ones((32, 24), jnp.float32)
    types = {"jaxgemm_fp8_amax": [jnp.float32] * 3, "jaxgemm_fp8_quantize": [jnp.float8_e4m3fn] * 2 + [jnp.float32] * 2,
             "jaxgemm_fp8_block_quantize": [jnp.float8_e4m3fn, jnp.float32] * 2 + [jnp.float32]}[call]  # fmt: skip
    out = [jax.ShapeDtypeStruct(shape, t) for shape, t in zip(results, types)]
    args = [x, jnp.zeros((0,), jnp.float32)] + ([jnp.ones(32), jnp.ones(24)] if call == "jaxgemm_fp8_quantize" else [])
    attrs = {"tiles": False} if call == "jaxgemm_fp8_block_quantize" else {}
    with pytest.raises(Exception, match=words + r".*\(x\(32, 24\)\)"):
        jax.block_until_ready(jax.ffi.ffi_call(call, out)(*args, activation=np.int64(0), **attrs))


def test_ffi_contract_takes_one_fp8_format():
    """q and qt in one format (e4m3, or both e5m2): a mix, or a 16-bit q, is a named error."""
    if jax.default_backend() != "cpu" or xla_cpu.enabled("cpu"):
        pytest.skip("the CPU's FFI handlers")
    x = jnp.ones((32, 24), jnp.float32)
    args = [x, jnp.zeros((0,), jnp.float32), jnp.ones(32), jnp.ones(24)]
    for q_type, qt_type in ((jnp.float8_e4m3fn, jnp.float8_e5m2), (jnp.bfloat16, jnp.bfloat16)):
        out = [jax.ShapeDtypeStruct((32, 24), q_type), jax.ShapeDtypeStruct((24, 32), qt_type)]
        out += [jax.ShapeDtypeStruct((0,), jnp.float32)] * 2
        with pytest.raises(Exception, match=r"float8_e4m3fn, or both float8_e5m2.*\(x\(32, 24\)\)"):
            jax.block_until_ready(jax.ffi.ffi_call("jaxgemm_fp8_quantize", out)(*args, activation=np.int64(0)))


def test_bad_input_is_named():
    with pytest.raises(ValueError, match=r"needs x \(R, C\).*x\(2, 3, 4\)"):
        quantize_both(jnp.ones((2, 3, 4)))
    with pytest.raises(ValueError, match="dtype must be float8_e4m3fn or float8_e5m2, got bfloat16"):
        quantize_tensor(jnp.ones((16, 8)), 1.0, dtype=jnp.bfloat16)
    with pytest.raises(ValueError, match=r"at\(3, 2\)"):
        quantize_both(jnp.ones((2, 3)), jnp.ones((3, 2)), "gelu")


def test_inside_shard_map_each_device_has_its_own_scales():
    """Inside shard_map the passes see one device's rows: its column amax (qt's scales) are
    its own, as jnp's quantizer on that shard gives them."""
    if len(jax.devices()) < 4:
        pytest.skip("needs 4 devices")
    mesh = jax.make_mesh((4,), ("data",), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:4])
    x = jnp.asarray(np.random.default_rng(8).standard_normal((256, 64)) * np.arange(1, 257)[:, None], jnp.float32)
    per_shard = jax.jit(jax.shard_map(lambda x: tuple(g[None] for g in quantize_both(x)), mesh=mesh,
                                      in_specs=P("data"), out_specs=(P("data"),) * 4))(x)  # fmt: skip
    for d in range(4):
        _exact([g[d] for g in per_shard], _want(x[64 * d: 64 * (d + 1)]))


# Blockwise, one pass: 1 x 128 blocks along each orientation's last dim, or 128 x 128 tiles.


def _want_blocks(s, tiles):
    """jnp's block (tile) quantizer on s (float32) and on s^T."""
    quantize = quantize_tiles if tiles else quantize_blocks
    return _on_host(lambda s: quantize(s) + quantize(s.T), s)


@pytest.mark.parametrize("shape", [(256, 384), (128, 128)])
@pytest.mark.parametrize("tiles", [False, True])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_blocks_both_ways_match_the_block_quantizers(shape, tiles, dtype):
    x = np.random.default_rng(shape[1]).standard_normal(shape) * np.logspace(-3, 3, shape[1])
    x = jnp.asarray(x, dtype)
    got = jax.jit(lambda x: quantize_blocks_both(x, tiles=tiles))(x)
    _exact(got, _want_blocks(x.astype(jnp.float32), tiles))


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_blocks_in_the_gradient_form(activation, dtype):
    rng = np.random.default_rng(5)
    dy = jnp.asarray(rng.standard_normal((256, 128)), dtype)
    at = jnp.asarray(rng.standard_normal((256, 128)), dtype) if activation else None
    got = jax.jit(lambda dy, at: quantize_blocks_both(dy, at, activation, want_sum=True))(dy, at)
    dz = dy.astype(jnp.float32) * (activations.derivative(activation, at) if activation else 1.0)
    (_exact if activation in (None, "relu") else _nearly)(got[:4], _want_blocks(dz, False))
    _check_dbias(got[4], dz, activation, dtype)


@pytest.mark.parametrize("spec", [P("x", None), P(None, "x"), P("x", "y")])
def test_blocks_sharded_on_whole_blocks(spec):
    """Split on whole blocks, every block is one device's: no collective but the column
    sums' all-reduce over the split rows."""
    _sharded_like_one_device(lambda dy, at: quantize_blocks_both(dy, at, "gelu", want_sum=True), (512, 256), spec, 6)


def test_blocks_vmap_and_bad_input():
    x = jnp.asarray(np.random.default_rng(7).standard_normal((2, 128, 256)), jnp.float32)
    got = jax.vmap(lambda x: quantize_blocks_both(x, tiles=True))(x)
    for i in range(2):
        _exact([g[i] for g in got], quantize_blocks_both(x[i], tiles=True))
    with pytest.raises(ValueError, match=r"multiples of 128.*x\(100, 128\)"):
        quantize_blocks_both(jnp.ones((100, 128)))


# Per-tensor, one pass with a given scale: q, qt, the tensor's amax [, column sums].


def _want_tensor(s, scale):
    """jnp's definition on s (float32): q, qt and the amax."""
    return _on_host(lambda s: (to_fp8(s, scale), to_fp8(s.T, scale), jnp.max(jnp.abs(s))), s)


@pytest.mark.parametrize("shape", [(256, 384), (48, 40), (130, 72), (17, 24)])  # the last two: jnp
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_tensor_with_a_given_scale(shape, dtype):
    """Values beyond 448 x scale saturate (a stale history's clipping), the rest round."""
    x = jnp.asarray(np.random.default_rng(shape[1]).standard_normal(shape) * 5, dtype)
    scale = jnp.float32(0.03)  # (|x| up to ~20 > 448 x 0.03 = 13.4: some saturate)
    got = jax.jit(quantize_tensor)(x, scale)
    want = _want_tensor(x.astype(jnp.float32), scale)
    if jax.default_backend() == "gpu" and (shape[0] % 16 or shape[1] % 8):
        # jnp on a GPU (seen on an H200, bfloat16 x): more values than _nearly allows a
        # step away from XLA's CPU rounding, none further.
        for g, w in zip(got[:2], want[:2]):
            g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
            assert np.mean(g != w) <= 0.02 and np.all(np.abs(g - w) <= np.abs(w) / 8 + 2.0**-9)
        np.testing.assert_array_equal(got[2], want[2])
    else:
        _exact(got, want)
    assert np.asarray(got[0], np.float32).max() == 448.0


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_tensor_in_the_gradient_form(activation, dtype):
    rng = np.random.default_rng(9)
    dy = jnp.asarray(rng.standard_normal((144, 200)), dtype)
    at = jnp.asarray(rng.standard_normal((144, 200)), dtype) if activation else None
    got = jax.jit(lambda dy, at: quantize_tensor(dy, 0.004, at, activation, want_sum=True))(dy, at)
    dz = dy.astype(jnp.float32) * (activations.derivative(activation, at) if activation else 1.0)
    (_exact if activation in (None, "relu") else _nearly)(got[:3], _want_tensor(dz, jnp.float32(0.004)))
    _check_dbias(got[3], dz, activation, dtype)


def test_tensor_nan_is_its_amax():
    x = np.random.default_rng(3).standard_normal((32, 16)).astype(np.float32)
    x[3, 5] = np.nan
    q, qt, amax = quantize_tensor(jnp.asarray(x), 1.0)
    assert np.isnan(amax) and np.isnan(np.asarray(q, np.float32)[3, 5]) and np.isnan(np.asarray(qt, np.float32)[5, 3])


@pytest.mark.parametrize("spec", [P("x", None), P(None, "x"), P("x", "y")])
def test_tensor_sharded_all_reduces_the_amax_only(spec):
    """Split any way, the amax is the whole tensor's (one all-reduce of a scalar, and the
    column sums' over split rows), q and qt split as x is; nothing gathers x."""
    def quantize(dy, at):  # (the amax twice, so that the helper's 4 exact outputs hold it)
        q, qt, amax, sums = quantize_tensor(dy, 0.01, at, "gelu", want_sum=True)
        return q, qt, amax, amax, sums

    hlo = _sharded_like_one_device(quantize, (256, 128), spec, 10)
    assert "all-reduce" in hlo
