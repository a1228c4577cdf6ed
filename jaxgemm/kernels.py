"""Which CUDA kernel families and Hopper (sm90) schedules exist, as the C++ side declares
them (ffi_src/gemm/kernel_family.h, simt_tiles.h, sm90/schedules.h, problem.h's epilogue
operands), read once from the extension: the lowering, the autotuner, tests and tools take
them from here."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxgemm import _jaxgemm

# GemmConfig.kernel / conv2d's `kernel` -> the FFI calls' `kernel` id (None: the heuristic).
KERNEL_FAMILIES: dict[str | None, int] = {None: 0, **_jaxgemm.kernel_families()}
CONV_KERNEL_FAMILIES: dict[str | None, int] = {k: v for k, v in KERNEL_FAMILIES.items() if k in (None, "sm80", "sm90")}


# The element types of ffi_src/common/element_type.h: those of every op (SUPPORTED_DTYPES),
# and the 16-bit ones the tensor-core kernels take (HALF_DTYPES). fp8 is scaled_matmul's.
_ELEMENT_TYPES = _jaxgemm.element_types()
SUPPORTED_DTYPES: tuple[jnp.dtype, ...] = tuple(jnp.dtype(e["name"]) for e in _ELEMENT_TYPES if not e["float8"])
HALF_DTYPES: frozenset = frozenset(jnp.dtype(e["name"]) for e in _ELEMENT_TYPES if e["bytes"] == 2)


# The GEMM epilogue's operands (ffi_src/gemm/problem.h's table), in the order the
# jaxgemm_gemm call passes them after a and b: name -> shape ("matrix" (m, n), "columns"
# (n,), "rows" (m,), after the batch dims), and name -> dtype ("output": the output's;
# "float32": the scales).
_EPILOGUE_ROWS = _jaxgemm.epilogue_operands()
EPILOGUE_OPERANDS: dict[str, str] = {row["name"]: row["shape"] for row in _EPILOGUE_ROWS}
EPILOGUE_OPERAND_DTYPES: dict[str, str] = {row["name"]: row["dtype"] for row in _EPILOGUE_ROWS}


# The SIMT kernels' float32 tiles (ffi_src/gemm/simt_tiles.h): every tile that runs, and
# those the heuristic may pick (the others run only when GemmConfig.tile asks).
_SIMT_ROWS = _jaxgemm.simt_tiles()
SIMT_TILES: tuple[tuple[int, int], ...] = tuple(tuple(row["tile"]) for row in _SIMT_ROWS)
SIMT_HEURISTIC_TILES: tuple[tuple[int, int], ...] = tuple(tuple(row["tile"]) for row in _SIMT_ROWS if row["heuristic"])


@dataclasses.dataclass(frozen=True)
class Sm90Schedule:
    """One sm90 schedule, named by the area of D one block (or cluster) covers."""

    tile: tuple[int, int]
    cluster_m: int  # blocks per cluster, stacked along M
    consumers: int  # consumer warpgroups
    pingpong: bool  # the consumers take alternate tiles (else both work on every tile)
    swapped: bool  # computes D^T = B^T A^T: 16-bit inputs with A stored (m, k) only
    # The kernels built with it:
    half: bool  # GEMMs of 16-bit inputs
    tf32: bool  # GEMMs of float32 inputs multiplied as tf32
    fp8: bool  # GEMMs of float8_e4m3fn inputs (both operands K-major), per-tensor or rowwise scales
    block_scaled: bool  # GEMMs of float8_e4m3fn inputs with block scales (jaxgemm.scaled_matmul)
    conv_fprop: bool  # convolutions' forward and data gradient (as 128 x tile_n)
    conv_wgrad: bool  # convolutions' weight gradient (as 128 x tile_n)


SM90_SCHEDULES: tuple[Sm90Schedule, ...] = tuple(
    Sm90Schedule(tile=tuple(row["tile"]), **{f.name: row[f.name] for f in dataclasses.fields(Sm90Schedule) if f.name != "tile"})
    for row in _jaxgemm.sm90_schedules()
)
SM90_PINGPONG_TILES = frozenset(s.tile for s in SM90_SCHEDULES if s.pingpong)


def sm90_tiles(dtype) -> tuple[tuple[int, int], ...]:
    """The schedules built for inputs of `dtype` (float32: as tf32). Some take only some
    layouts (no pingpong for a tf32 A stored (k, m); the swapped one wants A stored (m, k)):
    a forced one that cannot run its problem is an error."""
    dtype = jnp.dtype(dtype)
    if dtype == jnp.float8_e4m3fn:
        return tuple(s.tile for s in SM90_SCHEDULES if s.fp8)
    if dtype == jnp.float32:
        return tuple(s.tile for s in SM90_SCHEDULES if s.tf32)
    return tuple(s.tile for s in SM90_SCHEDULES if s.half)
