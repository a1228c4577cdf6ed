"""The GEMM epilogue's operand table (ffi_src/gemm/problem.h, kernels.EPILOGUE_OPERANDS): the
jaxgemm_gemm call takes the operands after a and b in table order, checks each against its
shape, and gives every one its batch strides; call_gemm_ffi passes them by name."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgemm
from jaxgemm.gemm import GemmConfig, call_gemm_ffi
from jaxgemm.kernels import EPILOGUE_OPERANDS
from reference import random, rel_error, to64


def test_the_table_as_python_reads_it():
    assert list(EPILOGUE_OPERANDS.items()) == [("c", "matrix"), ("bias", "columns"), ("residual", "matrix")]


@pytest.mark.parametrize("names", [(), ("c",), ("bias",), ("residual",), ("c", "bias", "residual")])
def test_operands_by_name_with_broadcast_batches(names):
    """Each operand reaches its step: out = alpha a b + beta c + bias + residual, with a batch
    of 3 that the bias and c broadcast along (stride 0) and the residual carries."""
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
    with pytest.raises(Exception, match="needs 3 epilogue operand buffers after a and b, got 1"):
        jax.block_until_ready(call(a, b, jnp.zeros((0,), jnp.float32), **attrs))
    full = call(a, b, *[jnp.zeros((0,), jnp.float32)] * 3, **attrs)[0]
    assert rel_error(full, to64(a) @ to64(b)) == 0
    assert jaxgemm.matmul(a, b).shape == (2, 4)
