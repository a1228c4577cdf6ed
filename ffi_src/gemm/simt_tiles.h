// The SIMT kernels' threadblock tiles: one table that the heuristic (dispatch.cu), the
// tile check of a forced GemmConfig.tile and Python (kernels.SIMT_TILES, through the
// module's simt_tiles) all read. Plain C++, so the CPU-only module exports it too.
#pragma once

namespace jaxgemm {

struct SimtChoice {
  int bm, bn;
};

// The wave model's inputs per tile (dispatch.cu's SimtCost): the warps of a block, the
// blocks resident on one SM, and the FFMA efficiency measured against 128 x 128 (smaller
// tiles do more shared-memory traffic per FMA). The first row is the heuristic's default.
// `heuristic`: the heuristic may pick it; the others run only when asked for: the 256 x 128
// float32 tile ran 0.88x of XLA against 128 x 128's 0.96x (ffi_src/gemm/NOTES.md, rejected
// ideas, "SIMT").
struct SimtTile {
  SimtChoice tile;
  int warps, resident;
  double efficiency;
  bool heuristic;
};

inline constexpr SimtTile kSimtTiles[] = {
    {{128, 128}, 8, 2, 1.0, true},
    {{128, 64}, 4, 4, 0.94, true},
    {{64, 64}, 2, 8, 0.9, true},
    {{256, 128}, 0, 0, 0.0, false},  // (no wave-model inputs: the heuristic never weighs it)
};

inline bool IsSimtTile(SimtChoice tile) {
  for (const SimtTile& t : kSimtTiles) {
    if (t.tile.bm == tile.bm && t.tile.bn == tile.bn) return true;
  }
  return false;
}

}  // namespace jaxgemm
