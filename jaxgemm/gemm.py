"""`jaxgemm.matmul` and the `gemm_p` primitive behind it.

The primitive takes operands in a canonical form, `a: (*batch_a, rows, cols)` and
`b: (*batch_b, rows, cols)` of equal rank, where every batch dim of an operand is 1
(broadcast, read with stride 0 by the kernel) or the output's. `matmul` turns `jnp.matmul`
arguments into that form with free reshapes only, and every rule (batching, transpose)
goes back through the same `_gemm` helper.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from jaxgemm import _ffi  # noqa: F401  (registers the FFI targets)

SUPPORTED_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))
_MAX_KERNEL_BATCH_DIMS = 4  # BatchLayout's limit in ffi_src/gemm/problem.h


@dataclasses.dataclass(frozen=True)
class GemmConfig:
    """Static options of one `gemm_p` call (hashable: it is a primitive parameter)."""

    transpose_a: bool = False
    transpose_b: bool = False
    tf32: bool = False  # float32 inputs may run on tf32 tensor cores
    out_dtype: Any = jnp.dtype(jnp.float32)
    # K chunks computed in parallel and summed afterwards; None lets the GPU lowering pick.
    split_k: int | None = None
    # (tile_m, tile_n) of the CUDA SIMT kernel; None lets the handler's heuristic pick.
    simt_tile: tuple[int, int] | None = None


gemm_p = Primitive("jaxgemm_gemm")
# Split-K's fp32 partial products, (*batch, split_k, m, n); only ever bound inside
# gemm_p's lowering, so it needs no differentiation or batching rules.
gemm_partials_p = Primitive("jaxgemm_gemm_partials")


def _gemm_dims(a_shape, b_shape, config: GemmConfig):
    """(m, k, n, k_of_b) of a canonical call."""
    ar, ac = a_shape[-2:]
    br, bc = b_shape[-2:]
    m, k = (ac, ar) if config.transpose_a else (ar, ac)
    kb, n = (bc, br) if config.transpose_b else (br, bc)
    return m, k, n, kb


def _broadcast_batch(a_batch, b_batch):
    out = []
    for x, y in zip(a_batch, b_batch):
        if x != y and x != 1 and y != 1:
            return None
        out.append(y if x == 1 else x)
    return tuple(out)


def _gemm_abstract_eval(a, b, *, config: GemmConfig):
    if a.ndim < 2 or a.ndim != b.ndim:
        raise ValueError(f"gemm_p needs operands of equal rank >= 2, got a{a.shape} and b{b.shape}")
    if a.dtype != b.dtype:
        raise TypeError(f"gemm_p needs equal operand dtypes, got {a.dtype} and {b.dtype}")
    m, k, n, kb = _gemm_dims(a.shape, b.shape, config)
    if k != kb:
        raise ValueError(f"gemm_p: inner dimensions differ: a{a.shape} b{b.shape} with {config}")
    batch = _broadcast_batch(a.shape[:-2], b.shape[:-2])
    if batch is None:
        raise ValueError(f"gemm_p: batch dims do not broadcast: a{a.shape} b{b.shape}")
    return jax.core.ShapedArray(batch + (m, n), config.out_dtype)


def _ffi_call(ctx, a, b, config: GemmConfig, split_k: int):
    return jax.ffi.ffi_lowering("jaxgemm_gemm")(
        ctx,
        a,
        b,
        transpose_a=bool(config.transpose_a),
        transpose_b=bool(config.transpose_b),
        tf32=bool(config.tf32),
        alpha=np.float32(1.0),
        split_k=np.int64(split_k),
        tile_m=np.int64(config.simt_tile[0] if config.simt_tile else 0),
        tile_n=np.int64(config.simt_tile[1] if config.simt_tile else 0),
    )


def _partials_abstract_eval(a, b, *, config: GemmConfig, split_k: int):
    out = _gemm_abstract_eval(a, b, config=config)
    return jax.core.ShapedArray(out.shape[:-2] + (split_k,) + out.shape[-2:], jnp.float32)


def _split_k_for(a_aval, b_aval, config: GemmConfig, platform: str) -> int:
    if config.split_k is not None:
        return max(1, int(config.split_k))
    if platform != "cuda" or not _ffi.WITH_CUDA:
        return 1
    sm_count = _ffi.cuda_sm_count()
    if sm_count <= 0:
        return 1
    m, k, n, _ = _gemm_dims(a_aval.shape, b_aval.shape, config)
    batch = math.prod(_broadcast_batch(a_aval.shape[:-2], b_aval.shape[:-2]))
    return int(_ffi.simt_config(m, n, k, batch, sm_count)[2])


def _gemm_lowering(ctx, a, b, *, config: GemmConfig, platform: str):
    a_aval, b_aval = ctx.avals_in
    split_k = _split_k_for(a_aval, b_aval, config, platform)
    if split_k == 1:
        return _ffi_call(ctx, a, b, config, 1)

    def reduce_partials(a, b):
        # Summed in a fixed order by XLA's reduction: deterministic.
        partials = gemm_partials_p.bind(a, b, config=config, split_k=split_k)
        return partials.sum(axis=-3).astype(config.out_dtype)

    return mlir.lower_fun(reduce_partials, multiple_results=False)(ctx, a, b)


def _kernel_out_dtype(in_dtype, out_dtype):
    """The kernels write the input dtype or float32; other outputs are cast afterwards."""
    return out_dtype if out_dtype in (in_dtype, jnp.dtype(jnp.float32)) else jnp.dtype(jnp.float32)


def _collapse_batch(a, b):
    """Free reshapes that drop batch dims of size 1 in both operands and merge neighbouring
    dims with the same broadcast pattern; explicit broadcasting only if the kernel's batch
    rank would still be exceeded."""
    batch_a, batch_b = a.shape[:-2], b.shape[:-2]
    groups: list[list[int]] = []  # [size_a, size_b] per merged dim
    for x, y in zip(batch_a, batch_b):
        if x == 1 and y == 1:
            continue
        pattern = (x != 1, y != 1)
        if groups and (groups[-1][0] != 1, groups[-1][1] != 1) == pattern:
            groups[-1][0] *= x
            groups[-1][1] *= y
        else:
            groups.append([x, y])
    if len(groups) > _MAX_KERNEL_BATCH_DIMS:
        full = tuple(max(x, y) for x, y in zip(batch_a, batch_b))
        a = jnp.broadcast_to(a, full + a.shape[-2:])
        b = jnp.broadcast_to(b, full + b.shape[-2:])
        groups = [[math.prod(full), math.prod(full)]]
    a = a.reshape(tuple(g[0] for g in groups) + a.shape[-2:])
    b = b.reshape(tuple(g[1] for g in groups) + b.shape[-2:])
    return a, b


def _gemm(a, b, config: GemmConfig):
    """op(a) @ op(b) for operands whose batch dims broadcast (ranks may differ)."""
    rank = max(a.ndim, b.ndim)
    a = a.reshape((1,) * (rank - a.ndim) + a.shape)
    b = b.reshape((1,) * (rank - b.ndim) + b.shape)
    m, k, n, _ = _gemm_dims(a.shape, b.shape, config)
    batch = _broadcast_batch(a.shape[:-2], b.shape[:-2])
    out_shape = batch + (m, n)
    kernel_dtype = _kernel_out_dtype(a.dtype, config.out_dtype)
    if 0 in out_shape or k == 0:
        return jnp.zeros(out_shape, config.out_dtype)
    kernel_config = dataclasses.replace(config, out_dtype=kernel_dtype)
    if all(d == 1 for d in b.shape[:-2]) and not config.transpose_a:
        # B is shared by every batch: fold the batch into M, one large GEMM.
        a2 = a.reshape(-1, a.shape[-1])
        out = gemm_p.bind(a2, b.reshape(b.shape[-2:]), config=kernel_config)
        out = out.reshape(out_shape)
    else:
        a, b = _collapse_batch(a, b)
        out = gemm_p.bind(a, b, config=kernel_config).reshape(out_shape)
    return out.astype(config.out_dtype)


def _gemm_batching_rule(args, dims, *, config: GemmConfig):
    # Move the vmapped axis to the front; an unbatched operand gets a size-1 axis, which
    # the kernel broadcasts with stride 0 (no copy).
    a, b = args
    da, db = dims
    a = a[None] if da is None else jnp.moveaxis(a, da, 0)
    b = b[None] if db is None else jnp.moveaxis(b, db, 0)
    return _gemm(a, b, config), 0


def _unbroadcast(x, shape):
    """Sums x over the dims along which an operand of `shape` was broadcast."""
    lead = x.ndim - len(shape)
    if lead:
        x = x.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, (s, t) in enumerate(zip(x.shape, shape)) if t == 1 and s != 1)
    if axes:
        x = x.sum(axis=axes, keepdims=True)
    return x.reshape(shape)


def _transpose_lhs(ct, a, b, *, config: GemmConfig):
    aval = a.aval
    ct = ct.astype(aval.dtype)
    cfg = dataclasses.replace(config, out_dtype=aval.dtype, split_k=None, simt_tile=None)
    if config.transpose_a:  # A stored (K, M): dA = op(B) @ ct^T
        da = _gemm(b, ct, dataclasses.replace(cfg, transpose_a=config.transpose_b, transpose_b=True))
    else:  # dA = ct @ op(B)^T
        da = _gemm(ct, b, dataclasses.replace(cfg, transpose_a=False, transpose_b=not config.transpose_b))
    return _unbroadcast(da, aval.shape)


def _transpose_rhs(ct, a, b, *, config: GemmConfig):
    aval = b.aval
    ct = ct.astype(aval.dtype)
    cfg = dataclasses.replace(config, out_dtype=aval.dtype, split_k=None, simt_tile=None)
    if config.transpose_b:  # B stored (N, K): dB = ct^T @ op(A)
        db = _gemm(ct, a, dataclasses.replace(cfg, transpose_a=True, transpose_b=config.transpose_a))
    else:  # dB = op(A)^T @ ct
        db = _gemm(a, ct, dataclasses.replace(cfg, transpose_a=not config.transpose_a, transpose_b=False))
    return _unbroadcast(db, aval.shape)


@functools.partial(jax.jit, static_argnames="config")
def _gemm_impl(a, b, *, config: GemmConfig):
    # Eager calls compile the primitive alone, like any jitted function.
    return gemm_p.bind(a, b, config=config)


gemm_p.def_impl(_gemm_impl)
gemm_p.def_abstract_eval(_gemm_abstract_eval)
gemm_partials_p.def_abstract_eval(_partials_abstract_eval)
batching.primitive_batchers[gemm_p] = _gemm_batching_rule
ad.defbilinear(gemm_p, _transpose_lhs, _transpose_rhs)
for _platform in ("cpu", "cuda"):
    mlir.register_lowering(gemm_p, functools.partial(_gemm_lowering, platform=_platform), platform=_platform)
    mlir.register_lowering(
        gemm_partials_p,
        lambda ctx, a, b, *, config, split_k: _ffi_call(ctx, a, b, config, split_k),
        platform=_platform,
    )


_TF32_PRECISIONS = {"tensorfloat32", "tf32", "default", "high", "bfloat16_3x"}
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


def matmul(a, b, *, transpose_a=False, transpose_b=False, precision=None, out_dtype=None):
    """Matrix product with `jnp.matmul` semantics, on jaxgemm's kernels.

    Args:
      a: array of shape (..., M, K), or (..., K, M) with `transpose_a`; 1-D is a vector.
      b: array of shape (..., K, N), or (..., N, K) with `transpose_b`; 1-D is a vector.
        Leading batch dims broadcast against each other like `jnp.matmul`.
      transpose_a, transpose_b: use the transpose of the last two dims of the operand,
        read in place (no transposed copy is made).
      precision: for float32 inputs, None or "highest" computes in exact fp32;
        "tensorfloat32" (or an explicit `lax.Precision.DEFAULT`/`HIGH`) allows tf32.
      out_dtype: result dtype; defaults to the promoted input dtype.

    Returns:
      The product, accumulated in float32, of shape (*batch, M, N) (vector dims removed).

    Raises:
      TypeError: unsupported dtypes (float32, float16 and bfloat16 are supported).
      ValueError: rank-0 operands, mismatched inner dims or non-broadcastable batch dims.
    """
    a = jnp.asarray(a)
    b = jnp.asarray(b)
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"jaxgemm.matmul: operands must have rank >= 1, got shapes {a.shape} and {b.shape}")
    dtype = _check_dtype(jnp.result_type(a.dtype, b.dtype), "input")
    out_dtype = dtype if out_dtype is None else _check_dtype(out_dtype, "output")
    tf32 = _wants_tf32(precision) and dtype == jnp.float32
    a_vector, b_vector = a.ndim == 1, b.ndim == 1
    if a_vector:
        a, transpose_a = a[None, :], False
    if b_vector:
        b, transpose_b = b[:, None], False
    a, b = a.astype(dtype), b.astype(dtype)
    config = GemmConfig(bool(transpose_a), bool(transpose_b), tf32, out_dtype)
    m, k, n, kb = _gemm_dims(a.shape, b.shape, config)
    if k != kb:
        raise ValueError(
            f"jaxgemm.matmul: inner dimensions differ: a{a.shape} (transpose_a={transpose_a}) has "
            f"K={k}, b{b.shape} (transpose_b={transpose_b}) has K={kb}"
        )
    rank = max(a.ndim, b.ndim)
    batch_a = (1,) * (rank - a.ndim) + a.shape[:-2]
    batch_b = (1,) * (rank - b.ndim) + b.shape[:-2]
    if _broadcast_batch(batch_a, batch_b) is None:
        raise ValueError(
            f"jaxgemm.matmul: batch dims do not broadcast: a{a.shape[:-2]} vs b{b.shape[:-2]} "
            f"(full shapes a{a.shape}, b{b.shape})"
        )
    out = _gemm(a, b, config)
    if a_vector:
        out = out[..., 0, :]
    if b_vector:
        out = out[..., 0]
    return out
