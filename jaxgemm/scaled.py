"""jaxgemm.scaled_matmul: block-scaled products of low-precision operands (fp8 training's
GEMM), with `jax.nn.scaled_matmul`'s semantics and argument names:

    out[b, m, n] = sum_k lhs[b, m, k] * lhs_scales[b, m, k // bs] * rhs[b, n, k] * rhs_scales[b, n, k // bs]

lhs (B, M, K) and rhs (B, N, K) both K-major (as Hopper's fp8 wgmma takes them), their
scales (B, M, KB) and (B, N, KB), one per row and block of bs = K // KB values along K.
Per-tensor scaling is KB = 1 with every row's scale equal; 1 x 128 activations and
128 x 128 weights (DeepSeek-V3's recipe) are KB = K / 128 with each weight block's scale
repeated over its 128 rows, or, beyond jax.nn's API, rhs_scales (B, ceil(N / 128), KB):
one per 128-row tile of rhs (DeepGEMM's form), repeated over the tile's rows here.

One primitive in primitive.py's pattern. Its rule makes K a compound dim: its blocks
("kb", the scales' last dim) and the values inside a block ("ks", bs of them, never
split), so K shards only on whole blocks and every scale travels with its block (with a
single block, per-row scales, K splits anywhere and the scales stay whole): B, M and N
split with no collective, K into partial products and one all-reduce (a reduce-scatter
where the result is wanted split), as for jaxgemm.matmul.

Its `local`, for float8_e4m3fn operands on a Hopper GPU:
- one scale per row (KB = 1, per-tensor scaling included): the sm90 GEMM on fp8 (k32 wgmma,
  both operands K-major, the tensor cores' fp8 accumulation), the row and column scales
  applied in its epilogue;
- blocks of a multiple of 128 values (KB > 1): the block-scaled sm90 kernel, which adds
  each 128-deep k-tile's products into fp32 accumulators times the block's row and column
  scales (jaxgemm_block_scaled_gemm; the scales travel transposed, (B, KB, rows)). Where
  the caller knows rhs's scales repeat over 128-row tiles (fp8.dense's weights: the op's
  `rhs_tiles`), the kernel takes one scale per 64 rows of rhs instead and its promotion
  is one multiply-add a value instead of two float ops (on a GPU, for now, only under
  JAXGEMM_BLOCK_SCALE_GROUPS=1: GROUPS_ON_CUDA_VARIABLE).
Both also take float8_e5m2 beside e4m3, in either operand (a gradient's format:
TransformerEngine's HYBRID recipe). Everything else (smaller blocks, e5m2 x e5m2, other
GPUs, the CPU) dequantizes into float32 and runs XLA's dot, which is what XLA itself does
for `jax.nn.scaled_matmul` on Hopper. Not differentiable: fp8 training quantizes around
it, in the forward and the backward of a layer (`jaxgemm.fp8.dense`).
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxgemm import _ffi, activations, xla_cpu
from jaxgemm._compat import xla_out_sharding
from jaxgemm.gemm import GemmConfig, call_gemm_ffi, gemm_workspace_bytes
from jaxgemm.primitive import (
    Op,
    Result,
    Rule,
    all_to_front,
    canonical_out_sharding,
    constrain_output,
    define,
    psum_over,
)

_FLOATS = ("float8_e4m3fn", "float8_e5m2", "bfloat16", "float16", "float32")
_SCALE_FLOATS = ("float32", "bfloat16", "float16", "float8_e8m0fnu")


def _abstract(lhs, rhs, lhs_scales, rhs_scales, *, out_dtype, out_sharding=None, rhs_tiles=False):
    return [Result((lhs.shape[0], lhs.shape[1], rhs.shape[1]), out_dtype)]


def product_rule(lhs, rhs, lhs_scales, rhs_scales, **params):
    """K = its blocks x the values in one, a compound dim where both exceed 1 (Shardy takes
    no factor of size 1 in one). With one block (per-row or per-tensor scales) K splits
    anywhere: each device scales its partial sums by the whole rows' scales, which every
    device holds. Blocks of one value split K as freely as the scales."""
    blocks, block = lhs_scales.shape[2], lhs.shape[2] // lhs_scales.shape[2]
    k, sizes = ("kb", "ks"), (("ks", block),)
    if blocks == 1:
        k, sizes = "ks", ()
    elif block == 1:
        k, sizes = "kb", ()
    return Rule((("b", "m", k), ("b", "n", k), ("b", "m", "kb"), ("b", "n", "kb")), (("b", "m", "n"),),
                factor_sizes=sizes)  # fmt: skip


def _dequantized(x, scales):
    """x (B, R, K) times its scales (B, R, KB), as float32."""
    b, r, k = x.shape
    kb = scales.shape[2]
    x = x.astype(jnp.float32).reshape(b, r, kb, k // kb) * scales.astype(jnp.float32)[..., None]
    return x.reshape(b, r, k)


# K values per k-tile of the block-scaled kernel: its blocks are whole k-tiles.
BLOCK_SCALE_GRANULE = 128
# Rows of rhs per scale that the block-scaled kernel takes where they repeat over tiles.
_RHS_SCALE_GROUP = 64
# Rows of rhs per scale in rhs_scales's tiled form.
RHS_TILE_ROWS = 128


def _tiled_form(rhs_shape, rhs_scales_shape) -> bool:
    """Whether rhs_scales (B, ceil(N / 128), KB) is the tiled form (not one scale per row)."""
    n, rows = rhs_shape[1], rhs_scales_shape[1]
    return rows != n and rows == -(-n // RHS_TILE_ROWS)


def _scales_per_row(tile_scales, n):
    """Tile scales (B, T, KB) repeated over each tile's 128 rows: (B, N, KB). A broadcast
    and a reshape (not jnp.repeat), so that tiles split over devices stay split by rows."""
    b, t, kb = tile_scales.shape
    rows = jnp.broadcast_to(tile_scales[:, :, None, :], (b, t, RHS_TILE_ROWS, kb)).reshape(b, t * RHS_TILE_ROWS, kb)
    return rows if t * RHS_TILE_ROWS == n else rows[:, :n]


def _on_fp8_platform(platform: str) -> bool:
    """A Hopper GPU, or the CPU's FFI reference (JAXGEMM_CPU=ffi, which the tests use)."""
    if platform == "cuda":
        return _ffi.hopper()
    return platform == "cpu" and not xla_cpu.enabled(platform)


_E4M3, _E5M2 = jnp.dtype(jnp.float8_e4m3fn), jnp.dtype(jnp.float8_e5m2)


def _fp8_pair(lhs, rhs) -> bool:
    """e4m3 x e4m3, or e5m2 (a gradient's format) beside e4m3 in either order."""
    return {lhs.dtype, rhs.dtype} <= {_E4M3, _E5M2} and _E4M3 in (lhs.dtype, rhs.dtype)


def runs_on_fp8_kernel(lhs, rhs, lhs_scales, platform: str) -> bool:
    """Whether the product runs on the fp8 GEMM: e4m3 operands, or e5m2 beside e4m3, with
    16-byte rows and one scale per row, on a Hopper GPU (or the CPU's FFI reference)."""
    k = lhs.shape[2]
    return _fp8_pair(lhs, rhs) and lhs_scales.shape[2] == 1 and k > 0 and k % 16 == 0 and _on_fp8_platform(platform)


def runs_on_block_scaled_kernel(lhs, rhs, lhs_scales, platform: str) -> bool:
    """Whether the product runs on the block-scaled fp8 GEMM: e4m3 operands (or e5m2 beside
    e4m3), more than one block along K, each a multiple of 128 values, on a Hopper GPU (or
    the CPU's FFI reference)."""
    blocks, k = lhs_scales.shape[2], lhs.shape[2]
    block = k // blocks if blocks else 0
    return (_fp8_pair(lhs, rhs) and blocks > 1 and block > 0 and block % BLOCK_SCALE_GRANULE == 0
            and _on_fp8_platform(platform))  # fmt: skip


def _kernel_dtype(out_dtype):
    """What the fp8 kernels write for out_dtype: bfloat16 or float32 (float16 is rounded from
    float32 after them)."""
    return jnp.dtype(jnp.bfloat16) if out_dtype == jnp.bfloat16 else jnp.dtype(jnp.float32)


def fp8_kernel_call(lhs, rhs, lhs_scales, rhs_scales, out_dtype, platform, *, bias=None, activation=None,
                    want_aux=False, tile=None):  # fmt: skip
    """[out] (or [out, z] with want_aux) of the fp8 kernel: sum_k lhs[b, m, k] rhs[b, n, k]
    times the row scale of lhs and of rhs (the row_scale and col_scale operands, float32),
    then the bias (B, N) and the activation (a canonical name), all in its epilogue. The
    kernel writes bfloat16 or float32 (a float16 result is rounded from float32). `tile`:
    the sm90 schedule's (tile_m, tile_n), forced (tools/fp8_forward_sweep.py); None: the
    heuristic's."""
    kernel_dtype = _kernel_dtype(out_dtype)
    config = GemmConfig(transpose_b=True, out_dtype=kernel_dtype, split_k=1, kernel="sm90" if tile else None, tile=tile)
    outs = call_gemm_ffi(
        lhs, rhs, config=config, out_shape=(lhs.shape[0], lhs.shape[1], rhs.shape[1]),
        workspace_bytes=gemm_workspace_bytes(lhs.shape, rhs.shape, lhs.dtype, config, 1, platform),
        row_scale=lhs_scales[..., 0].astype(jnp.float32), col_scale=rhs_scales[..., 0].astype(jnp.float32),
        bias=None if bias is None else bias.astype(kernel_dtype), activation=activations.activation_id(activation),
        want_aux=want_aux,
    )  # fmt: skip
    return [x.astype(out_dtype) for x in outs[: 2 if want_aux else 1]]


def _scales_by_block(scales):
    """(B, R, KB) -> (B, KB, R') float32 with R' >= R a multiple of 4: the kernel loads one
    block's scales of a tile's rows as one 16-byte-aligned run."""
    s = jnp.swapaxes(scales.astype(jnp.float32), 1, 2)
    pad = -s.shape[2] % 4
    return jnp.pad(s, ((0, 0), (0, 0), (0, pad))) if pad else s


# The groups kernel has not run on a GPU since its scale box was moved onto 16 bytes (NOTES.md,
# "Open: fp8 on Hopper"): on CUDA it waits for JAXGEMM_BLOCK_SCALE_GROUPS=1 until it has.
GROUPS_ON_CUDA_VARIABLE = "JAXGEMM_BLOCK_SCALE_GROUPS"


def rhs_groups(rhs, rhs_tiles, axes, platform) -> bool:
    """Whether the block-scaled kernel may take rhs's scales one per 64 rows: the caller
    promised they repeat over 128-row tiles from rhs's first row, and this shard's rows
    start on a group (N unsplit, or split into shards of whole groups)."""
    enabled = platform != "cuda" or os.environ.get(GROUPS_ON_CUDA_VARIABLE) == "1"
    return enabled and rhs_tiles and (not axes.get("n") or rhs.shape[1] % _RHS_SCALE_GROUP == 0)


def block_scaled_kernel_call(lhs, rhs, lhs_scales, rhs_scales, out_dtype, *, bias=None, activation=None,
                             want_aux=False, groups=False):  # fmt: skip
    """[out] (or [out, z] with want_aux) of the block-scaled fp8 kernel: each 128-deep
    k-tile's products times its block's row scales, summed in float32, then the bias (B or
    1, N) and the activation (a canonical name) in its epilogue. The kernel writes bfloat16
    or float32 (a float16 result is rounded from float32). `groups` (rhs_groups): rhs's
    scales are passed one per 64 rows."""
    kernel_dtype = _kernel_dtype(out_dtype)
    group = _RHS_SCALE_GROUP if groups else 1
    shape = (lhs.shape[0], lhs.shape[1], rhs.shape[1])
    results = (jax.ShapeDtypeStruct(shape, kernel_dtype), jax.ShapeDtypeStruct(shape if want_aux else (0,), kernel_dtype))
    bias = jnp.zeros((0,), kernel_dtype) if bias is None else bias.astype(kernel_dtype)
    outs = jax.ffi.ffi_call("jaxgemm_block_scaled_gemm", results)(
        lhs, rhs, _scales_by_block(lhs_scales), _scales_by_block(rhs_scales[:, ::group]), bias,
        activation=np.int64(activations.activation_id(activation)), b_scale_rows=np.int64(group),
    )  # fmt: skip
    return [x.astype(out_dtype) for x in outs[: 2 if want_aux else 1]]


def _dequantized_product(lhs, rhs, lhs_scales, rhs_scales, out_dtype, out_sharding):
    """The definition in XLA: both operands dequantized into float32, then an exact dot."""
    a, b = _dequantized(lhs, lhs_scales), _dequantized(rhs, rhs_scales)
    # (The whole-trace typing; the primitive's out_sharding where it has one.)
    typed = xla_out_sharding(a, b, [(0, 0), (0, 1), (1, 1)])
    typed = {"out_sharding": out_sharding} if typed and out_sharding is not None else typed
    return jnp.einsum("bmk,bnk->bmn", a, b, precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32,
                      **typed).astype(out_dtype)  # fmt: skip


def scaled_local(lhs, rhs, lhs_scales, rhs_scales, *, out_dtype, platform, out_sharding=None, axes=None,
                 rhs_tiles=False):  # fmt: skip
    """The op on one device's shards (its K factors "kb" and "ks" summed over `axes`)."""
    axes = axes or {}
    if runs_on_fp8_kernel(lhs, rhs, lhs_scales, platform):
        (out,) = fp8_kernel_call(lhs, rhs, lhs_scales, rhs_scales, out_dtype, platform)
    elif runs_on_block_scaled_kernel(lhs, rhs, lhs_scales, platform):
        (out,) = block_scaled_kernel_call(lhs, rhs, lhs_scales, rhs_scales, out_dtype,
                                          groups=rhs_groups(rhs, rhs_tiles, axes, platform))  # fmt: skip
    else:
        out = _dequantized_product(lhs, rhs, lhs_scales, rhs_scales, out_dtype, out_sharding)
    # K sharded: partial products in the output dtype, summed as XLA sums its dots'.
    return [psum_over(out, axes, ("kb", "ks"), ("b", "m", "n"))]


def _batch(args, dims, *, out_dtype, out_sharding=None, rhs_tiles=False):
    """vmap: the vmapped axis folded into B (every operand has it, broadcast if unbatched)."""
    args = all_to_front(args, dims)
    v = args[0].shape[0]
    (out,) = scaled_matmul_op.bind(*(x.reshape((-1,) + x.shape[2:]) for x in args), out_dtype=out_dtype,
                                   rhs_tiles=rhs_tiles)  # fmt: skip
    return [out.reshape((v, -1) + out.shape[1:])], [0]


scaled_matmul_op = define(Op(
    "jaxgemm_scaled_matmul", abstract=_abstract, rule=product_rule, local=scaled_local, batch=_batch, rule_on_cpu=True,
))  # fmt: skip


def _check(lhs, rhs, lhs_scales, rhs_scales, out_dtype):
    """TypeError / ValueError naming the shapes and dtypes for anything the op cannot take."""
    shapes = f"lhs {lhs.shape}, rhs {rhs.shape}, lhs_scales {lhs_scales.shape}, rhs_scales {rhs_scales.shape}"
    for name, x, allowed in (("lhs", lhs, _FLOATS), ("rhs", rhs, _FLOATS), ("lhs_scales", lhs_scales, _SCALE_FLOATS),
                             ("rhs_scales", rhs_scales, _SCALE_FLOATS)):  # fmt: skip
        if jnp.dtype(x.dtype).name not in allowed:
            raise TypeError(f"scaled_matmul: {name} has dtype {x.dtype}; it takes {', '.join(allowed)}")
    if not jnp.issubdtype(out_dtype, jnp.floating) or jnp.dtype(out_dtype).itemsize < 2:
        raise TypeError(f"scaled_matmul: preferred_element_type must be float32, bfloat16 or float16, got {out_dtype}")
    if any(x.ndim != 3 for x in (lhs, rhs, lhs_scales, rhs_scales)):
        raise ValueError(f"scaled_matmul: every operand must be 3-D (B, rows, K or KB); got {shapes}")
    (b, m, k), (b2, n, k2), (kb, kb2) = lhs.shape, rhs.shape, (lhs_scales.shape[2], rhs_scales.shape[2])
    if b2 != b or k2 != k:
        raise ValueError(f"scaled_matmul: lhs (B, M, K) and rhs (B, N, K) must agree on B and K; got {shapes}")
    rhs_rows_ok = rhs_scales.shape[1] == n or _tiled_form(rhs.shape, rhs_scales.shape)
    if lhs_scales.shape[:2] != (b, m) or rhs_scales.shape[0] != b or not rhs_rows_ok:
        raise ValueError(f"scaled_matmul: lhs_scales must be (B, M, KB) and rhs_scales (B, N, KB) or (B, ceil(N / "
                         f"128), KB); got {shapes}")  # fmt: skip
    if kb != kb2 or kb < 1 or k % kb:
        raise ValueError(f"scaled_matmul: both scales need the same number KB >= 1 of blocks along K, and KB must "
                         f"divide K; got {shapes}")  # fmt: skip


def scaled_matmul(lhs, rhs, lhs_scales, rhs_scales, preferred_element_type=jnp.float32, *, out_sharding=None):
    """Block-scaled matrix product, as `jax.nn.scaled_matmul`:
    out[b, m, n] = sum_k lhs[b, m, k] lhs_scales[b, m, k // bs] rhs[b, n, k] rhs_scales[b, n, k // bs].

    Args:
      lhs: (B, M, K), float8_e4m3fn, float8_e5m2 or a 16/32-bit float.
      rhs: (B, N, K), the same kinds (K-major: the contraction is both last dims).
      lhs_scales: (B, M, KB), KB dividing K: one scale per row and block of K // KB values
        (float32, bfloat16, float16 or float8_e8m0fnu).
      rhs_scales: (B, N, KB), the same KB; or (B, ceil(N / 128), KB), one per 128-row tile
        of rhs (128 x 128 weight blocks with KB = K / 128, DeepGEMM's form).
      preferred_element_type: the result's dtype (float32 by default, as jax.nn's).
      out_sharding: the result's sharding, as `jnp.matmul`'s (Explicit mode; needed where K
        is sharded in both operands).

    Returns:
      (B, M, N) in preferred_element_type. Sharded like a GEMM: B, M and N split with no
      collective; K split on whole blocks, its scales with it (anywhere with KB = 1), then
      one all-reduce.

    float8_e4m3fn operands (or float8_e5m2 beside e4m3, in either operand) run on jaxgemm's
    fp8 kernels on a Hopper GPU: with one scale per row (KB = 1), or with blocks of a
    multiple of 128 values along K (the scales applied in the kernel's mainloop, per
    128-deep k-tile). Everything else runs as XLA runs it on Hopper (dequantized into
    float32, then a dot). Not differentiable (fp8 training quantizes around the product)."""
    return scaled_matmul_tiled(lhs, rhs, lhs_scales, rhs_scales, preferred_element_type, out_sharding=out_sharding)


def scaled_matmul_tiled(lhs, rhs, lhs_scales, rhs_scales, preferred_element_type=jnp.float32, *, out_sharding=None,
                        rhs_tiles=False):  # fmt: skip
    """scaled_matmul, where rhs_tiles=True promises that rhs_scales repeat each value over
    128-row tiles of rhs from its first row (fp8.dense's weights, quantize_tiles): the
    block-scaled kernel then takes one scale per 64 rows (a broken promise gives wrong
    results on it)."""
    lhs, rhs, lhs_scales, rhs_scales = (jnp.asarray(x) for x in (lhs, rhs, lhs_scales, rhs_scales))
    out_dtype = jnp.dtype(preferred_element_type)
    _check(lhs, rhs, lhs_scales, rhs_scales, out_dtype)
    if _tiled_form(rhs.shape, rhs_scales.shape):
        rhs_scales, rhs_tiles = _scales_per_row(rhs_scales, rhs.shape[1]), True
    out_sharding = canonical_out_sharding(out_sharding, "scaled_matmul")
    (out,) = scaled_matmul_op.bind(lhs, rhs, lhs_scales, rhs_scales, out_dtype=out_dtype, out_sharding=out_sharding,
                                   rhs_tiles=bool(rhs_tiles))  # fmt: skip
    return constrain_output(out, out_sharding)
