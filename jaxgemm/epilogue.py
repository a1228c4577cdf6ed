"""GEMMs with a fused epilogue, and their gradient.

    z = alpha * op(a) @ op(b) + beta * c + bias,   y = act(z) + residual,   aux = z

The forward pass is one jaxgemm_gemm kernel. The backward pass computes
dz = dy * act'(z) (+ the cotangent of aux) and the bias gradient in one fused kernel
(jaxgemm_bias_act_grad), then dgrad and wgrad with jaxgemm's GEMMs in the input dtype with
fp32 accumulation. For relu without a residual act'(z) is read off y, so the forward keeps
no z.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxgemm import activations
from jaxgemm.gemm import (
    GemmConfig,
    _broadcast_batch,
    _gemm_dims,
    _tf32_operands,
    _kernel_out_dtype,
    _mn_major_for_simt,
    call_gemm_ffi,
    gemm_workspace_bytes,
    grad_lhs,
    grad_rhs,
    runs_as_tf32,
    runs_on_simt_f32,
    unbroadcast,
)

# Rows per block of the bias/activation backward: enough blocks to keep every SM streaming.
_ROWS_PER_CHUNK = 64
_MAX_CHUNKS = 256


@dataclasses.dataclass(frozen=True)
class EpilogueConfig:
    """Static epilogue options (hashable: a nondiff argument of the custom VJP)."""

    activation: str | None = None
    beta: float = 0.0
    want_aux: bool = False


def bias_act_grad(dy, z, extra, activation: str | None):
    """(dz, dbias) for dy, z of shape (*batch, rows, n): dz = dy * act'(z) (+ extra),
    dbias (*batch, n) in float32, summed over rows in a fixed order."""
    rows, n = dy.shape[-2:]
    chunks = max(1, min(_MAX_CHUNKS, math.ceil(rows / _ROWS_PER_CHUNK)))
    results = (
        jax.ShapeDtypeStruct(dy.shape, dy.dtype),
        jax.ShapeDtypeStruct(dy.shape[:-2] + (chunks, n), jnp.float32),
    )
    # Under vmap dy may be unbatched (e.g. the cotangent of a sum) while z is batched; the
    # kernel wants them alike, and both are output-sized anyway.
    dz, partials = jax.ffi.ffi_call("jaxgemm_bias_act_grad", results, vmap_method="broadcast_all")(
        dy,
        z,
        jnp.zeros((0,), dy.dtype) if extra is None else extra.astype(dy.dtype),
        activation=np.int64(activations.activation_id(activation)),
    )
    return dz, partials.sum(axis=-2)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _fused(config: GemmConfig, epi: EpilogueConfig, a, b, c, bias, residual):
    y, aux = _forward(config, epi, a, b, c, bias, residual, epi.want_aux)
    return (y, aux) if epi.want_aux else y


def _out_shape(a, b, config):
    """Output shape for equal-rank operands (batch dims 1 or shared)."""
    m, _, n, _ = _gemm_dims(a.shape, b.shape, config)
    return _broadcast_batch(a.shape[:-2], b.shape[:-2]) + (m, n)


def _forward(config, epi, a, b, c, bias, residual, want_aux):
    out_shape = _out_shape(a, b, config)

    def run(a, b, call_config, workspace_bytes=0):
        return call_gemm_ffi(
            a,
            b,
            c,
            bias,
            residual,
            config=call_config,
            out_shape=out_shape,
            activation=activations.activation_id(epi.activation),
            beta=epi.beta,
            want_aux=want_aux,
            workspace_bytes=workspace_bytes,
        )

    def run_on_gpu(a, b):
        # As in the plain GEMM's lowering: on a Hopper GPU the tf32 kernel takes its operands
        # as _tf32_operands stores them, the SIMT float32 kernels large ones M- / N-major, and
        # stream-K gets its workspace.
        call_config = config
        if runs_as_tf32(a.dtype, config, "cuda"):
            a, b, call_config = _tf32_operands(a, b, config)
        elif runs_on_simt_f32(a.dtype, config, "cuda"):
            a, b, call_config = _mn_major_for_simt(a, b, config)
        return run(a, b, call_config, gemm_workspace_bytes(a.shape, b.shape, a.dtype, call_config, 1, "cuda"))

    # Elsewhere the operands go as they are (tf32-allowed float32 runs in exact fp32).
    if (
        runs_as_tf32(a.dtype, config, "cuda")
        or runs_on_simt_f32(a.dtype, config, "cuda")
        or gemm_workspace_bytes(a.shape, b.shape, a.dtype, config, 1, "cuda")
    ):
        return jax.lax.platform_dependent(a, b, cuda=run_on_gpu, default=lambda a, b: run(a, b, config))
    return run(a, b, config)


def _fused_fwd(config, epi, a, b, c, bias, residual):
    # act'(z) read off y (relu; not once a residual is added): the forward then writes no z.
    from_output = activations.derivative_from_output(epi.activation) and residual is None
    keep_z = epi.want_aux or (epi.activation is not None and not from_output)
    y, z = _forward(config, epi, a, b, c, bias, residual, keep_z)
    out = (y, z) if epi.want_aux else y
    # What act' is evaluated at in the backward (bias_act_grad): z, or y where it gives the same.
    at = None if epi.activation is None else (y if from_output else z)
    return out, (a, b, c, bias, residual, at)


def _fused_bwd(config, epi, saved, ct):
    a, b, c, bias, residual, at = saved
    dy, daux = ct if epi.want_aux else (ct, None)
    if epi.activation is None:
        dz = dy if daux is None else dy + daux.astype(dy.dtype)
        dbias = None if bias is None else dz.astype(jnp.float32).sum(axis=-2)
    else:
        dz, dbias = bias_act_grad(dy, at, daux, epi.activation)
    return (
        grad_lhs(dz, b, a.shape, a.dtype, config),
        grad_rhs(dz, a, b.shape, b.dtype, config),
        None if c is None else unbroadcast(epi.beta * dz, c.shape).astype(c.dtype),
        None if bias is None else unbroadcast(dbias, bias.shape).astype(bias.dtype),
        None if residual is None else unbroadcast(dy, residual.shape).astype(residual.dtype),
    )


_fused.defvjp(_fused_fwd, _fused_bwd)


def fused_matmul(a, b, c, bias, residual, config: GemmConfig, epi: EpilogueConfig):
    """Canonicalizes shapes (equal ranks, batch folded into M when b and bias are shared)
    and runs the fused GEMM; returns y, or (y, aux) with `epi.want_aux`. Shapes are
    validated by the caller (jaxgemm.matmul)."""
    rank = max(a.ndim, b.ndim)
    a = a.reshape((1,) * (rank - a.ndim) + a.shape)
    b = b.reshape((1,) * (rank - b.ndim) + b.shape)
    out_shape = _out_shape(a, b, config)
    m, n = out_shape[-2:]
    kernel_dtype = _kernel_out_dtype(a.dtype, config.out_dtype)
    kernel_config = dataclasses.replace(config, out_dtype=kernel_dtype)

    def as_matrix_operand(x):  # c, residual: the output's rank, matrix dims exact
        if x is None:
            return None
        x = x.astype(kernel_dtype)
        if x.shape[-2:] != (m, n):
            return jnp.broadcast_to(x, out_shape)
        return x.reshape((1,) * (rank - x.ndim) + x.shape)

    c, residual = as_matrix_operand(c), as_matrix_operand(residual)
    if bias is not None:
        bias = bias.astype(kernel_dtype)
        bias = bias.reshape((1,) * (rank - 1 - bias.ndim) + bias.shape)

    b_shared = all(d == 1 for d in b.shape[:-2])
    bias_shared = bias is None or all(d == 1 for d in bias.shape[:-1])
    if rank > 2 and not config.transpose_a and b_shared and bias_shared:
        # One large GEMM: batch folded into M (c and residual follow the output's layout).
        fold = lambda x: None if x is None else jnp.broadcast_to(x, out_shape).reshape(-1, n)  # noqa: E731
        a2 = a.reshape(-1, a.shape[-1])
        b2 = b.reshape(b.shape[-2:])
        bias2 = None if bias is None else bias.reshape(n)
        out = _fused(kernel_config, epi, a2, b2, fold(c), bias2, fold(residual))
        out = jax.tree_util.tree_map(lambda x: x.reshape(out_shape), out)
    else:
        out = _fused(kernel_config, epi, a, b, c, bias, residual)
    return jax.tree_util.tree_map(lambda x: x.astype(config.out_dtype), out)
