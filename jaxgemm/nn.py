"""Layers built on jaxgemm's fused GEMMs."""

from __future__ import annotations

import jax.numpy as jnp

from jaxgemm.matmul import matmul
from jaxgemm.primitive import canonical_out_sharding, constrain_output


def dense(x, w, bias=None, activation=None, *, precision=None, out_dtype=None, out_sharding=None):
    """A fully connected layer, `activation(x @ w + bias)`, in one fused kernel.

    Its gradient keeps the pre-activation z from the forward epilogue (relu: the output,
    which says where z > 0); the backward pass computes dz = dy * activation'(z) and the
    bias gradient in one fused kernel, then
    dx = dz @ w^T and dw = x^T @ dz on jaxgemm's GEMMs (input dtype, fp32 accumulation).

    Args:
      x: (..., K) inputs; every leading dim is a batch dim (folded into one GEMM).
      w: (K, N) weights.
      bias: optional (N,) bias.
      activation: None, a name accepted by `jaxgemm.matmul`, or the jax.nn function of one.
      precision, out_dtype, out_sharding: as for `jaxgemm.matmul` (out_sharding of the
        (..., N) result).

    Returns:
      (..., N) outputs.
    """
    x, w = jnp.asarray(x), jnp.asarray(w)
    if w.ndim != 2 or x.ndim < 1 or x.shape[-1] != w.shape[0]:
        raise ValueError(f"jaxgemm.dense: needs x (..., K) and w (K, N), got x{x.shape} and w{w.shape}")
    if bias is not None and jnp.shape(bias) != (w.shape[1],):
        raise ValueError(f"jaxgemm.dense: bias must have shape ({w.shape[1]},), got {jnp.shape(bias)}")
    out_sharding = canonical_out_sharding(out_sharding, "jaxgemm.dense")
    flat = x.ndim == 2
    y = matmul(x.reshape(-1, x.shape[-1]), w, bias=bias, activation=activation, precision=precision,
               out_dtype=out_dtype, out_sharding=out_sharding if flat else None)  # fmt: skip
    return constrain_output(y.reshape(x.shape[:-1] + (w.shape[1],)), out_sharding)
