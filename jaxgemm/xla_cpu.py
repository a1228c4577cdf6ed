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

from jaxgemm import _compat, activations


def enabled(platform: str) -> bool:
    """Whether ops lowered for `platform` use this module rather than the FFI handlers."""
    return platform == "cpu" and os.environ.get("JAXGEMM_CPU", "xla").lower() != "ffi"


def _exact(dtype):
    return lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else None


def gemm(a, b, *, transpose_a: bool, transpose_b: bool, alpha: float, out_dtype, out_sharding=None):
    """alpha * op(a) @ op(b) for operands of equal rank whose batch dims broadcast;
    `out_sharding` as the primitive's (Explicit mode)."""
    a = jnp.swapaxes(a, -1, -2) if transpose_a else a
    b = jnp.swapaxes(b, -1, -2) if transpose_b else b
    if alpha == 1.0 and jnp.dtype(out_dtype) == a.dtype:  # as jnp.matmul, which XLA's CPU runs fastest
        return jnp.matmul(a, b, precision=_exact(a.dtype), out_sharding=out_sharding)
    out = jnp.matmul(a, b, precision=_exact(a.dtype), preferred_element_type=jnp.float32, out_sharding=out_sharding)
    return (out if alpha == 1.0 else alpha * out).astype(out_dtype)


def bias_act_grad(dy, at, extra, activation):
    """(dy * act'(at) + extra, its sum over rows in float32)."""
    dz = dy.astype(jnp.float32) * activations.derivative(activation, at)
    if extra is not None:
        dz = dz + extra.astype(jnp.float32)
    return dz.astype(dy.dtype), dz.sum(axis=-2)


def _conv(x, w, config, out_sharding=None):
    return lax.conv_general_dilated(
        x, w, config.stride, config.padding, rhs_dilation=config.dilation,
        dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=config.groups,
        precision=_exact(x.dtype), preferred_element_type=jnp.float32, out_sharding=out_sharding,
    )  # fmt: skip


def conv(x, w, config, out_sharding=None):
    """The convolution of conv2d_p, float32."""
    return _conv(x, w, config, out_sharding)


def pull_back(linear, shape, dtype, ct, out_sharding=None):
    """ct pulled back through `linear` (its transpose), whose input has `shape` and `dtype`
    (typed `out_sharding` in Explicit mode; varying over ct's manual axes in shard_map)."""
    zero = jnp.zeros(shape, dtype, out_sharding=out_sharding)
    zero, ct = _compat.match_varying((zero, ct))
    return jax.vjp(linear, zero)[1](ct)[0]


def conv_dgrad(dy, w, config, input_hw, out_sharding=None):
    """dx of the convolution (the input dtype)."""
    shape = (dy.shape[0], *input_hw, w.shape[2] * config.groups)
    return pull_back(lambda x: _conv(x, w, config).astype(dy.dtype), shape, dy.dtype, dy, out_sharding)


def conv_wgrad(x, dy, config, kernel_hw, out_sharding=None):
    """dw of the convolution (the input dtype)."""
    shape = (*kernel_hw, x.shape[3] // config.groups, dy.shape[3])
    return pull_back(lambda w: _conv(x, w, config).astype(x.dtype), shape, x.dtype, dy, out_sharding)
