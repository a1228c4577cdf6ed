// The grouped (ragged) GEMM's tile scheduler for Sm90GemmKernel (grouped.cuh): every block
// scans the group sizes into row and item bounds in shared memory (Prepare), then walks the
// items they define (grouped_items.h) as the GEMM's roles walk Sm90Schedule's.
#pragma once
#include <cstdint>

#include "gemm/problem.h"
#include "gemm/sm90/grouped_items.h"
#include "gemm/sm90/grouped_problem.h"
#include "gemm/sm90/policy.cuh"

namespace jaxgemm {

// The grouped kernel's shared memory behind the stages: one output box per consumer (the
// tables leave no room for the GEMM's two), each consumer's bias stage (an item's kBN
// float32 values, Sm90GroupedStageBias), the kernel's barriers (full, empty, order), then
// the tables: row_end and item_end (kMaxGroupedGroups + 1 each) and the sizes Prepare scans.
template <class P>
struct Sm90GroupedLayout {
  static constexpr int kBoxBytes = P::kConsumers * P::kOutBoxBytes;
  static constexpr int kBiasStageBytes = P::kConsumers * P::kBN * 4;
  static constexpr int kBarrierOffset = P::kStages * P::kStageBytes + kBoxBytes + kBiasStageBytes;
  static constexpr int kTableOffset = kBarrierOffset + (2 * P::kStages + 2) * 8;
  static constexpr int kTableBytes = 2 * (kMaxGroupedGroups + 1) * 4 + kMaxGroupedGroups * 4;
  static constexpr int kSmemBytes = kTableOffset + kTableBytes + 1024;  // (+ 1 KB: the stages' alignment)
  static_assert(kSmemBytes <= 227 * 1024, "over the shared memory of one block");
};

// The groups' shape (CUTLASS's grouped problem shape): the kernel reads the sizes from
// device memory. Items of kItemCols columns of D (kRowsGated: half the tile, whose halves
// multiply the gate's and the up weights' same columns).
template <class P, GroupedMode kGroupedMode>
struct Sm90GroupedSchedule {
  static constexpr GroupedMode kMode = kGroupedMode;
  static constexpr bool kContraction = kMode == GroupedMode::kContraction;
  static constexpr int kItemCols = kMode == GroupedMode::kRowsGated ? P::kBN / 2 : P::kBN;
  using Items = GroupedItemTable<P::kBM, kItemCols, P::kBK, kContraction>;
  using Work = GroupedWork;
  struct Cursor {
    int32_t j;  // the block's next item: its j-th
  };

  const int32_t* group_sizes;
  int32_t groups, m, n, k;

  // Items there can be at most, for the grid (the host knows no group sizes): every
  // group's rows in whole tiles (one partial tile per group, and the rows of no group) by
  // column tiles; or every group's (k, n) tiles.
  int64_t MostItems() const {
    const int64_t tiles_n = (int64_t{n} + kItemCols - 1) / kItemCols;
    const int64_t tiles_m = kContraction ? groups * ((int64_t{k} + P::kBM - 1) / P::kBM)
                                         : (int64_t{m} + P::kBM - 1) / P::kBM + groups + 1;
    return tiles_m * tiles_n;
  }

#if defined(JG_SM90_ENABLED)
  __device__ __forceinline__ static int32_t* RowEnd() {
    extern __shared__ unsigned char sm90_grouped_smem[];
    const uintptr_t stages = (reinterpret_cast<uintptr_t>(sm90_grouped_smem) + 1023) & ~uintptr_t(1023);
    return reinterpret_cast<int32_t*>(stages + Sm90GroupedLayout<P>::kTableOffset);
  }
  __device__ __forceinline__ static int32_t* ItemEnd() { return RowEnd() + kMaxGroupedGroups + 1; }

  __device__ __forceinline__ Items View() const { return Items(RowEnd(), ItemEnd(), groups, m, n, k); }

  // Called by every thread of the block before the roles start: fills the tables (warp 0
  // scans 32 groups a step).
  __device__ __forceinline__ void Prepare() const {
    int32_t* const row_end = RowEnd();
    int32_t* const item_end = ItemEnd();
    int32_t* const sizes = item_end + kMaxGroupedGroups + 1;
    const Items shape = View();
    for (int g = threadIdx.x; g < groups; g += blockDim.x) sizes[g] = max(group_sizes[g], 0);
    __syncthreads();
    if (threadIdx.x < 32) {
      const int lane = threadIdx.x;
      int64_t rows_before = 0;
      int32_t end_before = 0, items_before = 0;
      for (int base = 0; base <= groups; base += 32) {
        const int g = base + lane;
        int64_t rows = g < groups ? sizes[g] : 0;
#pragma unroll
        for (int d = 1; d < 32; d *= 2) {
          const int64_t up = __shfl_up_sync(0xffffffffu, rows, d);
          if (lane >= d) rows += up;
        }
        rows += rows_before;
        const int32_t end = g >= groups ? m : static_cast<int32_t>(rows < m ? rows : int64_t{m});
        int32_t begin = __shfl_up_sync(0xffffffffu, end, 1);
        if (lane == 0) begin = end_before;
        int32_t items = 0;
        if (!kContraction && g <= groups) items = shape.GroupItems(end - begin);
#pragma unroll
        for (int d = 1; d < 32; d *= 2) {
          const int32_t up = __shfl_up_sync(0xffffffffu, items, d);
          if (lane >= d) items += up;
        }
        items += items_before;
        if (g <= groups) {
          row_end[g] = end;
          if (!kContraction) item_end[g] = items;
        }
        rows_before = __shfl_sync(0xffffffffu, rows, 31);
        end_before = __shfl_sync(0xffffffffu, end, 31);
        items_before = __shfl_sync(0xffffffffu, items, 31);
      }
    }
    __syncthreads();
    if constexpr (kContraction) Order(sizes);
  }

  // Contraction: item_end[r] = the group of rank r, by rows (clipped) longest first, ties
  // by index. Each thread ranks its groups against all (groups^2 / 384 compares: ~3000 at
  // 1024 groups, a few microseconds once per block).
  __device__ __forceinline__ void Order(int32_t* rows) const {
    const int32_t* row_end = RowEnd();
    int32_t* item_end = ItemEnd();
    for (int g = threadIdx.x; g < groups; g += blockDim.x) rows[g] = row_end[g] - (g == 0 ? 0 : row_end[g - 1]);
    __syncthreads();
    for (int g = threadIdx.x; g < groups; g += blockDim.x) {
      int rank = 0;
      for (int h = 0; h < groups; ++h) rank += rows[h] > rows[g] || (rows[h] == rows[g] && h < g);
      item_end[rank] = g;
    }
    __syncthreads();
  }

  __device__ __forceinline__ Cursor Start() const { return {0}; }

  // This block's next item into *w (the contraction's waves in snake order); false when
  // the walk is over.
  __device__ __forceinline__ bool Next(const GemmProblem&, Cursor& c, Work* w) const {
    const Items view = View();
    const int32_t t = Items::Walk(c.j, blockIdx.x, gridDim.x, kContraction);
    if (t >= view.Items()) return false;
    ++c.j;
    *w = view.Get(t);
    return true;
  }

  // Every item multiplies all its rows: a tile that runs past its group's last row loads
  // and multiplies the next group's, which it does not store.
  __device__ __forceinline__ int64_t RowsLeft(const GemmProblem&, const Work&, int) const { return 64 * P::kMmaM; }
#endif
};

}  // namespace jaxgemm
