"""Loads the compiled extension and registers its XLA FFI handlers, once, at import."""

from __future__ import annotations

import jax

from jaxgemm import _jaxgemm

WITH_CUDA: bool = bool(_jaxgemm.with_cuda)


def cuda_sm_count() -> int:
    """Multiprocessors of the current CUDA device; 0 without CUDA or a GPU."""
    return int(_jaxgemm.cuda_sm_count()) if WITH_CUDA else 0


def kernel_sm_count(sm_margin: int) -> int:
    """The multiprocessors a CUDA kernel's persistent grid takes when it leaves `sm_margin`
    free, as the handlers count them (KernelSmCount in ffi_src/gemm/dispatch.h)."""
    return int(_jaxgemm.kernel_sm_count(sm_margin))


def simt_config(m: int, n: int, k: int, batch: int, sm_count: int) -> tuple[int, int, int]:
    """(tile_m, tile_n, split_k) the CUDA heuristic picks for a float32 problem."""
    return tuple(_jaxgemm.simt_config(m, n, k, batch, sm_count))


# The tensor-core heuristics below take `tf32` (float32 inputs as tf32; otherwise 16-bit
# inputs), how the operands are stored (`transpose_a`: A stored (k, m); `transpose_b`: B
# stored (n, k)) and whether 16-bit inputs write a float32 product (`out_f32`; otherwise one
# of their own type), which they weigh.


def tensor_core_split_k(m: int, n: int, k: int, batch: int, sm_count: int, tf32: bool = False,
                        transpose_a: bool = False, transpose_b: bool = False, out_f32: bool = False) -> int:
    """split_k the CUDA heuristic picks for a tensor-core problem (16-bit, or tf32 on Hopper)."""
    return int(_jaxgemm.tensor_core_split_k(m, n, k, batch, sm_count, tf32, transpose_a, transpose_b, out_f32))


def sm90_choice(m: int, n: int, k: int, batch: int, sm_count: int, tf32: bool = False,
                transpose_a: bool = False, transpose_b: bool = False, out_f32: bool = False) -> tuple[int, int, int]:
    """(tile_m, tile_n, split_k) the Hopper heuristic picks for a tensor-core problem
    (computed on the host: no device needed)."""
    return tuple(_jaxgemm.sm90_choice(m, n, k, batch, sm_count, tf32, transpose_a, transpose_b, out_f32))


def sm90_choice_fp8(m: int, n: int, k: int, sm_count: int, aux: bool) -> tuple[int, int, int]:
    """(tile_m, tile_n, split_k) the Hopper heuristic picks for an e4m3 product (both operands
    K-major, bfloat16 result), with or without the Aux output (fp8.dense's forward writes z)."""
    return tuple(_jaxgemm.sm90_choice_fp8(m, n, k, sm_count, aux))


def sm90_grid_sms(m: int, n: int, k: int, batch: int, sm_count: int, split_k: int, tf32: bool = False,
                  transpose_a: bool = False, transpose_b: bool = False) -> int:
    """The SMs the Hopper heuristic's persistent grid is planned for at `split_k` (computed on
    the host): sm_count, or items x share where a few-row product shares each 64 x 64 item
    out stream-K instead of splitting K."""
    return int(_jaxgemm.sm90_grid_sms(m, n, k, batch, sm_count, split_k, tf32, transpose_a, transpose_b))


def decode_plan(m: int, n: int, k: int, batch: int, sm_count: int) -> tuple[int, int]:
    """The decode kernel's launch plan for a 16-bit problem of at most 16 rows (computed on
    the host): (column blocks of 128, blocks per cluster sharing K). The launch halves the
    cluster further while the GPU cannot hold all of them at once."""
    return tuple(int(x) for x in _jaxgemm.decode_plan(m, n, k, batch, sm_count))


def gemm_workspace_bytes(m: int, n: int, k: int, batch: int, sm_count: int, split_k: int, kernel: int,
                         tile_m: int, tile_n: int, tf32: bool = False, transpose_a: bool = False,
                         transpose_b: bool = False, out_f32: bool = False, dynamic_tiles: bool = False,
                         fp8: bool = False) -> int:
    """Scratch bytes a jaxgemm_gemm call can use (stream-K on Hopper, or with `dynamic_tiles`
    the sm90 walk's tile counter; computed on the host): the problem's shape and split, a
    kernel family id and tile (0: the heuristic's), for the operands as stored (a plain tf32
    NN product runs as D^T, over n x m tiles); `fp8`: float8_e4m3fn operands."""
    return int(_jaxgemm.gemm_workspace_bytes(m, n, k, batch, sm_count, split_k, kernel, tile_m, tile_n, tf32,
                                             transpose_a, transpose_b, out_f32, dynamic_tiles, fp8))


def sm90_stream_k_walk(sk_items: int, item_k_tiles: int, workers: int) -> list[tuple[int, int, int, int, int, int]]:
    """The Hopper kernel's stream-K walk (ffi_src/gemm/sm90/stream_k.h), for tests: every
    worker's pieces in order, as (worker, item, first k-tile, k-tiles, fixup, partners), with
    fixup 0 (whole item), 1 (a tail or middle: partial sums to the workspace) or 2 (head: adds
    the partial sums of the `partners` workers after it)."""
    return [tuple(piece) for piece in _jaxgemm.sm90_stream_k_walk(sk_items, item_k_tiles, workers)]


def cuda_compute_capability() -> int:
    """10 * major + minor of the current CUDA device; 0 without CUDA or a GPU."""
    return int(_jaxgemm.cuda_compute_capability()) if WITH_CUDA else 0


def hopper() -> bool:
    """Whether the current CUDA device runs the sm_90a kernels (compute capability 9.0)."""
    return cuda_compute_capability() == 90


def _register() -> None:
    for name, capsule in _jaxgemm.cpu_registrations().items():
        jax.ffi.register_ffi_target(name, capsule, platform="cpu")
    for name, capsule in _jaxgemm.cuda_registrations().items():
        jax.ffi.register_ffi_target(name, capsule, platform="CUDA")


_register()
