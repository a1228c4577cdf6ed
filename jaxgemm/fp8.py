"""fp8 training's dense layer: every product of the forward and backward pass in float8
e4m3 with one scale per row of each operand along its contraction ("rowwise" scaling, as
torchao's float8 rowwise recipe), on `scaled_matmul`.

    y = act(x @ w + bias):  x (M, K) scaled per row, w^T (N, K) per output feature;
    dx = dz @ w^T:          dz (M, N) per row, w (K, N) per input feature;
    dw = x^T @ dz:          x^T (K, M) and dz^T (N, M) per feature, over the batch;
    dbias = sum(dz), dz = dy * act'(z), all in float32 (z saved by the forward).

Each operand is quantized from the high-precision tensor for the product it enters (the
two copies of x and of dz differ in orientation and scales). The gradient is the
straight-through one: quantization counts as the identity. On a Hopper GPU the products
run on jaxgemm's fp8 kernel; elsewhere `scaled_matmul` dequantizes (same values, float32
sums). Under sharded jit the scales are the whole batch's (XLA reduces the amax across
devices); inside shard_map each device's scales cover its own rows. Not forward-mode
differentiable (a custom VJP).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from jaxgemm import activations
from jaxgemm._compat import explicit_sharding, match_varying
from jaxgemm.scaled import scaled_matmul

E4M3 = jnp.float8_e4m3fn
E4M3_MAX = float(jnp.finfo(E4M3).max)  # 448


def quantize_rows(x):
    """x (..., R, K) as e4m3 values and float32 scales (..., R, 1), one per row: each row
    divided by amax / 448, so its largest magnitude maps onto e4m3's largest value (an
    all-zero row gets scale 1). `scaled_matmul(q, ..., scales, ...)` multiplies them back."""
    x = jnp.asarray(x, jnp.float32)
    amax = jnp.max(jnp.abs(x), axis=-1, keepdims=True)
    scales = jnp.where(amax > 0, amax / E4M3_MAX, 1.0)
    q = jnp.clip(x / scales, -E4M3_MAX, E4M3_MAX).astype(E4M3)
    return q, scales


def _product(a, b, out_dtype, like=None):
    """a (M, K) @ b (N, K)^T on rowwise-quantized copies of both, into out_dtype; in
    Explicit mode typed like `like` (a gradient like its primal, as JAX's transposes type
    it: a product that contracts the split batch needs it)."""
    (qa, sa), (qb, sb) = quantize_rows(a), quantize_rows(b)
    sharding = None if like is None else explicit_sharding(jax.typeof(like))
    out_sharding = None if sharding is None else P(None, *sharding.spec)
    return scaled_matmul(qa[None], qb[None], sa[None], sb[None], preferred_element_type=out_dtype,
                         out_sharding=out_sharding)[0]  # fmt: skip


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _dense(x, w, bias, activation, out_dtype):
    return _dense_fwd(x, w, bias, activation, out_dtype)[0]


def _dense_fwd(x, w, bias, activation, out_dtype):
    z = _product(x, w.T, jnp.float32)
    if bias is not None:
        z = z + bias.astype(jnp.float32)
    y = activations.apply(activation, z).astype(out_dtype)
    return y, (x, w, bias, z)


def _dense_bwd(activation, out_dtype, saved, dy):
    x, w, bias, z = saved
    dz = dy.astype(jnp.float32) * activations.derivative(activation, z)
    dx = _product(dz, w, jnp.float32, like=x).astype(x.dtype)
    dw = _product(x.T, dz.T, jnp.float32, like=w).astype(w.dtype)
    dbias = None if bias is None else jnp.sum(dz, axis=0).astype(bias.dtype)
    return dx, dw, dbias


_dense.defvjp(_dense_fwd, _dense_bwd)


def dense(x, w, bias=None, activation=None, *, out_dtype=None):
    """`activation(x @ w + bias)` with its forward and backward products in float8 e4m3,
    rowwise scaled (this module's docstring says how each operand is scaled).

    Args:
      x: (..., K) inputs, a 16- or 32-bit float; leading dims are batch dims.
      w: (K, N) weights, a 16- or 32-bit float (the high-precision master copy).
      bias: optional (N,) bias.
      activation: None, a name accepted by `jaxgemm.matmul`, or the jax.nn function of one.
      out_dtype: the result's dtype (default: x's).

    Returns:
      (..., N). Differentiable in reverse mode (`grad`, `vjp`): dx, dw and dbias in the
      dtypes of x, w and bias. Products on a Hopper GPU need K and N to be multiples of 16
      (else, and elsewhere, `scaled_matmul` dequantizes and multiplies in float32)."""
    x, w = jnp.asarray(x), jnp.asarray(w)
    bias = None if bias is None else jnp.asarray(bias)
    if w.ndim != 2 or x.ndim < 1 or x.shape[-1] != w.shape[0]:
        raise ValueError(f"jaxgemm.fp8.dense: needs x (..., K) and w (K, N), got x{x.shape} and w{w.shape}")
    if bias is not None and bias.shape != (w.shape[1],):
        raise ValueError(f"jaxgemm.fp8.dense: bias must have shape ({w.shape[1]},), got {bias.shape}")
    for name, value in (("x", x), ("w", w), ("bias", bias)):
        if value is not None and (not jnp.issubdtype(value.dtype, jnp.floating) or jnp.dtype(value.dtype).itemsize < 2):
            raise TypeError(f"jaxgemm.fp8.dense: {name} must be a 16- or 32-bit float (the high-precision copy), "
                            f"got {jnp.dtype(value.dtype)}")  # fmt: skip
    activation = activations.canonical(activation)
    out_dtype = jnp.dtype(out_dtype or x.dtype)
    # Inside shard_map, the weights vary over the batch's axes too, so that their cotangents
    # (per-shard sums) are psummed by the cast's transpose, as for JAX's own dots.
    rows, w, *bias = match_varying((x.reshape(-1, x.shape[-1]), w) + (() if bias is None else (bias,)))
    y = _dense(rows, w, bias[0] if bias else None, activation, out_dtype)
    return y.reshape(x.shape[:-1] + (w.shape[1],))
