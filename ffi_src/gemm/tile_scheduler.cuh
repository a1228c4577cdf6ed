// Maps a linear block index to an output tile. Consecutive blocks walk a group of
// kGroupM tile-rows column by column, so the blocks resident at once share A rows and B
// columns in L2 instead of streaming a whole row of B tiles each.
#pragma once
#include <cstdint>

#include "common/fast_divmod.h"
#include "common/host_device.h"

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

// GroupedRaster's order for the persistent kernels, which map an index per work item, with
// `group_rows` tile rows per group (the caller picks it from the tile's shape): its
// divisions are FastDivmods built on the host (a 64-bit division is a ~80-instruction call;
// a work item's mapping took several, on the path to a block's first TMA load).
// Indices and tile counts below 2^31.
struct FastGroupedRaster {
  FastDivmod per_group;  // tiles of a full group: group_rows * tiles_n
  FastDivmod rows;       // tile rows of a full group
  FastDivmod last_rows;  // tile rows of the last group, when it is not full
  int32_t full_groups = 0;

  FastGroupedRaster() = default;
  FastGroupedRaster(int32_t tiles_m, int32_t tiles_n, int32_t group_rows)
      : per_group(group_rows * tiles_n),
        rows(group_rows),
        last_rows(tiles_m % group_rows != 0 ? tiles_m % group_rows : group_rows),
        full_groups(tiles_m / group_rows) {}

  JG_HOST_DEVICE_INLINE void Tile(int32_t linear, int32_t* tile_m, int32_t* tile_n) const {
    int32_t group, in_group, column, row;
    per_group.DivMod(linear, &group, &in_group);
    (group < full_groups ? rows : last_rows).DivMod(in_group, &column, &row);
    *tile_m = group * rows.divisor + row;
    *tile_n = column;
  }
};

}  // namespace jaxgemm
