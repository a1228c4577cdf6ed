"""`jaxgemm.matmul`: argument checking and the choice between the plain and fused paths."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxgemm import activations, autotune
from jaxgemm.epilogue import EpilogueConfig, fused_matmul
from jaxgemm.gemm import GemmConfig, broadcast_batch, gemm_dims, gemm_product, traced_sm_margin
from jaxgemm.kernels import SUPPORTED_DTYPES
from jaxgemm.primitive import canonical_out_sharding, constrain_output

_TF32_PRECISIONS = {"tensorfloat32", "tf32", "default", "high"}
_EXACT_PRECISIONS = {"highest", "float32"}


def _wants_tf32(precision) -> bool:
    """None/"highest" -> exact fp32; "tensorfloat32" or an explicit DEFAULT/HIGH -> tf32."""
    if precision is None:
        return False
    if isinstance(precision, (tuple, list)) and len(precision) == 2:
        return _wants_tf32(precision[0]) or _wants_tf32(precision[1])
    if isinstance(precision, lax.Precision):
        return precision != lax.Precision.HIGHEST
    if isinstance(precision, str):
        name = precision.lower()
        if name in _TF32_PRECISIONS:
            return True
        if name in _EXACT_PRECISIONS:
            return False
    raise ValueError(
        f"jaxgemm.matmul: unknown precision {precision!r}; use None, 'highest', 'tensorfloat32' "
        "or a jax.lax.Precision"
    )


def _check_dtype(dtype, what: str):
    dtype = jnp.dtype(dtype)
    if dtype not in SUPPORTED_DTYPES:
        names = ", ".join(str(d) for d in SUPPORTED_DTYPES)
        raise TypeError(f"jaxgemm.matmul: {what} dtype {dtype} is not supported; use one of {names}")
    return dtype


def _check_epilogue_operand(x, name, target_shape):
    """x (bias, c or residual) must broadcast to target_shape; ValueError naming both."""
    x = jnp.asarray(x)
    _check_dtype(x.dtype, name)
    try:
        fits = jnp.broadcast_shapes(x.shape, target_shape) == tuple(target_shape)
    except ValueError:
        fits = False
    if not fits or x.ndim == 0:
        raise ValueError(f"jaxgemm.matmul: {name} of shape {x.shape} does not fit {tuple(target_shape)}")
    return x


def _is_traced(x) -> bool:
    return isinstance(x, jax.core.Tracer)


def _static_scalars(alpha, beta, c, bias, activation, residual):
    """(alpha, beta, c, scale_after): the kernel takes alpha and beta as compiled constants.
    A traced beta is folded into c (beta * c, beta = 1); a traced alpha of a product with no
    epilogue scales the result (`scale_after`); with an epilogue it is an error that names it."""
    scale_after = None
    if _is_traced(beta):
        c, beta = (None, 0.0) if c is None else (beta * jnp.asarray(c), 1.0)
    if _is_traced(alpha):
        if bias is not None or activation is not None or residual is not None or c is not None:
            raise TypeError(
                "jaxgemm.matmul: alpha is a traced value; with an epilogue (bias, activation, c, residual) it "
                "is compiled into the kernel and must be a Python number. Scale an operand instead.")
        alpha, scale_after = 1.0, alpha
    for name, value in (("alpha", alpha), ("beta", beta)):
        if not isinstance(value, (int, float, np.number)) and not (hasattr(value, "shape") and value.shape == ()):
            raise TypeError(f"jaxgemm.matmul: {name} must be a scalar, got {value!r}")
    return float(alpha), float(beta), c, scale_after


def matmul(
    a,
    b,
    *,
    transpose_a=False,
    transpose_b=False,
    precision=None,
    out_dtype=None,
    bias=None,
    activation=None,
    alpha=1.0,
    beta=0.0,
    c=None,
    residual=None,
    return_pre_activation=False,
    out_sharding=None,
):
    """Matrix product with `jnp.matmul` semantics and an optional fused epilogue.

    Computes `z = alpha * op(a) @ op(b) + beta * c + bias` and returns
    `y = activation(z) + residual` (and `z` too with `return_pre_activation`), in one
    kernel, accumulating in float32.

    Args:
      a: array of shape (..., M, K), or (..., K, M) with `transpose_a`; 1-D is a vector.
      b: array of shape (..., K, N), or (..., N, K) with `transpose_b`; 1-D is a vector.
        Leading batch dims broadcast against each other like `jnp.matmul`.
      transpose_a, transpose_b: use the transpose of the last two dims of the operand,
        read in place (no transposed copy is made, except for tf32: see `precision`).
      precision: for float32 inputs, None or "highest" computes in exact fp32;
        "tensorfloat32" (or an explicit `lax.Precision.DEFAULT`/`HIGH`) allows tf32, which
        runs on Hopper's tensor cores and in exact fp32 elsewhere. On Hopper, `b` without
        `transpose_b` is transposed by XLA first unless the product is plain (no epilogue
        beyond `alpha`) with `a` stored (M, K), which the kernel computes as D^T and
        writes transposed (see the README).
      out_dtype: result dtype; defaults to the inputs' dtype promoted with bias, c and
        residual (`a @ b + bias` with bfloat16 operands and a float32 bias is float32).
      bias: per-column bias of shape (N,) (or broadcastable (..., N)).
      activation: None, "relu", "gelu" (tanh approximation, = `jax.nn.gelu`),
        "gelu_exact", "silu", "sigmoid" or "tanh", or the jax.nn function of one
        (`jax.nn.relu`, `jax.nn.gelu`, ...).
      alpha, beta: scalars, compiled into the kernel. A traced beta is folded into c; a
        traced alpha scales the result of a product without epilogue (with one it must be a
        Python number).
      c: added as `beta * c`; broadcastable to the output.
      residual: added after the activation; broadcastable to the output.
      return_pre_activation: also return z.
      out_sharding: the result's sharding (a NamedSharding, or a PartitionSpec on the
        current mesh), as for `jnp.matmul`. In Explicit mode it is needed where the
        contracting dim is sharded in both operands (then each device's partial product is
        summed into that layout, and the epilogue applies once, after the sum).

    Returns:
      y of shape (*batch, M, N) (vector dims removed), or (y, z).

    Raises:
      TypeError: unsupported dtypes (float32, float16 and bfloat16 are supported).
      ValueError: rank-0 operands, mismatched inner dims, non-broadcastable batch dims,
        an unknown activation, or epilogue operands that do not fit the output.
    """
    a = jnp.asarray(a)
    b = jnp.asarray(b)
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"jaxgemm.matmul: operands must have rank >= 1, got shapes {a.shape} and {b.shape}")
    dtype = _check_dtype(jnp.result_type(a.dtype, b.dtype), "input")
    if out_dtype is None:  # promoted with the epilogue operands, as `a @ b + bias` would be
        extra = [jnp.asarray(x).dtype for x in (bias, c, residual) if x is not None]
        out_dtype = _check_dtype(jnp.result_type(dtype, *extra), "output")
    else:
        out_dtype = _check_dtype(out_dtype, "output")
    tf32 = _wants_tf32(precision) and dtype == jnp.float32
    activation = activations.canonical(activation)
    alpha, beta, c, scale_after = _static_scalars(alpha, beta, c, bias, activation, residual)
    fused = (
        bias is not None
        or activation is not None
        or residual is not None
        or return_pre_activation
        or (c is not None and beta != 0)
    )
    if beta != 0 and c is None:
        raise ValueError(f"jaxgemm.matmul: beta={beta} needs c")
    a_vector, b_vector = a.ndim == 1, b.ndim == 1
    if fused and (a_vector or b_vector):
        raise ValueError(
            f"jaxgemm.matmul: epilogue arguments need operands of rank >= 2, got {a.shape} and {b.shape}"
        )
    if a_vector:
        a, transpose_a = a[None, :], False
    if b_vector:
        b, transpose_b = b[:, None], False
    a, b = a.astype(dtype), b.astype(dtype)
    config = GemmConfig(bool(transpose_a), bool(transpose_b), tf32, out_dtype, alpha=float(alpha),
                        sm_margin=traced_sm_margin())  # fmt: skip
    m, k, n, kb = gemm_dims(a.shape, b.shape, config)
    if k != kb:
        raise ValueError(
            f"jaxgemm.matmul: inner dimensions differ: a{a.shape} (transpose_a={transpose_a}) has "
            f"K={k}, b{b.shape} (transpose_b={transpose_b}) has K={kb}"
        )
    rank = max(a.ndim, b.ndim)
    batch_a = (1,) * (rank - a.ndim) + a.shape[:-2]
    batch_b = (1,) * (rank - b.ndim) + b.shape[:-2]
    batch = broadcast_batch(batch_a, batch_b)
    if batch is None:
        raise ValueError(
            f"jaxgemm.matmul: batch dims do not broadcast: a{a.shape[:-2]} vs b{b.shape[:-2]} "
            f"(full shapes a{a.shape}, b{b.shape})"
        )
    out_sharding = canonical_out_sharding(out_sharding, "jaxgemm.matmul")
    if not fused:
        config = autotune.tuned_config(config, a.shape, b.shape, dtype, math.prod(batch))
        vector = a_vector or b_vector
        out = gemm_product(a, b, config, None if vector else out_sharding)
        if a_vector:
            out = out[..., 0, :]
        if b_vector:
            out = out[..., 0]
        if scale_after is not None:
            out = (scale_after * out).astype(out.dtype)
        return constrain_output(out, out_sharding)
    out_shape = batch + (m, n)
    if bias is not None:
        bias = _check_epilogue_operand(bias, "bias", out_shape[:-2] + (n,))
        if bias.shape[-1] != n:
            raise ValueError(f"jaxgemm.matmul: bias of shape {bias.shape} needs one value per output column (N={n})")
    c = _check_epilogue_operand(c, "c", out_shape) if c is not None and beta != 0 else None
    if residual is not None:
        residual = _check_epilogue_operand(residual, "residual", out_shape)
    epi = EpilogueConfig(activation, float(beta), bool(return_pre_activation))
    out = fused_matmul(a, b, c, bias, residual, config, epi, out_sharding)
    if return_pre_activation:
        return constrain_output(out[0], out_sharding), out[1]
    return constrain_output(out, out_sharding)
