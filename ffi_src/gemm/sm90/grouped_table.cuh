// The grouped (ragged) Hopper GEMM's arguments and its groups' tables in shared memory
// (grouped.cuh): every block scans the group sizes into row and item bounds.
#pragma once
#include <cuda.h>

#include <cstdint>

#include "common/activation.h"
#include "gemm/sm90/grouped_items.h"
#include "gemm/sm90/policy.cuh"

namespace jaxgemm {

// Everything a block needs; the tensor maps are A's and B's as the k-loop reads them
// (row modes: A = lhs (m, k), B = rhs (g, k, n) or (g, n, k); contraction: A = lhs (m, k)
// read MN-major, B = rhs (m, n)).
struct Sm90GroupedArgs {
  CUtensorMap a, b;
  CUtensorMap b_up;  // kRowsGated: the up weights (b: the gate's)
  CUtensorMap d;  // D as (rows, n): row modes (m, n); contraction (groups x k, n)
  bool tma_store;  // d is valid (D's rows are 16-byte multiples)
  // 1, as a kernel parameter: the boxes' words are then products, not the accumulators'
  // own registers, which the float boxes' register pairs would otherwise move in a
  // divergent path, and ptxas would serialize every wgmma (C7520).
  float one;
  const int32_t* group_sizes;
  void* out;
  int32_t m, n;          // rows of lhs; columns of D
  int32_t k;             // row modes: the contraction; contraction mode: D's rows per group
  int32_t groups;
  bool b_per_group;      // B's map has a group dim (row modes with more than one group)
  // The epilogue (row modes, 16-bit outputs: GroupedProblem's; Sm90GroupedEpilogue).
  bool epilogue;
  Activation activation;
  const float* bias;
  const void* residual;
  void* aux;
  const float* bias_up;  // kRowsGated (Sm90GroupedGluEpilogue)
  void* aux_up;
};

// The groups' tables, in shared memory, and the items they define (grouped_items.h): items
// of kItemCols columns of D (kRowsGated: half the tile, whose two halves multiply the gate's
// and the up weights' same columns).
template <class P, bool kContraction, int kItemCols = P::kBN>
struct Sm90GroupTable {
  using Items = GroupedItemTable<P::kBM, kItemCols, P::kBK, kContraction>;
  int32_t* row_end;
  int32_t* item_end;

#if defined(JG_SM90_ENABLED)
  // Called by every thread of the block: fills the tables (warp 0 scans 32 groups a step).
  __device__ __forceinline__ void Build(const Sm90GroupedArgs& args, int32_t* sizes) {
    const Items shape(row_end, item_end, args.groups, args.m, args.n, args.k);
    for (int g = threadIdx.x; g < args.groups; g += blockDim.x) sizes[g] = max(args.group_sizes[g], 0);
    __syncthreads();
    if (threadIdx.x < 32) {
      const int lane = threadIdx.x;
      int64_t rows_before = 0;
      int32_t end_before = 0, items_before = 0;
      for (int base = 0; base <= args.groups; base += 32) {
        const int g = base + lane;
        int64_t rows = g < args.groups ? sizes[g] : 0;
#pragma unroll
        for (int d = 1; d < 32; d *= 2) {
          const int64_t up = __shfl_up_sync(0xffffffffu, rows, d);
          if (lane >= d) rows += up;
        }
        rows += rows_before;
        const int32_t end = g >= args.groups ? args.m : static_cast<int32_t>(rows < args.m ? rows : int64_t{args.m});
        int32_t begin = __shfl_up_sync(0xffffffffu, end, 1);
        if (lane == 0) begin = end_before;
        int32_t items = 0;
        if (!kContraction && g <= args.groups) items = shape.GroupItems(end - begin);
#pragma unroll
        for (int d = 1; d < 32; d *= 2) {
          const int32_t up = __shfl_up_sync(0xffffffffu, items, d);
          if (lane >= d) items += up;
        }
        items += items_before;
        if (g <= args.groups) {
          row_end[g] = end;
          if (!kContraction) item_end[g] = items;
        }
        rows_before = __shfl_sync(0xffffffffu, rows, 31);
        end_before = __shfl_sync(0xffffffffu, end, 31);
        items_before = __shfl_sync(0xffffffffu, items, 31);
      }
    }
    __syncthreads();
    if constexpr (kContraction) Order(args, sizes);
  }

  // Contraction: item_end[r] = the group of rank r, by rows (clipped) longest first, ties
  // by index. Each thread ranks its groups against all (groups^2 / 384 compares: ~3000 at
  // 1024 groups, a few microseconds once per block).
  __device__ __forceinline__ void Order(const Sm90GroupedArgs& args, int32_t* rows) {
    for (int g = threadIdx.x; g < args.groups; g += blockDim.x) rows[g] = row_end[g] - (g == 0 ? 0 : row_end[g - 1]);
    __syncthreads();
    for (int g = threadIdx.x; g < args.groups; g += blockDim.x) {
      int rank = 0;
      for (int h = 0; h < args.groups; ++h) rank += rows[h] > rows[g] || (rows[h] == rows[g] && h < g);
      item_end[rank] = g;
    }
    __syncthreads();
  }

  __device__ __forceinline__ Items View(const Sm90GroupedArgs& args) const {
    return Items(row_end, item_end, args.groups, args.m, args.n, args.k);
  }

  // This block's j-th item (the contraction's waves in snake order).
  __device__ __forceinline__ int32_t Walk(int32_t j) const {
    return Items::Walk(j, blockIdx.x, gridDim.x, kContraction);
  }
#endif
};

}  // namespace jaxgemm
