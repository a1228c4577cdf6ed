"""The `gemm_p` primitive: alpha * op(a) @ op(b), bilinear, with its rules.

The primitive takes operands in a canonical form, `a: (*batch_a, rows, cols)` and
`b: (*batch_b, rows, cols)` of equal rank, where every batch dim of an operand is 1
(broadcast, read with stride 0 by the kernel) or the output's. `gemm_product` turns broadcasting
operands into that form with free reshapes only, and every rule (batching, transpose)
goes back through it. `jaxgemm.matmul` (matmul.py) is the public entry; fused epilogues
live in epilogue.py.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import ad

from jaxgemm import _ffi  # noqa: F401  (registers the FFI targets)
from jaxgemm import _jaxgemm, xla_cpu
from jaxgemm._compat import cotangent_sharding, explicit_sharding
from jaxgemm.kernels import EPILOGUE_OPERANDS, HALF_DTYPES, KERNEL_FAMILIES, SM90_PINGPONG_TILES
from jaxgemm.primitive import BILINEAR, Op, Result, Rule, define, psum_over

_MAX_KERNEL_BATCH_DIMS = _jaxgemm.max_batch_dims  # BatchLayout's limit (gemm/problem.h)


@dataclasses.dataclass(frozen=True)
class GemmConfig:
    """Static options of one `gemm_p` call (hashable: it is a primitive parameter)."""

    transpose_a: bool = False
    transpose_b: bool = False
    tf32: bool = False  # float32 inputs may run on tf32 tensor cores
    out_dtype: Any = jnp.dtype(jnp.float32)
    # K chunks computed in parallel and summed afterwards; None lets the GPU lowering pick.
    split_k: int | None = None
    # CUDA kernel family ("simt", "sm80", "sm90", "decode") and its (tile_m, tile_n): for tests and
    # tuning; None lets the handler's heuristic pick.
    kernel: str | None = None
    tile: tuple[int, int] | None = None
    alpha: float = 1.0  # computes alpha * op(a) @ op(b)
    # The cotangent of a right operand (a layer's weights): in a sharded step an all-reduce
    # may run beside it (collective_schedule).
    weight_gradient: bool = False
    sm_margin: int = 0  # multiprocessors the CUDA kernel leaves free (set by gemm_local)
    # The sm90 kernel's blocks take tiles from a counter, not a static share (set by
    # gemm_local; JAXGEMM_SM90_DYNAMIC_TILES=1 sets it for every call: uses_dynamic_tiles).
    dynamic_tiles: bool = False

    def __post_init__(self):
        if self.kernel not in KERNEL_FAMILIES:
            raise ValueError(f"GemmConfig.kernel must be one of {sorted(k for k in KERNEL_FAMILIES if k)} or None, "
                             f"got {self.kernel!r}")


def gemm_dims(a_shape, b_shape, config: GemmConfig):
    """(m, k, n, k_of_b) of a canonical call."""
    ar, ac = a_shape[-2:]
    br, bc = b_shape[-2:]
    m, k = (ac, ar) if config.transpose_a else (ar, ac)
    kb, n = (bc, br) if config.transpose_b else (br, bc)
    return m, k, n, kb


def broadcast_batch(a_batch, b_batch):
    out = []
    for x, y in zip(a_batch, b_batch):
        if x != y and x != 1 and y != 1:
            return None
        out.append(y if x == 1 else x)
    return tuple(out)


def gemm_abstract(a, b, *, config: GemmConfig, out_sharding=None):
    if a.ndim < 2 or a.ndim != b.ndim:
        raise ValueError(f"gemm_p needs operands of equal rank >= 2, got a{a.shape} and b{b.shape}")
    if a.dtype != b.dtype:
        raise TypeError(f"gemm_p needs equal operand dtypes, got {a.dtype} and {b.dtype}")
    m, k, n, kb = gemm_dims(a.shape, b.shape, config)
    if k != kb:
        raise ValueError(f"gemm_p: inner dimensions differ: a{a.shape} b{b.shape} with {config}")
    batch = broadcast_batch(a.shape[:-2], b.shape[:-2])
    if batch is None:
        raise ValueError(f"gemm_p: batch dims do not broadcast: a{a.shape} b{b.shape}")
    return [Result(batch + (m, n), config.out_dtype)]


def batch_factors(shape, out_batch, tag: str) -> tuple[str, ...]:
    """Factor names of an operand's batch dims: the output's ("b0", ...) where the operand
    has the output's size, its own ("<tag>0", ...) where it is broadcast (size 1)."""
    return tuple(f"b{i}" if d == o else f"{tag}{i}" for i, (d, o) in enumerate(zip(shape, out_batch)))


def gemm_rule(a_shape, b_shape, config: GemmConfig) -> Rule:
    """op(a) (m, k) times op(b) (k, n): k is contracted."""
    batch = broadcast_batch(a_shape[:-2], b_shape[:-2])
    a_dims = batch_factors(a_shape[:-2], batch, "a") + (("k", "m") if config.transpose_a else ("m", "k"))
    b_dims = batch_factors(b_shape[:-2], batch, "b_") + (("n", "k") if config.transpose_b else ("k", "n"))
    out = tuple(f"b{i}" for i in range(len(batch))) + ("m", "n")
    return Rule((a_dims, b_dims), (out,))


def _gemm_rule(a, b, *, config: GemmConfig, out_sharding=None):
    return gemm_rule(a.shape, b.shape, config)


def gemm_workspace_bytes(a_shape, b_shape, dtype, config: GemmConfig, split_k: int, platform: str) -> int:
    """Scratch bytes a jaxgemm_gemm call can use on this process's GPU: stream-K's partial
    tiles and flags when the sm90 schedule shares a last, partly filled wave out (0 on CPU,
    off Hopper, on the SIMT kernels, or when every wave is full). Less makes the kernel run
    without stream-K, never wrong."""
    # (JAXGEMM_STREAM_K=0, read by the host query, turns stream-K off: whole tiles only.)
    tensor_cores = jnp.dtype(dtype) != jnp.float32 or runs_as_tf32(dtype, config, platform)
    if platform != "cuda" or not tensor_cores or not _ffi.hopper():
        return 0
    m, k, n, _ = gemm_dims(a_shape, b_shape, config)
    batch = math.prod(broadcast_batch(a_shape[:-2], b_shape[:-2]))
    tile = config.tile or (0, 0)
    # (A tf32 NN product runs as D^T over n x m tiles: the host query orients it as the kernel does.)
    sm_count = _ffi.kernel_sm_count(config.sm_margin)
    return int(_ffi.gemm_workspace_bytes(m, n, k, batch, sm_count, split_k,
                                         KERNEL_FAMILIES[config.kernel], *tile, runs_as_tf32(dtype, config, platform),
                                         config.transpose_a, config.transpose_b, _float_output(dtype, config),
                                         uses_dynamic_tiles(config), jnp.dtype(dtype).itemsize == 1))


def call_gemm_ffi(a, b, *, config: GemmConfig, out_shape, split_k: int = 1, activation: int = 0, beta: float = 0.0,
                  want_aux: bool = False, workspace_bytes: int = 0, **operands):
    """The jaxgemm_gemm FFI call (ffi_src/ffi/gemm_decode.h has the contract): returns
    (out, aux). `operands`: the epilogue's, by the names of kernels.EPILOGUE_OPERANDS (c,
    bias, residual, ...); absent ones (None or not given) and an unwanted aux travel as
    empty arrays. Unbatched operands get a size-1 batch dim under vmap, which the kernels
    read with stride 0. `workspace_bytes`: scratch for the kernel (gemm_workspace_bytes),
    allocated by XLA."""
    unknown = set(operands) - set(EPILOGUE_OPERANDS)
    if unknown:
        raise TypeError(f"call_gemm_ffi: no epilogue operand {sorted(unknown)}; the table has {list(EPILOGUE_OPERANDS)}")
    out_dtype = jnp.float32 if split_k > 1 else config.out_dtype
    empty = jnp.zeros((0,), out_dtype)
    results = (
        jax.ShapeDtypeStruct(out_shape, out_dtype),
        jax.ShapeDtypeStruct(out_shape if want_aux else (0,), out_dtype),
        jax.ShapeDtypeStruct((workspace_bytes,), jnp.uint8),
    )
    return jax.ffi.ffi_call("jaxgemm_gemm", results, vmap_method="expand_dims")(
        a,
        b,
        *(empty if operands.get(name) is None else operands[name] for name in EPILOGUE_OPERANDS),
        transpose_a=bool(config.transpose_a),
        transpose_b=bool(config.transpose_b),
        tf32=bool(config.tf32),
        alpha=np.float32(config.alpha),
        beta=np.float32(beta),
        activation=np.int64(activation),
        split_k=np.int64(split_k),
        tile_m=np.int64(config.tile[0] if config.tile else 0),
        tile_n=np.int64(config.tile[1] if config.tile else 0),
        kernel=np.int64(KERNEL_FAMILIES[config.kernel]),
        sm_margin=np.int64(config.sm_margin),
        dynamic_tiles=uses_dynamic_tiles(config),
    )[:2]


def runs_as_tf32(dtype, config: GemmConfig, platform: str) -> bool:
    """Whether a float32 call runs on the sm90 tf32 kernel: tf32 allowed, a Hopper GPU, and
    the heuristic's or the sm90 family. Its operands must then be stored as tf32_operands
    gives them; elsewhere tf32-allowed calls run in exact fp32 on the SIMT kernels."""
    return (
        jnp.dtype(dtype) == jnp.float32
        and config.tf32
        and config.kernel in (None, "sm90")
        and platform == "cuda"
        and _ffi.hopper()
    )


_F32_ROW_ALIGNMENT = 4  # float32 elements per 16 bytes: TMA's and cp.async's row pitches


def pad_axis(x, axis, amount):
    """x with `amount` zeros appended along `axis`."""
    if amount == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, amount)
    return jnp.pad(x, widths)


def _tf32_transposes(m: int, n: int, config: GemmConfig, plain: bool) -> tuple[bool, bool]:
    """Which stored operands the lowering transposes (XLA, one pass each) for the sm90 tf32
    kernel. wgmma reads a 32-bit B only K-major (b stored (n, k)), and a 32-bit A K-major
    (a stored (m, k)) or, stored (k, m), from registers, which needs rows of a multiple of 4
    elements (16-byte pitches) and a cooperative tile. A plain product (`plain`: alpha only,
    unsplit) with a stored (m, k) and b stored (k, n) needs neither: the kernel computes
    D^T = B^T A^T (B^T is an A stored (k, m)) and writes its tiles transposed into D
    (gemm/sm90/launch.h, Sm90Transposed); not with at most 64 rows (the transposed product
    would have that few columns, which its tiles are not made for)."""
    ta, tb = config.transpose_a, config.transpose_b
    cooperative = tuple(config.tile or ()) not in SM90_PINGPONG_TILES  # (pingpong: no tf32 A from registers)
    if not ta and not tb and plain and cooperative and n % _F32_ROW_ALIGNMENT == 0 and m > 64:
        return False, False
    register_a = cooperative and m % _F32_ROW_ALIGNMENT == 0
    return ta and not register_a, not tb


def tf32_operands(a, b, config: GemmConfig, plain: bool = False):
    """Operands as the sm90 tf32 kernel takes them (_tf32_transposes), K zero-padded to a
    multiple of 4 (exact; K-major rows need 16-byte pitches), and the config that says how
    they are stored."""
    m, k, n, _ = gemm_dims(a.shape, b.shape, config)
    swap_a, swap_b = _tf32_transposes(m, n, config, plain)
    if swap_a:
        a = jnp.swapaxes(a, -1, -2)
    if swap_b:
        b = jnp.swapaxes(b, -1, -2)
    ta, tb = config.transpose_a != swap_a, config.transpose_b != swap_b
    k_pad = -k % _F32_ROW_ALIGNMENT
    a, b = pad_axis(a, -2 if ta else -1, k_pad), pad_axis(b, -1 if tb else -2, k_pad)
    return a, b, dataclasses.replace(config, transpose_a=ta, transpose_b=tb)


# SIMT float32: the kernel copies M- or N-contiguous operand tiles with 16-byte cp.async and
# transposes K-contiguous ones in 4-byte pieces; the latter run 10-18% slower. Storing such
# an operand the other way costs one XLA transpose, 8 bytes per element (~60 / N of the
# GEMM's time for A, ~60 / M for B); it pays from 2048 columns / rows on.
_SIMT_TRANSPOSE_MIN_EXTENT = 2048


def runs_on_simt_f32(dtype, config: GemmConfig, platform: str) -> bool:
    """Whether the heuristic runs this call on the SIMT float32 kernels."""
    return (
        jnp.dtype(dtype) == jnp.float32
        and config.kernel is None
        and platform == "cuda"
        and _ffi.WITH_CUDA
        and not runs_as_tf32(dtype, config, platform)
    )


def mn_major_for_simt(a, b, config: GemmConfig):
    """Stores a K-contiguous operand M- / N-contiguous instead (a as (k, m), b as (k, n)) when
    the GEMM is wide enough that the transpose is cheap next to the faster copies."""
    m, _, n, _ = gemm_dims(a.shape, b.shape, config)
    if not config.transpose_a and n >= _SIMT_TRANSPOSE_MIN_EXTENT:
        a = jnp.swapaxes(a, -1, -2)
        config = dataclasses.replace(config, transpose_a=True)
    if config.transpose_b and m >= _SIMT_TRANSPOSE_MIN_EXTENT:
        b = jnp.swapaxes(b, -1, -2)
        config = dataclasses.replace(config, transpose_b=False)
    return a, b, config


def _aligned_rows_for_simt(a, b, config: GemmConfig):
    """For a large GEMM whose operands are stored (k, m) and (k, n) (after
    mn_major_for_simt), zero-pads m and n to multiples of 4 when either is not: the kernel
    takes 16-byte copies only when both pitches allow them, and otherwise runs ~13% slower
    (4095 x 4097 x 4093: 42 against 48 TFLOP/s). Costs a copy of B (A's padding joins its
    transpose, if any) and the caller's slice of the output, each ~60 / K of the GEMM's time
    or less. Returns (a, b, m_padding, n_padding)."""
    m, k, n, _ = gemm_dims(a.shape, b.shape, config)
    m_pad, n_pad = -m % _F32_ROW_ALIGNMENT, -n % _F32_ROW_ALIGNMENT
    mn_major = config.transpose_a and not config.transpose_b
    if not mn_major or min(m, n, k) < _SIMT_TRANSPOSE_MIN_EXTENT:
        return a, b, 0, 0
    return pad_axis(a, -1, m_pad), pad_axis(b, -1, n_pad), m_pad, n_pad


def _float_output(in_dtype, config: GemmConfig) -> bool:
    """Whether 16-bit inputs write a float32 product (the heuristics weigh its bytes)."""
    return jnp.dtype(in_dtype) != jnp.float32 and jnp.dtype(config.out_dtype) == jnp.float32


def _split_k_for(a_aval, b_aval, config: GemmConfig, platform: str) -> int:
    if config.split_k is not None:
        return max(1, int(config.split_k))
    if platform != "cuda" or not _ffi.WITH_CUDA:
        return 1
    sm_count = _ffi.cuda_sm_count()
    if sm_count <= 0:
        return 1
    m, k, n, _ = gemm_dims(a_aval.shape, b_aval.shape, config)
    batch = math.prod(broadcast_batch(a_aval.shape[:-2], b_aval.shape[:-2]))
    tf32 = runs_as_tf32(a_aval.dtype, config, platform)
    if (a_aval.dtype != jnp.float32 or tf32) and config.kernel != "simt":
        split = _ffi.tensor_core_split_k(m, n, k, batch, sm_count, tf32, config.transpose_a, config.transpose_b,
                                         _float_output(a_aval.dtype, config))
        if tf32 and split > 1 and _tf32_split_transposes_b(m, n, config) and not _tf32_split_pays(m, n, k, split):
            return 1
        return split
    return int(_ffi.simt_config(m, n, k, batch, sm_count)[2])


# An H100's tf32 tensor cores do ~146 flops in the time HBM moves a byte (495 TFLOP/s, 3.35 TB/s).
_TF32_FLOPS_PER_BYTE = 146


def _tf32_split_transposes_b(m: int, n: int, config: GemmConfig) -> bool:
    """Whether splitting K makes the lowering transpose B, which the unsplit product avoids."""
    return _tf32_transposes(m, n, config, plain=True)[1] != _tf32_transposes(m, n, config, plain=False)[1]


def _tf32_split_pays(m: int, n: int, k: int, split: int) -> bool:
    """Whether a tf32 split-K saves more than XLA's transpose of B costs (8 bytes an element
    of B moved): at most (1 - 1/split) of the product's time, which is at least one read of
    both operands and at least its flops at the tensor cores' rate (both in HBM bytes). With
    few rows the product is bound by reading B and never pays (128 x 4096^2: 79 us split
    with the transpose, 42 unsplit, on an H100)."""
    product_bytes = max(4 * (m * k + k * n), 2 * m * n * k / _TF32_FLOPS_PER_BYTE)
    return product_bytes * (1 - 1 / split) > 8 * k * n


_ROW_ALIGNMENT = 8  # elements: the tensor-core kernels need 16-byte row pitches (TMA, cp.async)


def pad_rows_for_tensor_cores(a, b, config: GemmConfig):
    """Zero-pads 16-bit operands whose stored rows are not a multiple of 8 elements, so the
    tensor-core kernels take them instead of the much slower SIMT fallback. Padding K is
    exact (zeros add nothing); padding M or N adds output rows/columns the caller slices
    off. Returns (a, b, m_padding, n_padding)."""

    def up(x):
        return -x % _ROW_ALIGNMENT

    m, k, n, _ = gemm_dims(a.shape, b.shape, config)
    k_pad = up(k) if not config.transpose_a or config.transpose_b else 0  # K is a stored row
    m_pad = up(m) if config.transpose_a else 0
    n_pad = 0 if config.transpose_b else up(n)
    a = pad_axis(pad_axis(a, -2 if config.transpose_a else -1, k_pad), -1, m_pad)
    b = pad_axis(pad_axis(b, -1 if config.transpose_b else -2, k_pad), -1, n_pad)
    return a, b, m_pad, n_pad


def collective_sm_margin() -> int:
    """Multiprocessors left free by a weight gradient whose partial sums are reduced across
    devices (JAXGEMM_SM_MARGIN, default 24). With data parallelism each layer's weight
    gradient runs beside the all-reduce of the previous one's, and NCCL's kernel cannot
    start while a persistent grid holds every SM: without a margin the two run one after
    the other (tools/step_timeline.py; NOTES.md, "Open: the data-parallel step's scaling").
    24 of the H200's 132 SMs is NCCL's bf16 all-reduce grid on 2 GPUs, and leaves 54
    two-block clusters: an 8192^2 weight gradient's 1024 cluster tiles in 19 full waves
    (32 SMs: 21 waves). Other GEMMs keep every SM: the sum of their partial products is
    what the next op waits for."""
    return _env_margin("JAXGEMM_SM_MARGIN", 24)


def ring_sm_margin() -> int:
    """Multiprocessors left free by the GEMMs of collective.py's rings (JAXGEMM_RING_SM_MARGIN,
    default 0). A margin lets NCCL's transfer start beside a product, but every product pays
    for the SMs it gives up: on 2 H200s the sequence-parallel block took 20.0 ms with none,
    22.1 with 24 and 23.2 with 32 (NOTES.md, "Open: the sequence-parallel rings lose to XLA's
    collectives")."""
    return _env_margin("JAXGEMM_RING_SM_MARGIN", 0)


def collective_schedule(config: GemmConfig, axes: dict) -> GemmConfig:
    """How a weight gradient runs beside the all-reduces of a sharded step (CUDA).
    - Its K sharded (data parallel): its partial sums are all-reduced, and it runs beside
      the previous layer's all-reduce, which NCCL launches after it: it leaves
      collective_sm_margin() SMs free so that NCCL's kernel can start at all.
    - Its M or N sharded (tensor parallel): an input gradient's all-reduce runs beside it,
      launched just before it, and holds some SMs for a while; the blocks then take their
      tiles from a counter (dynamic_tiles) so that those that start late take fewer tiles,
      where a static share would end the GEMM that much later (docs/primitives.md)."""
    if not config.weight_gradient:
        return config
    if axes.get("k"):
        return dataclasses.replace(config, sm_margin=collective_sm_margin())
    if axes.get("m") or axes.get("n"):
        return dataclasses.replace(config, dynamic_tiles=True)
    return config


def uses_dynamic_tiles(config: GemmConfig) -> bool:
    """Whether the call's sm90 blocks take their tiles from a counter: config.dynamic_tiles,
    or JAXGEMM_SM90_DYNAMIC_TILES=1 for every call (tests). Read by the workspace query and
    the call alike."""
    return config.dynamic_tiles or os.environ.get("JAXGEMM_SM90_DYNAMIC_TILES") == "1"


def _env_margin(name: str, default: int) -> int:
    return max(0, int(os.environ.get(name, str(default))))


_SMS_LEFT_FREE = contextvars.ContextVar("jaxgemm_sms_left_free", default=0)


@contextlib.contextmanager
def sms_left_free(margin: int):
    """GEMMs traced inside leave `margin` multiprocessors free on CUDA (and so do the GEMMs
    of their gradients): for products that run beside a collective they do not wait for,
    as in collective.py's rings, where a persistent grid on every SM would hold NCCL's
    kernel back until the product ends."""
    token = _SMS_LEFT_FREE.set(max(0, int(margin)))
    try:
        yield
    finally:
        _SMS_LEFT_FREE.reset(token)


def traced_sm_margin() -> int:
    """The margin of the innermost `sms_left_free` being traced (0 outside)."""
    return _SMS_LEFT_FREE.get()


def gemm_local(a, b, *, config: GemmConfig, platform: str, axes=None, out_sharding=None):
    """alpha * op(a) @ op(b) on one device's shards (the FFI call and the operand
    preparation each kernel wants), summed over the mesh axes that shard k."""
    m, _, n, _ = gemm_dims(a.shape, b.shape, config)
    out_shape = broadcast_batch(a.shape[:-2], b.shape[:-2]) + (m, n)
    (out_dims,) = gemm_rule(a.shape, b.shape, config).results
    if xla_cpu.enabled(platform):
        out = xla_cpu.gemm(a, b, transpose_a=config.transpose_a, transpose_b=config.transpose_b, alpha=config.alpha,
                           out_dtype=config.out_dtype, out_sharding=out_sharding)  # fmt: skip
        return [psum_over(out, axes or {}, ("k",), out_dims)]
    split_k = _split_k_for(a, b, config, platform)
    m_pad = n_pad = 0
    call_config = config
    # (A forced kernel family gets the operands as they are: tests rely on that.)
    if platform == "cuda" and a.dtype in HALF_DTYPES and config.kernel is None:
        a, b, m_pad, n_pad = pad_rows_for_tensor_cores(a, b, config)
    if runs_as_tf32(a.dtype, config, platform):
        a, b, call_config = tf32_operands(a, b, config, plain=split_k == 1)
    if runs_on_simt_f32(a.dtype, config, platform):
        a, b, call_config = mn_major_for_simt(a, b, config)
        a, b, m_pad, n_pad = _aligned_rows_for_simt(a, b, call_config)
    padded_shape = out_shape[:-2] + (m + m_pad, n + n_pad)
    if platform == "cuda":
        call_config = collective_schedule(call_config, axes or {})
    if split_k == 1:
        workspace = gemm_workspace_bytes(a.shape, b.shape, a.dtype, call_config, 1, platform)
        out = call_gemm_ffi(a, b, config=call_config, out_shape=padded_shape, workspace_bytes=workspace)[0]
    else:
        # Split-K: the fp32 partials, summed by XLA in a fixed order (deterministic).
        shape = padded_shape[:-2] + (split_k,) + padded_shape[-2:]
        partials = call_gemm_ffi(a, b, config=call_config, out_shape=shape, split_k=split_k)[0]
        out = partials.sum(axis=-3).astype(config.out_dtype)
    if m_pad or n_pad:
        out = out[..., :m, :n]
    # K sharded: partial products in the output dtype, summed as XLA sums its dots'.
    return [psum_over(out, axes or {}, ("k",), out_dims)]


def kernel_out_dtype(in_dtype, out_dtype):
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


def gemm_product(a, b, config: GemmConfig, out_sharding=None):
    """op(a) @ op(b) for operands whose batch dims broadcast (ranks may differ).
    `out_sharding` (a NamedSharding) types the result in Explicit mode."""
    rank = max(a.ndim, b.ndim)
    a = a.reshape((1,) * (rank - a.ndim) + a.shape)
    b = b.reshape((1,) * (rank - b.ndim) + b.shape)
    m, k, n, _ = gemm_dims(a.shape, b.shape, config)
    batch = broadcast_batch(a.shape[:-2], b.shape[:-2])
    out_shape = batch + (m, n)
    kernel_dtype = kernel_out_dtype(a.dtype, config.out_dtype)
    if 0 in out_shape or k == 0:
        return jnp.zeros(out_shape, config.out_dtype)
    kernel_config = dataclasses.replace(config, out_dtype=kernel_dtype)
    if rank > 2 and all(d == 1 for d in b.shape[:-2]) and not config.transpose_a and not rows_typed_sharded(a):
        # B is shared by every batch: fold the batch into M, one large GEMM.
        a2 = a.reshape(-1, a.shape[-1])
        (out,) = gemm_op.bind(a2, b.reshape(b.shape[-2:]), config=kernel_config, out_sharding=None)
    else:
        a, b = _collapse_batch(a, b)
        (out,) = gemm_op.bind(a, b, config=kernel_config, out_sharding=out_sharding if a.ndim == rank else None)
    return out.reshape(out_shape).astype(config.out_dtype)


def rows_typed_sharded(a) -> bool:
    """Whether a's batch or row dims carry Explicit shardings: folding them into one M dim
    and back would lose how they are split (the batched kernel reads a shared B anyway)."""
    sharding = explicit_sharding(jax.typeof(a))
    return sharding is not None and any(entry is not None for entry in tuple(sharding.spec)[:-1])


def unbroadcast(x, shape):
    """Sums x over the dims along which an operand of `shape` was broadcast."""
    lead = x.ndim - len(shape)
    if lead:
        x = x.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, (s, t) in enumerate(zip(x.shape, shape)) if t == 1 and s != 1)
    if axes:
        x = x.sum(axis=axes, keepdims=True)
    return x.reshape(shape)


def grad_lhs(ct, b, a_shape, a_dtype, config: GemmConfig, sharding=None):
    """Cotangent of `a` in alpha * op(a) @ op(b), given the output cotangent `ct` (typed
    with `sharding`, a's in Explicit mode)."""
    ct = ct.astype(a_dtype)
    cfg = dataclasses.replace(config, out_dtype=jnp.dtype(a_dtype), split_k=None, kernel=None, tile=None,
                              weight_gradient=False)
    if config.transpose_a:  # A stored (K, M): dA = alpha * op(B) @ ct^T
        da = gemm_product(b, ct, dataclasses.replace(cfg, transpose_a=config.transpose_b, transpose_b=True), sharding)
    else:  # dA = alpha * ct @ op(B)^T
        da_config = dataclasses.replace(cfg, transpose_a=False, transpose_b=not config.transpose_b)
        da = gemm_product(ct, b, da_config, sharding)
    return unbroadcast(da, a_shape)


def grad_rhs(ct, a, b_shape, b_dtype, config: GemmConfig, sharding=None):
    """Cotangent of `b` in alpha * op(a) @ op(b), given the output cotangent `ct` (typed
    with `sharding`, b's in Explicit mode)."""
    ct = ct.astype(b_dtype)
    cfg = dataclasses.replace(config, out_dtype=jnp.dtype(b_dtype), split_k=None, kernel=None, tile=None,
                              weight_gradient=True)
    if config.transpose_b:  # B stored (N, K): dB = alpha * ct^T @ op(A)
        db = gemm_product(ct, a, dataclasses.replace(cfg, transpose_a=True, transpose_b=config.transpose_a), sharding)
    else:  # dB = alpha * op(A)^T @ ct
        db_config = dataclasses.replace(cfg, transpose_a=not config.transpose_a, transpose_b=False)
        db = gemm_product(a, ct, db_config, sharding)
    return unbroadcast(db, b_shape)


def _gemm_transpose(cts, a, b, *, config: GemmConfig, out_sharding=None):
    (ct,) = cts
    if type(ct) is ad.Zero:
        return [None, None]
    if ad.is_undefined_primal(a):
        return [grad_lhs(ct, b, a.aval.shape, a.aval.dtype, config, cotangent_sharding(a.aval, ct)), None]
    return [None, grad_rhs(ct, a, b.aval.shape, b.aval.dtype, config, cotangent_sharding(b.aval, ct))]


def _gemm_batch(args, dims, *, config: GemmConfig, out_sharding=None):
    # Move the vmapped axis to the front; an unbatched operand gets a size-1 axis, which
    # the kernel broadcasts with stride 0 (no copy).
    (a, b), (da, db) = args, dims
    a = a[None] if da is None else jnp.moveaxis(a, da, 0)
    b = b[None] if db is None else jnp.moveaxis(b, db, 0)
    return [gemm_product(a, b, config)], [0]


gemm_op = define(Op(
    "jaxgemm_gemm",
    abstract=gemm_abstract,
    rule=_gemm_rule,
    local=gemm_local,
    batch=_gemm_batch,
    jvp=BILINEAR,
    transpose=_gemm_transpose,
))
gemm_p = gemm_op.primitive
