"""The ops' per-shard computations in XLA's own operations, for CPUs.

On a CPU jaxgemm lowers to XLA's dot and convolution (float32 accumulation, the epilogue in
float32, as the kernels do), which XLA's CPU backend runs as fast as `jnp` does; the FFI CPU
handlers are the blocked reference loops of ffi_src/, far slower. `JAXGEMM_CPU=ffi` (read
when an op is lowered) runs the handlers instead: the test suite sets it, so every CPU test
exercises the whole JAX -> FFI path, and tests/test_xla_cpu.py checks this module against it.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
from jax import lax

from jaxgemm import activations


def enabled(platform: str) -> bool:
    """Whether ops lowered for `platform` use this module rather than the FFI handlers."""
    return platform == "cpu" and os.environ.get("JAXGEMM_CPU", "xla").lower() != "ffi"


def _exact(dtype):
    return lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else None


def gemm(a, b, *, transpose_a: bool, transpose_b: bool, alpha: float, out_dtype):
    """alpha * op(a) @ op(b) for operands of equal rank whose batch dims broadcast."""
    a = jnp.swapaxes(a, -1, -2) if transpose_a else a
    b = jnp.swapaxes(b, -1, -2) if transpose_b else b
    out = jnp.matmul(a, b, precision=_exact(a.dtype), preferred_element_type=jnp.float32)
    return (out if alpha == 1.0 else alpha * out).astype(out_dtype)


def bias_act_grad(dy, at, extra, activation):
    """(dy * act'(at) + extra, its sum over rows in float32)."""
    dz = dy.astype(jnp.float32) * activations.derivative(activation, at)
    if extra is not None:
        dz = dz + extra.astype(jnp.float32)
    return dz.astype(dy.dtype), dz.sum(axis=-2)


def _conv(x, w, config):
    return lax.conv_general_dilated(
        x, w, config.stride, config.padding, rhs_dilation=config.dilation,
        dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=config.groups,
        precision=_exact(x.dtype), preferred_element_type=jnp.float32,
    )  # fmt: skip


def conv(x, w, config):
    """The convolution of conv2d_p, float32."""
    return _conv(x, w, config)


def conv_dgrad(dy, w, config, input_hw):
    """dx of the convolution (the input dtype)."""
    x = jax.ShapeDtypeStruct((dy.shape[0], *input_hw, w.shape[2] * config.groups), dy.dtype)
    (dx,) = jax.linear_transpose(lambda x: _conv(x, w, config).astype(dy.dtype), x)(dy)
    return dx


def conv_wgrad(x, dy, config, kernel_hw):
    """dw of the convolution (the input dtype)."""
    w = jax.ShapeDtypeStruct((*kernel_hw, x.shape[3] // config.groups, dy.shape[3]), x.dtype)
    (dw,) = jax.linear_transpose(lambda w: _conv(x, w, config).astype(x.dtype), w)(dy)
    return dw
