"""fp8.dense's forward as one kernel: the e4m3 product, its scales, the bias, the
activation and the pre-activation z, all in the kernel's epilogue:

    z[b, m, n] = scaled_matmul(lhs, rhs, lhs_scales, rhs_scales)[b, m, n] + bias[b, n]
    y = act(z)

lhs (B, M, K) and rhs (B, N, K) K-major e4m3, their scales (B, M, KB) and (B, N, KB) as
`scaled_matmul` takes them (rhs_tiles as `scaled_matmul_tiled`'s), bias (B, N) or absent.
One scale per row (KB = 1) runs on the fp8 GEMM (the scales in its epilogue too), blocks
of a multiple of 128 values on the block-scaled kernel. Results: y, and z where asked
(`want_aux`), both in out_dtype. The kernels write bfloat16 or float32 (float16 is
rounded from float32). One primitive in primitive.py's pattern, sharded like
`scaled_matmul`: B, M and N split with no collective; with K split the partial products
are summed first and the epilogue runs in XLA on the sum (as it does wherever no kernel
takes the product: other GPUs, the CPU's XLA route, rows that are not 16-byte runs). Not
differentiable: fp8.dense's custom VJP is its derivative.
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxgemm.epilogue import EpilogueConfig, epilogue_in_jax
from jaxgemm.primitive import Op, Result, Rule, all_to_front, define
from jaxgemm.scaled import (
    block_scaled_kernel_call,
    fp8_kernel_call,
    product_rule,
    rhs_groups,
    runs_on_block_scaled_kernel,
    runs_on_fp8_kernel,
    scaled_local,
)


def _abstract(lhs, rhs, lhs_scales, rhs_scales, *bias, activation, want_aux, out_dtype, rhs_tiles=False):
    shape = (lhs.shape[0], lhs.shape[1], rhs.shape[1])
    return [Result(shape, out_dtype)] * (2 if want_aux else 1)


def _rule(lhs, rhs, lhs_scales, rhs_scales, *bias, activation, want_aux, out_dtype, rhs_tiles=False):
    """scaled_matmul's rule (K a compound of blocks and the values in one), and the bias
    along the result's columns."""
    product = product_rule(lhs, rhs, lhs_scales, rhs_scales)
    return Rule(product.operands + (("b", "n"),) * len(bias), (("b", "m", "n"),) * (2 if want_aux else 1),
                factor_sizes=product.factor_sizes)  # fmt: skip


def _local(lhs, rhs, lhs_scales, rhs_scales, *bias, activation, want_aux, out_dtype, platform, axes,
           rhs_tiles=False):  # fmt: skip
    bias = bias[0] if bias else None
    whole_k = not (axes.get("ks") or axes.get("kb"))
    if runs_on_fp8_kernel(lhs, rhs, lhs_scales, platform) and whole_k:
        return fp8_kernel_call(lhs, rhs, lhs_scales, rhs_scales, out_dtype, platform, bias=bias, activation=activation,
                               want_aux=want_aux)  # fmt: skip
    if runs_on_block_scaled_kernel(lhs, rhs, lhs_scales, platform) and whole_k:
        return block_scaled_kernel_call(lhs, rhs, lhs_scales, rhs_scales, out_dtype, bias=bias, activation=activation,
                                        want_aux=want_aux, groups=rhs_groups(rhs, rhs_tiles, axes, platform))
    # The product (summed over a split K), then the epilogue once, in XLA.
    (z,) = scaled_local(lhs, rhs, lhs_scales, rhs_scales, out_dtype=jnp.dtype(jnp.float32), platform=platform,
                        axes=axes, rhs_tiles=rhs_tiles)  # fmt: skip
    return epilogue_in_jax(z, None, bias, None, EpilogueConfig(activation=activation, want_aux=want_aux), out_dtype)


def _batch(args, dims, *, activation, want_aux, out_dtype, rhs_tiles=False):
    """vmap: the vmapped axis folded into B (every operand has it, broadcast if unbatched)."""
    args = all_to_front(args, dims)
    v = args[0].shape[0]
    outs = scaled_dense_op.bind(*(x.reshape((-1,) + x.shape[2:]) for x in args), activation=activation,
                                want_aux=want_aux, out_dtype=out_dtype, rhs_tiles=rhs_tiles)  # fmt: skip
    return [x.reshape((v, -1) + x.shape[1:]) for x in outs], [0] * len(outs)


scaled_dense_op = define(Op(
    "jaxgemm_scaled_dense", abstract=_abstract, rule=_rule, local=_local, batch=_batch, rule_on_cpu=True,
))  # fmt: skip


def scaled_dense(lhs, rhs, lhs_scales, rhs_scales, bias=None, *, activation=None, want_aux=False, out_dtype,
                 rhs_tiles=False):  # fmt: skip
    """[y] or [y, z] (want_aux) of the module docstring's definition; `activation` a
    canonical name (activations.canonical) or None."""
    operands = (lhs, rhs, lhs_scales, rhs_scales) + (() if bias is None else (bias,))
    return scaled_dense_op.bind(*operands, activation=activation, want_aux=want_aux, out_dtype=jnp.dtype(out_dtype),
                                rhs_tiles=bool(rhs_tiles))  # fmt: skip
