"""The GEMM epilogue's operand table (ffi_src/gemm/problem.h, kernels.EPILOGUE_OPERANDS): the
jaxgemm_gemm call takes the operands after a and b in table order, checks each against its
shape, and gives every one its batch strides; call_gemm_ffi passes them by name."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgemm
from jaxgemm.activations import activation_id
from jaxgemm.gemm import GemmConfig, call_gemm_ffi
from jaxgemm.kernels import EPILOGUE_OPERAND_DTYPES, EPILOGUE_OPERANDS
from reference import ACTIVATIONS, random, rel_error, to64
from test_scaled import _fp8_kernel_platform


def test_the_table_as_python_reads_it():
    assert list(EPILOGUE_OPERANDS.items()) == [("c", "matrix"), ("bias", "columns"), ("residual", "matrix"),
                                               ("row_scale", "rows"), ("col_scale", "columns")]  # fmt: skip
    assert [name for name, t in EPILOGUE_OPERAND_DTYPES.items() if t == "float32"] == ["row_scale", "col_scale"]


@pytest.mark.parametrize("names", [(), ("c",), ("bias",), ("residual",), ("c", "bias", "residual")])
def test_operands_by_name_with_broadcast_batches(names):
    """Each operand reaches its step: out = alpha a b + beta c + bias + residual, with a batch
    of 3 that the bias and c broadcast along (stride 0) and the residual carries. (The
    scales, which fp8 products take: test_fp8_products_take_the_epilogue.)"""
    rng = np.random.default_rng(len(names))
    a, b = random(rng, (3, 5, 7), jnp.float32), random(rng, (3, 7, 6), jnp.float32)
    shapes = {"c": (1, 5, 6), "bias": (1, 6), "residual": (3, 5, 6)}
    operands = {name: random(rng, shapes[name], jnp.float32) for name in names}
    config = GemmConfig(alpha=0.5, out_dtype=jnp.dtype(jnp.float32))
    out, _ = call_gemm_ffi(a, b, config=config, out_shape=(3, 5, 6), beta=2.0, **operands)
    want = 0.5 * to64(a) @ to64(b)
    if "c" in operands:
        want = want + 2.0 * to64(operands["c"])
    if "bias" in operands:
        want = want + to64(operands["bias"])[:, None, :]
    if "residual" in operands:
        want = want + to64(operands["residual"])
    assert rel_error(out, want) <= 1e-5


def test_unknown_operand_names_the_table():
    with pytest.raises(TypeError, match=r"no epilogue operand \['scale'\].*'c', 'bias', 'residual'"):
        call_gemm_ffi(jnp.ones((2, 3)), jnp.ones((3, 4)), config=GemmConfig(), out_shape=(2, 4), scale=jnp.ones(2))


@pytest.mark.parametrize("name, shape, words", [
    ("bias", (5,), r"bias has shape \(5,\)"),
    ("c", (4, 2), r"c has shape \(4, 2\)"),
    ("residual", (2,), r"residual has shape \(2,\)"),
])  # fmt: skip
def test_misshapen_operand_is_named(name, shape, words):
    a, b = jnp.ones((2, 3)), jnp.ones((3, 4))
    with pytest.raises(Exception, match=words):
        jax.block_until_ready(call_gemm_ffi(a, b, config=GemmConfig(), out_shape=(2, 4), **{name: jnp.ones(shape)}))


def test_the_call_counts_its_operand_buffers():
    """A call with fewer buffers than the table has rows is refused, not misread."""
    a, b = jnp.ones((2, 3)), jnp.ones((3, 4))
    out = (jax.ShapeDtypeStruct((2, 4), jnp.float32), jax.ShapeDtypeStruct((0,), jnp.float32),
           jax.ShapeDtypeStruct((0,), jnp.uint8))  # fmt: skip
    call = jax.ffi.ffi_call("jaxgemm_gemm", out)
    attrs = dict(transpose_a=False, transpose_b=False, tf32=False, alpha=np.float32(1), beta=np.float32(0),
                 activation=np.int64(0), split_k=np.int64(1), tile_m=np.int64(0), tile_n=np.int64(0),
                 kernel=np.int64(0), sm_margin=np.int64(0), dynamic_tiles=False)  # fmt: skip
    with pytest.raises(Exception, match="needs 5 epilogue operand buffers after a and b, got 1"):
        jax.block_until_ready(call(a, b, jnp.zeros((0,), jnp.float32), **attrs))
    full = call(a, b, *[jnp.zeros((0,), jnp.float32)] * 5, **attrs)[0]
    assert rel_error(full, to64(a) @ to64(b)) == 0
    assert jaxgemm.matmul(a, b).shape == (2, 4)


def test_scales_are_float32_and_for_fp8_products():
    """The scales are float32 whatever the output, the other operands of the output's dtype,
    and only fp8 products take scales."""
    a, b = jnp.ones((2, 32), jnp.bfloat16), jnp.ones((4, 32), jnp.bfloat16)
    config = GemmConfig(transpose_b=True, out_dtype=jnp.dtype(jnp.bfloat16))
    with pytest.raises(Exception, match="bias needs the output's dtype"):
        jax.block_until_ready(call_gemm_ffi(a, b, config=config, out_shape=(2, 4), bias=jnp.ones(4, jnp.float32)))
    with pytest.raises(Exception, match="row_scale and col_scale scale float8 products only"):
        jax.block_until_ready(call_gemm_ffi(a, b, config=config, out_shape=(2, 4), col_scale=jnp.ones(4, jnp.float32)))
    _fp8_kernel_platform()
    a, b = a.astype(jnp.float8_e4m3fn), b.astype(jnp.float8_e4m3fn)
    for name, shape, words in [("row_scale", (2,), "row_scale needs float32"),
                               ("row_scale", (4,), r"row_scale has shape \(4,\)"),
                               ("col_scale", (2, 4), r"col_scale has shape \(2, 4\)")]:  # fmt: skip
        scale = jnp.ones(shape, jnp.bfloat16 if "float32" in words else jnp.float32)
        with pytest.raises(Exception, match=words):
            jax.block_until_ready(call_gemm_ffi(a, b, config=config, out_shape=(2, 4), **{name: scale}))


@pytest.mark.parametrize("out_dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("m, n, k, batch, epilogue", [
    (136, 264, 256, (), ("row_scale", "col_scale")),            # ragged M and N: partial tiles
    (136, 264, 256, (), ("row_scale", "col_scale", "bias", "gelu", "aux")),
    (64, 128, 512, (2,), ("row_scale", "col_scale", "bias", "relu", "broadcast")),
    (300, 200, 128, (2,), ("col_scale", "silu", "aux")),
    (1000, 1100, 384, (), ("row_scale", "residual")),           # C / residual: the general epilogue
])  # fmt: skip
def test_fp8_products_take_the_epilogue(out_dtype, m, n, k, batch, epilogue):
    """e4m3 a (.., m, k) and b (.., n, k) with float32 row and column scales, bias, an
    activation, Aux and a residual in one call, against float64: the fp8 kernel's fused
    epilogue on a Hopper GPU (the general one for the residual), the FFI reference on the
    CPU. Scales of 2^-2..2^2, so that a missing or misplaced one shows; "broadcast": one
    row of column scales for the whole batch (stride 0)."""
    _fp8_kernel_platform()
    rng = np.random.default_rng(m + n + k)
    a = jnp.asarray(rng.standard_normal(batch + (m, k)) * 4, jnp.float8_e4m3fn)
    b = jnp.asarray(rng.standard_normal(batch + (n, k)) * 4, jnp.float8_e4m3fn)
    operands = {
        "row_scale": jnp.asarray(2.0 ** rng.uniform(-2, 2, batch + (m,)), jnp.float32),
        "col_scale": jnp.asarray(2.0 ** rng.uniform(-2, 2, ((1,) if "broadcast" in epilogue else batch) + (n,)),
                                 jnp.float32),
        "bias": jnp.asarray(rng.standard_normal(batch + (n,)) * 100, out_dtype),
        "residual": jnp.asarray(rng.standard_normal(batch + (m, n)) * 100, out_dtype),
    }
    operands = {name: x for name, x in operands.items() if name in epilogue}
    activation = next((a for a in ACTIVATIONS if a in epilogue), None)
    config = GemmConfig(transpose_b=True, out_dtype=jnp.dtype(out_dtype))
    out, aux = call_gemm_ffi(a, b, config=config, out_shape=batch + (m, n), activation=activation_id(activation),
                             want_aux="aux" in epilogue, **operands)  # fmt: skip
    z = to64(a) @ np.swapaxes(to64(b), -1, -2)
    if "row_scale" in operands:
        z = z * to64(operands["row_scale"])[..., :, None]
    if "col_scale" in operands:
        z = z * to64(operands["col_scale"])[..., None, :]
    if "bias" in operands:
        z = z + to64(operands["bias"])[..., None, :]
    want = ACTIVATIONS[activation](z)
    if "residual" in operands:
        want = want + to64(operands["residual"])
    tolerance = 1e-2 if out_dtype == jnp.bfloat16 else 2e-3  # (the tensor cores' fp8 sums: test_scaled.py)
    assert rel_error(out, want) <= tolerance
    if "aux" in epilogue:
        assert rel_error(aux, z) <= tolerance
