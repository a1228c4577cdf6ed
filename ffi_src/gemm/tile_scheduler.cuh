// Maps a linear block index to an output tile. Consecutive blocks walk a group of
// kGroupM tile-rows column by column, so the blocks resident at once share A rows and B
// columns in L2 instead of streaming a whole row of B tiles each.
#pragma once
#include <cstdint>

namespace jaxgemm {

struct GroupedRaster {
  static constexpr int64_t kGroupM = 8;
  int64_t tiles_m, tiles_n;

  __device__ __forceinline__ void Tile(int64_t linear, int64_t* tile_m, int64_t* tile_n) const {
    const int64_t per_group = kGroupM * tiles_n;
    const int64_t group = linear / per_group;
    const int64_t first_m = group * kGroupM;
    const int64_t rows = tiles_m - first_m < kGroupM ? tiles_m - first_m : kGroupM;
    const int64_t in_group = linear - group * per_group;
    *tile_m = first_m + in_group % rows;
    *tile_n = in_group / rows;
  }
};

}  // namespace jaxgemm
