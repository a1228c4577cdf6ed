"""fp8 training's quantization of a matrix into both orientations, in two passes over it
(ffi_src/quantize/fp8_quantize.h):

    s = x, or in the gradient's form s = dy * act'(at)   (a layer's dz)
    amax:     the largest |s| of each row and of each column (and the column sums of s)
    quantize: q = e4m3(s * (1 / row_scale)) (R, C), qt = e4m3(s^T * (1 / col_scale)) (C, R)
              (or both in e5m2, a gradient's format)

with scale = amax / 448 (1 where a row or column is all zeros; at least float32's smallest
normal, so that 1 / scale stays finite). q feeds the product that contracts the columns, qt
(transposed, K-major) the one that contracts the rows: fp8.dense's
x and x^T, w and w^T, dz and dz^T. Each pass reads s once (XLA's own fusions read it once
per reduction and per orientation); nothing between the passes holds s, in the gradient's
form not even dz.

With scales given (delayed scaling's, one for the whole tensor: quantize_tensor) the
quantize pass alone does the work, and writes the tensor's amax and the column sums too.

Two primitives in primitive.py's pattern. Sharded, a row's amax is the maximum over the
devices that split its columns, a column's over those that split its rows (all-reduces of
the amax vectors only; jnp's own reduction does the same), and the quantize pass needs no
collective. Inside shard_map each device's scales cover its own shard. On a CUDA GPU, and
on the CPU's FFI reference, a shard of columns a multiple of 8 and rows a multiple of 16
runs the kernels; anything else runs the same definition in jnp.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxgemm import activations, xla_cpu
from jaxgemm.primitive import Op, Result, Rule, all_to_front, define

E4M3 = jnp.float8_e4m3fn
E4M3_MAX = float(jnp.finfo(E4M3).max)  # 448
E5M2 = jnp.float8_e5m2  # (a gradient's wider range: fp8.dense's grad_format="e5m2")
AMAX_ROWS = 128  # rows per partial column sum of the amax pass (kAmaxRows)


def scales_of(amax, dtype=E4M3):
    """amax times 1 / 448 (dtype's largest value; the reciprocal rounded to float32 once, as
    XLA folds a division by a constant and as the block kernel computes it), or 1 where
    everything is zero. At least float32's smallest normal: below it 1 / scale is infinite
    and turns the zeros beside a tiny amax (< 1.3e-36) into NaN."""
    largest = float(jnp.finfo(dtype).max)
    scales = jnp.maximum(amax * np.float32(1.0 / largest), np.finfo(np.float32).tiny)
    return jnp.where(amax > 0, scales, 1.0)


def to_fp8(s, scales, dtype=E4M3):
    """s times 1 / scales in dtype (e4m3 or e5m2), rounded to nearest, saturated to its
    largest value (a multiply a value: the kernels' quantize pass is bound by its issue
    rate, division costs ~8 instructions)."""
    largest = float(jnp.finfo(dtype).max)
    return jnp.clip(s * (1.0 / scales), -largest, largest).astype(dtype)


def _source(x, at, activation):
    """s in float32: x, or x * act'(at)."""
    s = x.astype(jnp.float32)
    return s if at is None else s * activations.derivative(activation, at)


def _on_ffi(platform) -> bool:
    """A CUDA GPU, or the CPU's FFI reference (not the XLA CPU route)."""
    return platform == "cuda" or (platform == "cpu" and not xla_cpu.enabled(platform))


def _on_kernel(x, platform) -> bool:
    """Where the two-pass kernels take x: columns a multiple of 8, rows of 16."""
    rows, cols = x.shape
    return _on_ffi(platform) and rows % 16 == 0 and cols % 8 == 0 and rows > 0 and cols > 0


def _empty():
    return jnp.zeros((0,), jnp.float32)


# ---------------------------------------------------------------------------------------
# The amax pass: x (R, C) [, at] -> row amax (R,), column amax (C,) [, column sums (C,)].


def _amax_abstract(x, *at, activation, want_sum):
    rows, cols = x.shape
    return [Result((rows,), jnp.float32), Result((cols,), jnp.float32)] + [Result((cols,), jnp.float32)] * want_sum


def _amax_rule(x, *at, activation, want_sum):
    return Rule((("r", "c"),) * (1 + len(at)), (("r",), ("c",)) + (("c",),) * want_sum)


def _amax_local(x, *at, activation, want_sum, platform, axes):
    at = at[0] if at else None
    rows, cols = x.shape
    if _on_kernel(x, platform):
        chunks = -(-rows // AMAX_ROWS)
        results = (jax.ShapeDtypeStruct((rows,), jnp.float32), jax.ShapeDtypeStruct((cols,), jnp.float32),
                   jax.ShapeDtypeStruct((chunks, cols) if want_sum else (0,), jnp.float32))  # fmt: skip
        row_amax, col_amax, partials = jax.ffi.ffi_call("jaxgemm_fp8_amax", results)(
            x, _empty().astype(x.dtype) if at is None else at,
            activation=np.int64(activations.activation_id(activation)))  # fmt: skip
        col_sum = partials.sum(axis=0)
    else:
        s = _source(x, at, activation)
        row_amax, col_amax, col_sum = jnp.max(jnp.abs(s), axis=1), jnp.max(jnp.abs(s), axis=0), jnp.sum(s, axis=0)
    # A row's amax over the devices that split its columns, a column's over those that split its rows.
    row_amax = jax.lax.pmax(row_amax, axes["c"]) if axes.get("c") else row_amax
    col_amax = jax.lax.pmax(col_amax, axes["r"]) if axes.get("r") else col_amax
    if not want_sum:
        return [row_amax, col_amax]
    return [row_amax, col_amax, jax.lax.psum(col_sum, axes["r"]) if axes.get("r") else col_sum]


def _amax_batch(args, dims, *, activation, want_sum):
    """vmap: the definition in jnp on each matrix."""
    args = all_to_front(args, dims)
    outs = jax.vmap(lambda x, *at: _amax_local(x, *at, activation=activation, want_sum=want_sum, platform="jnp",
                                               axes={}))(*args)  # fmt: skip
    return list(outs), [0] * len(outs)


fp8_amax_op = define(Op("jaxgemm_fp8_amax", abstract=_amax_abstract, rule=_amax_rule, local=_amax_local,
                        batch=_amax_batch))  # fmt: skip


# ---------------------------------------------------------------------------------------
# The quantize pass: x (R, C) [, at], row scales (R,) or (1,), column scales (C,) or (1,)
# -> q, qt [, amax (1,)] [, column sums (C,)]. One scale for all: per-tensor scaling; the
# amax (of the whole tensor) and the sums are delayed scaling's, which has no amax pass.


def _quantize_abstract(x, *rest, activation, dtype, want_amax=False, want_sum=False):
    rows, cols = x.shape
    f32 = jnp.float32
    return ([Result((rows, cols), jnp.dtype(dtype)), Result((cols, rows), jnp.dtype(dtype))]
            + [Result((1,), f32)] * want_amax + [Result((cols,), f32)] * want_sum)  # fmt: skip


def _quantize_rule(x, *rest, activation, dtype, want_amax=False, want_sum=False):
    row_scale, col_scale = rest[-2:]
    scale_dims = tuple((f,) if s.shape[0] > 1 or n == 1 else (f + "1",)
                       for f, s, n in (("r", row_scale, x.shape[0]), ("c", col_scale, x.shape[1])))  # fmt: skip
    results = (("r", "c"), ("c", "r")) + (("one",),) * want_amax + (("c",),) * want_sum
    return Rule((("r", "c"),) * (len(rest) - 1) + scale_dims, results, replicated=frozenset({"r1", "c1", "one"}))


def _quantize_local(x, *rest, activation, dtype, want_amax=False, want_sum=False, platform, axes):
    at, (row_scale, col_scale) = (rest[0] if len(rest) == 3 else None), rest[-2:]
    rows, cols = x.shape
    if _on_kernel(x, platform):  # (the kernel writes e4m3 or e5m2: q's dtype)
        f32, fp8 = jnp.float32, jnp.dtype(dtype)
        results = (jax.ShapeDtypeStruct((rows, cols), fp8), jax.ShapeDtypeStruct((cols, rows), fp8),
                   jax.ShapeDtypeStruct((1 if want_amax else 0,), f32),
                   jax.ShapeDtypeStruct((-(-rows // AMAX_ROWS), cols) if want_sum else (0,), f32))  # fmt: skip
        q, qt, amax, partials = jax.ffi.ffi_call("jaxgemm_fp8_quantize", results)(
            x, _empty().astype(x.dtype) if at is None else at, row_scale, col_scale,
            activation=np.int64(activations.activation_id(activation)))  # fmt: skip
        col_sum = partials.sum(axis=0)
    else:
        s = _source(x, at, activation)
        q, qt = to_fp8(s, row_scale[:, None], dtype), to_fp8(s, col_scale[None, :], dtype).T
        amax, col_sum = jnp.max(jnp.abs(s)).reshape(1), jnp.sum(s, axis=0)
    outs = [q, qt]
    if want_amax:  # (the whole tensor's: a max over every device that holds part of it)
        split = tuple(axes.get("r", ())) + tuple(axes.get("c", ()))
        outs.append(jax.lax.pmax(amax, split) if split else amax)
    if want_sum:
        outs.append(jax.lax.psum(col_sum, axes["r"]) if axes.get("r") else col_sum)
    return outs


def _quantize_batch(args, dims, *, activation, dtype, want_amax=False, want_sum=False):
    args = all_to_front(args, dims)
    local = lambda *a: _quantize_local(*a, activation=activation, dtype=dtype, want_amax=want_amax,  # noqa: E731
                                       want_sum=want_sum, platform="jnp", axes={})  # fmt: skip
    outs = jax.vmap(local)(*args)
    return list(outs), [0] * len(outs)


fp8_quantize_op = define(Op("jaxgemm_fp8_quantize", abstract=_quantize_abstract, rule=_quantize_rule,
                            local=_quantize_local, batch=_quantize_batch))  # fmt: skip


# ---------------------------------------------------------------------------------------
# Blockwise, one pass: x (R, C) [, at] -> q, q's 1 x 128 scales (R, C / 128), qt, qt's
# (C, R / 128) [, column sums (C,)]; `tiles`: one scale per 128 x 128 tile (weights), on
# each of its rows in both orientations.

BLOCK = 128


def _block_dims(x):
    """Rows and columns as compound factors (blocks, values in one) that shard on whole
    blocks only; a dim of one block has no block factor (Shardy takes none of size 1)."""
    rows, cols = x.shape
    return (("rb", "rs") if rows > BLOCK else "rs"), (("cb", "cs") if cols > BLOCK else "cs")


def _block_abstract(x, *at, activation, tiles, want_sum, dtype):
    rows, cols = x.shape
    f32 = jnp.float32
    q = jnp.dtype(dtype)
    return ([Result((rows, cols), q), Result((rows, cols // BLOCK), f32), Result((cols, rows), q),
             Result((cols, rows // BLOCK), f32)] + [Result((cols,), f32)] * want_sum)  # fmt: skip


def _block_rule(x, *at, activation, tiles, want_sum, dtype):
    r, c = _block_dims(x)
    rb = "rb" if isinstance(r, tuple) else "rb1"  # (a single block: a size-1 dim of its own)
    cb = "cb" if isinstance(c, tuple) else "cb1"
    results = ((r, c), (r, cb), (c, r), (c, rb)) + ((c,),) * want_sum
    sizes = tuple((f, BLOCK) for f, d in (("rs", r), ("cs", c)) if isinstance(d, tuple))
    return Rule(((r, c),) * (1 + len(at)), results, replicated=frozenset({"rb1", "cb1"}), factor_sizes=sizes)


def _blockwise_jnp(s, tiles, dtype=E4M3):
    """The definition on s (float32, (R, C) multiples of 128): (q, q_scale, qt, qt_scale)."""
    rows, cols = s.shape
    t = s.reshape(rows // BLOCK, BLOCK, cols // BLOCK, BLOCK)
    if tiles:
        scale = jnp.broadcast_to(scales_of(jnp.max(jnp.abs(t), axis=(1, 3), keepdims=True), dtype), t.shape)
        row_scale, col_scale = scale, scale
    else:
        row_scale = jnp.broadcast_to(scales_of(jnp.max(jnp.abs(t), axis=3, keepdims=True), dtype), t.shape)
        col_scale = jnp.broadcast_to(scales_of(jnp.max(jnp.abs(t), axis=1, keepdims=True), dtype), t.shape)
    q = to_fp8(t, row_scale, dtype).reshape(rows, cols)
    qt = to_fp8(t, col_scale, dtype).reshape(rows, cols).T
    q_scale = row_scale[:, :, :, 0].reshape(rows, cols // BLOCK)
    qt_scale = col_scale[:, 0, :, :].transpose(1, 2, 0).reshape(cols, rows // BLOCK)
    return q, q_scale, qt, qt_scale


def _block_local(x, *at, activation, tiles, want_sum, dtype, platform, axes):
    at = at[0] if at else None
    rows, cols = x.shape
    if _on_ffi(platform):  # (the kernel writes e4m3 or e5m2: q's dtype)
        f32, fp8 = jnp.float32, jnp.dtype(dtype)
        results = (jax.ShapeDtypeStruct((rows, cols), fp8), jax.ShapeDtypeStruct((rows, cols // BLOCK), f32),
                   jax.ShapeDtypeStruct((cols, rows), fp8), jax.ShapeDtypeStruct((cols, rows // BLOCK), f32),
                   jax.ShapeDtypeStruct((rows // BLOCK, cols) if want_sum else (0,), f32))  # fmt: skip
        *outs, partials = jax.ffi.ffi_call("jaxgemm_fp8_block_quantize", results)(
            x, _empty().astype(x.dtype) if at is None else at,
            activation=np.int64(activations.activation_id(activation)), tiles=bool(tiles))  # fmt: skip
        col_sum = partials.sum(axis=0)
    else:
        s = _source(x, at, activation)
        outs, col_sum = list(_blockwise_jnp(s, tiles, dtype)), jnp.sum(s, axis=0)
    if not want_sum:
        return outs
    return outs + [jax.lax.psum(col_sum, axes["rb"]) if axes.get("rb") else col_sum]


def _block_batch(args, dims, *, activation, tiles, want_sum, dtype):
    args = all_to_front(args, dims)
    outs = jax.vmap(lambda x, *at: _block_local(x, *at, activation=activation, tiles=tiles, want_sum=want_sum,
                                                dtype=dtype, platform="jnp", axes={}))(*args)  # fmt: skip
    return list(outs), [0] * len(outs)


fp8_block_quantize_op = define(Op("jaxgemm_fp8_block_quantize", abstract=_block_abstract, rule=_block_rule,
                                  local=_block_local, batch=_block_batch))  # fmt: skip


def _check_format(name, dtype):
    if jnp.dtype(dtype) not in (jnp.dtype(E4M3), jnp.dtype(E5M2)):
        raise ValueError(f"{name}: dtype must be float8_e4m3fn or float8_e5m2, got {jnp.dtype(dtype)}")


def quantize_blocks_both(x, at=None, activation=None, *, tiles=False, want_sum=False, dtype=E4M3):
    """x (R, C), or dz = x * act'(at), both multiples of 128, in e4m3 (or `dtype`
    float8_e5m2) both ways with 1 x 128 block scales along each orientation's last
    dim (or with `tiles` one scale per 128 x 128 tile): (q (R, C), its scales (R, C / 128),
    qt (C, R), its scales (C, R / 128)), and with want_sum the column sums of the source
    (C,) after them."""
    if x.ndim != 2 or x.shape[0] % BLOCK or x.shape[1] % BLOCK or (at is not None and at.shape != x.shape):
        raise ValueError(f"quantize_blocks_both: needs x (R, C) of multiples of {BLOCK} and at like it, got "
                         f"x{x.shape}" + ("" if at is None else f" and at{at.shape}"))  # fmt: skip
    _check_format("quantize_blocks_both", dtype)
    operands = (x,) if at is None else (x, at.astype(x.dtype))
    return tuple(fp8_block_quantize_op.bind(*operands, activation=None if at is None else activation, tiles=tiles,
                                            want_sum=want_sum, dtype=jnp.dtype(dtype).name))  # fmt: skip


def _matrix_source(name, x, at, activation, dtype):
    """The passes' operands (x, or x and at in x's dtype) and activation (None without at),
    or a ValueError naming the shapes unless x is (R, C) and at like it, and dtype e4m3 or
    e5m2."""
    if x.ndim != 2 or (at is not None and at.shape != x.shape):
        raise ValueError(f"{name}: needs x (R, C) and at like it, got x{x.shape}"
                         + ("" if at is None else f" and at{at.shape}"))  # fmt: skip
    _check_format(name, dtype)
    return ((x,) if at is None else (x, at.astype(x.dtype))), (None if at is None else activation)


def quantize_both(x, at=None, activation=None, *, want_sum=False, dtype=E4M3):
    """x (R, C), or dz = x * act'(at) where `at` is given, in e4m3 (or `dtype` float8_e5m2)
    both ways:
    (q (R, C), row scales (R, 1), qt (C, R), column scales (C, 1)), and with want_sum the
    column sums of the source in float32 (C,) after them (a bias gradient). `activation`: a
    canonical name (activations.canonical) or None."""
    operands, activation = _matrix_source("quantize_both", x, at, activation, dtype)
    row_amax, col_amax, *col_sum = fp8_amax_op.bind(*operands, activation=activation, want_sum=want_sum)
    row_scale, col_scale = scales_of(row_amax, dtype), scales_of(col_amax, dtype)
    q, qt = fp8_quantize_op.bind(*operands, row_scale, col_scale, activation=activation, dtype=jnp.dtype(dtype).name)
    return (q, row_scale[:, None], qt, col_scale[:, None]) + tuple(col_sum)


def quantize_tensor(x, scale, at=None, activation=None, *, want_sum=False, dtype=E4M3):
    """x (R, C), or dz = x * act'(at), in e4m3 (or `dtype` float8_e5m2) both ways with one
    given float32 `scale` for the whole tensor, in one pass: (q (R, C), qt (C, R),
    amax), amax the largest |source| (a float32 scalar, over every device that holds part
    of it), and with want_sum the column sums (C,) after them. Delayed scaling's pass: the
    scale comes from earlier steps' amax, this step's is recorded for the next."""
    operands, activation = _matrix_source("quantize_tensor", x, at, activation, dtype)
    scale = jnp.reshape(jnp.asarray(scale, jnp.float32), (1,))
    q, qt, amax, *col_sum = fp8_quantize_op.bind(*operands, scale, scale, activation=activation, want_amax=True,
                                                 dtype=jnp.dtype(dtype).name, want_sum=want_sum)  # fmt: skip
    return (q, qt, amax[0]) + tuple(col_sum)
