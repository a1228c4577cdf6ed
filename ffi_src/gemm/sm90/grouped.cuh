// The grouped (ragged) Hopper GEMM as a loads type of Sm90GemmKernel (kernel.cuh), which
// brings its own tile scheduler (Sm90GroupedSchedule, grouped_schedule.cuh) and stores
// (Sm90GroupedStore, grouped_epilogue.cuh); the kernel's producer, ring, consumers and
// wgmma k-loop are the GEMM's, on the sm90 table's cooperative 128 x 256 schedule.
//   Row modes (GroupedMode::kRows, kRowsRhsT): an item is a tile of one group's rows of D;
//   a tile that runs past its group's last row still loads and multiplies those rows (the
//   next group's) but stores none of them. Rows past the groups form one more group, of
//   zero k-tiles, whose tiles store zeros.
//   Contraction mode (kContraction, the weight gradient): an item is a tile of one group's
//   (k, n) product, its k-loop over the group's rows; the rows of the last k-tile past the
//   group are zeroed in shared memory before they are multiplied (Sm90ZeroRowsPast). Items
//   differ in length with the groups, so they come longest group first, and each block
//   takes one per wave in snake order (block b takes the b-th of even waves, the b-th from
//   the end of odd ones): the blocks' sums of k-tiles even out.
//   Gated mode (kRowsGated, a gated linear unit): an item is 128 columns of D, its tile's
//   halves the gate's and the up weights' products of them (two tensor maps), combined by
//   Sm90GroupedGluEpilogue.
// Stores (Sm90GroupedStoreItem): a consumer's 64 rows that lie inside the item's rows go
// through shared memory, a box of 64 rows x 128 bytes at a time, each stored by TMA (which
// clips at n), while the next item's k-loop starts; rows cut by the item's end go from the
// accumulators straight to global memory, masked by row and column. The row modes'
// optional epilogue (bias per group, activation, residual, aux: GroupedProblem) is applied
// on the way.
#pragma once
#include <cuda.h>

#include <cstdint>

#include "common/ptx_sm90.cuh"
#include "gemm/problem.h"
#include "gemm/sm90/grouped_epilogue.cuh"
#include "gemm/sm90/grouped_items.h"
#include "gemm/sm90/grouped_problem.h"
#include "gemm/sm90/grouped_schedule.cuh"
#include "gemm/sm90/mainloop.cuh"

namespace jaxgemm {

// The grouped GEMM's operand loads: A's and B's tensor maps as the k-loop reads them (row
// modes: A = lhs (m, k), B = rhs (g, k, n) or (g, n, k); contraction: A = lhs (m, k) read
// MN-major, B = rhs (m, n)); one thread issues every TMA load of the ring.
template <GroupedMode kMode>
struct Sm90GroupedLoads {
  CUtensorMap a, b;
  CUtensorMap b_up;  // kRowsGated: the up weights (b: the gate's)
  bool b_per_group;  // B's map has a group dim (row modes with more than one group)
  static constexpr bool kMapsRows = false;
  template <class P>
  using Schedule = Sm90GroupedSchedule<P, kMode>;
  using Store = Sm90GroupedStore;

#if defined(JG_SM90_ENABLED)
  __device__ __forceinline__ void Prefetch() const {
    PrefetchTensorMap(&a);
    PrefetchTensorMap(&b);
  }

  // Every item's k-tiles into the ring, in the consumers' order.
  template <class P, bool kTransA, bool kTransB>
  __device__ __forceinline__ void Produce(const GemmProblem& p, const Schedule<P>& schedule, unsigned char* tiles_a,
                                          unsigned char* tiles_b, uint64_t* full, uint64_t* empty) const {
    constexpr bool kGated = kMode == GroupedMode::kRowsGated;
    Sm90ProducerRing<P> ring(full, empty);
    GroupedWork w;
    for (typename Schedule<P>::Cursor cursor = schedule.Start(); schedule.Next(p, cursor, &w);) {
      for (int kt = 0; kt < w.k_tiles; ++kt) {
        uint64_t* const bar = ring.Acquire(P::kStageBytes);  // out-of-bounds parts count, as zeros
        const int k0 = w.k_begin + kt * P::kBK;
        unsigned char* sa = tiles_a + ring.stage * P::kTileABytes;
        unsigned char* sb = tiles_b + ring.stage * P::kTileBBytes;
        if constexpr (!kTransA) {  // lhs rows: one box of kBM rows
          TmaLoad2d(sa, &a, bar, k0, w.row0);
        } else {  // lhs read (k, m): 64-wide blocks of D's rows
#pragma unroll
          for (int j = 0; j < P::kBM / 64; ++j) TmaLoad2d(sa + j * P::kMnBlockTileBytes, &a, bar, w.row0 + 64 * j, k0);
        }
        auto load_b = [&](const CUtensorMap* map, void* dst, int c0, int c1) {
          if (b_per_group) {
            TmaLoad3d(dst, map, bar, c0, c1, w.group);
          } else {
            TmaLoad2d(dst, map, bar, c0, c1);
          }
        };
        if constexpr (kTransB) {  // rhs (g, n, k): a box of kBN rows
          load_b(&b, sb, k0, w.n0);
        } else {  // (k, n) rows: 64-wide n blocks; kGated: the gate's, then the up weights' same ones
          constexpr int kHalf = P::kBN / 128;
#pragma unroll
          for (int j = 0; j < P::kBN / 64; ++j) {
            const bool up = kGated && j >= kHalf;
            load_b(up ? &b_up : &b, sb + j * P::kMnBlockBytes, w.n0 + 64 * (up ? j - kHalf : j), k0);
          }
        }
        ring.Advance();
      }
    }
  }
#endif
};

#if defined(JG_SM90_ENABLED)

// Rows [valid, kBK) of this consumer's 64-wide block of an MN-major A stage to zero (rows
// are whole 128-byte lines, which the swizzle only permutes within), made visible to
// wgmma before any of the warpgroup's threads multiplies.
template <class P>
__device__ __forceinline__ void Sm90ZeroRowsPast(unsigned char* block, int valid, int wg) {
  const int tid = threadIdx.x % 128;
  for (int i = valid * 8 + tid; i < P::kBK * 8; i += 128) {
    reinterpret_cast<uint4*>(block)[i] = make_uint4(0, 0, 0, 0);
  }
  FenceProxyAsyncShared();
  NamedBarrierSync(1 + wg, 128);
}

// What a consumer does to an arrived stage of item w before multiplying it
// (Sm90ConsumerMma::Multiply's `ready`): the contraction's last k-tile past the group has
// its rows past the group zeroed; the row modes' stages are multiplied as they came.
template <class P, GroupedMode kMode>
struct Sm90GroupedStageReady {
  const GroupedWork& w;
  unsigned char* own_a;  // the consumer's block of stage 0's A tile
  int wg;

  __device__ __forceinline__ void operator()(int kt, int stage) const {
    if constexpr (kMode == GroupedMode::kContraction) {
      const int valid = w.k_end - (w.k_begin + kt * P::kBK);
      if (valid < P::kBK) Sm90ZeroRowsPast<P>(own_a + stage * P::kTileABytes, valid, wg);
    }
  }
};

#endif  // JG_SM90_ENABLED

}  // namespace jaxgemm
