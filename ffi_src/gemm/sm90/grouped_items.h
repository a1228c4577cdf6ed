// The grouped GEMM's work items (grouped.cuh): which rows, columns and contraction range
// each item covers, and which block takes it. Plain C++ on the host and the device, so
// that the module walks them for tests (grouped_walk) exactly as the kernel does; the
// kernel builds the tables in shared memory (Sm90GroupedSchedule::Prepare).
#pragma once
#include <cstdint>

#include "common/host_device.h"

namespace jaxgemm {

// The grouped kernel's tile: 128 x 256 of D for 16-bit inputs, 64-element k-tiles (one
// 128-byte swizzle row).
inline constexpr int kGroupedTileM = 128, kGroupedTileN = 256, kGroupedTileK = 64;

// The row_end table on the host (the kernel scans it on the device: Sm90GroupedSchedule::Prepare):
// row_end[g] = min(rows of groups 0 .. g, m), negative sizes counting as 0; row_end[groups] = m.
template <class Size, class End>
inline void GroupedRowEnds(const Size* sizes, int64_t groups, int64_t m, End* row_end) {
  int64_t rows = 0;
  for (int64_t g = 0; g < groups; ++g) {
    rows += sizes[g] > 0 ? static_cast<int64_t>(sizes[g]) : 0;
    row_end[g] = static_cast<End>(rows < m ? rows : m);
  }
  row_end[groups] = static_cast<End>(m);
}

struct GroupedWork {
  int32_t group;
  int32_t row0, row_end;  // D's rows [row0, row_end) of this item (row_end: the group's end)
  int32_t n0;
  int32_t k_begin, k_end;  // the contraction's range (row modes: 0, k)
  int32_t k_tiles;
};

// Items of kItemRows rows by kTileN columns, the contraction in kTileK steps.
//   Row modes: an item is a tile of one group's rows of D, rasterized in bands of
//   kBandRows row tiles walked column by column (the items resident at once share their A
//   rows and B columns in L2); rows of no group form group `groups`, of zero k-tiles.
//   Contraction: an item is a tile of one group's (k, n) product, its k-loop over the
//   group's rows.
// The tables: row_end[g] (g < groups: min(rows of groups 0 .. g, m); row_end[groups] = m);
// item_end[g], the items of groups 0 .. g (row modes), or the groups in walk order
// (contraction).
template <int kItemRows, int kTileN, int kTileK, bool kContraction>
struct GroupedItemTable {
  static constexpr int kBandRows = 16;
  const int32_t* row_end;
  const int32_t* item_end;
  int32_t groups, m, n, k;
  int32_t tiles_n, tiles_k;  // tiles_k (contraction): D's row tiles per group

  JG_HOST_DEVICE_INLINE GroupedItemTable(const int32_t* row_end_, const int32_t* item_end_, int32_t groups_,
                                         int32_t m_, int32_t n_, int32_t k_)
      : row_end(row_end_), item_end(item_end_), groups(groups_), m(m_), n(n_), k(k_),
        tiles_n((n_ + kTileN - 1) / kTileN), tiles_k((k_ + kItemRows - 1) / kItemRows) {}

  // Row modes: group g's items, from its rows (end - begin).
  JG_HOST_DEVICE_INLINE int32_t GroupItems(int32_t rows) const { return (rows + kItemRows - 1) / kItemRows * tiles_n; }

  JG_HOST_DEVICE_INLINE int32_t Items() const { return kContraction ? groups * tiles_k * tiles_n : item_end[groups]; }

  JG_HOST_DEVICE_INLINE int32_t RowBegin(int g) const { return g == 0 ? 0 : row_end[g - 1]; }

  // Block `me` of `blocks`: its j-th item (>= Items(): no more). Waves of one item per
  // block, in order, or in snake order (block b takes the b-th of even waves, the b-th
  // from the end of odd ones).
  JG_HOST_DEVICE_INLINE static int32_t Walk(int32_t j, int32_t me, int32_t blocks, bool snake) {
    return j * blocks + (snake && j % 2 == 1 ? blocks - 1 - me : me);
  }

  JG_HOST_DEVICE_INLINE GroupedWork Get(int32_t t) const {
    GroupedWork w;
    if constexpr (kContraction) {
      const int32_t per_group = tiles_k * tiles_n, local = t % per_group;
      w.group = item_end[t / per_group];
      w.row0 = local % tiles_k * kItemRows;  // rows of the group's (k, n) slab
      w.row_end = k;
      w.n0 = local / tiles_k * kTileN;
      w.k_begin = RowBegin(w.group);
      w.k_end = row_end[w.group];
      w.k_tiles = (w.k_end - w.k_begin + kTileK - 1) / kTileK;
      return w;
    }
    // The group: the first whose items end past t (groups + 1 entries, the last the rows of
    // no group).
    int lo = 0, hi = groups;
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (item_end[mid] > t) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    w.group = lo;
    const int32_t begin = RowBegin(lo), local = t - (lo == 0 ? 0 : item_end[lo - 1]);
    const int32_t tiles_m = (row_end[lo] - begin + kItemRows - 1) / kItemRows;
    const int32_t band = local / (kBandRows * tiles_n), in_band = local - band * kBandRows * tiles_n;
    const int32_t height = tiles_m - band * kBandRows < kBandRows ? tiles_m - band * kBandRows : kBandRows;
    w.row0 = begin + (band * kBandRows + in_band % height) * kItemRows;
    w.row_end = row_end[lo];
    w.n0 = in_band / height * kTileN;
    w.k_begin = 0;
    w.k_end = k;
    w.k_tiles = lo < groups ? (k + kTileK - 1) / kTileK : 0;
    return w;
  }
};

}  // namespace jaxgemm
