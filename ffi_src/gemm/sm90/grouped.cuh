// The grouped (ragged) Hopper GEMM: the cooperative sm90 kernel's roles (a producer thread
// streaming TMA k-tiles into a ring of stages, two consumer warpgroups multiplying with
// wgmma) over work items that the groups define, read from device memory by every block.
//   Row modes (GroupedMode::kRows, kRowsRhsT): an item is a tile of one group's rows of D;
//   a tile that runs past its group's last row still loads and multiplies those rows (the
//   next group's) but stores none of them. Rows past the groups form one more group, of
//   zero k-tiles, whose tiles store zeros.
//   Contraction mode (kContraction, the weight gradient): an item is a tile of one group's
//   (k, n) product, its k-loop over the group's rows; the rows of the last k-tile past the
//   group are zeroed in shared memory before they are multiplied. Items differ in length
//   with the groups, so they come longest group first, and each block takes one per wave
//   in snake order (block b takes the b-th of even waves, the b-th from the end of odd
//   ones): the blocks' sums of k-tiles even out.
// Stores: a consumer's 64 rows that lie inside the item's rows go through shared memory, a
// box of 64 rows x 128 bytes at a time, each stored by TMA (which clips at n), while the
// next item's k-loop starts; rows cut by the item's end go from the accumulators straight to
// global memory, masked by row and column. The row modes' optional epilogue (bias per group,
// activation, residual, aux: GroupedProblem) is applied on the way (Sm90GroupedEpilogue,
// in grouped_epilogue.cuh; the groups' tables are in grouped_table.cuh).
//   Gated mode (kRowsGated, a gated linear unit): an item is 128 columns of D, its tile's
//   halves the gate's and the up weights' products of them (two tensor maps), combined by
//   Sm90GroupedGluEpilogue.
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/ptx_sm90.cuh"
#include "gemm/sm90/grouped.h"
#include "gemm/sm90/grouped_epilogue.cuh"
#include "gemm/sm90/grouped_items.h"
#include "gemm/sm90/grouped_table.cuh"
#include "gemm/sm90/mainloop.cuh"
#include "gemm/sm90/policy.cuh"

namespace jaxgemm {

#if defined(JG_SM90_ENABLED)

// The producer thread: every item's k-tiles into the ring.
template <class P, bool kTransA, bool kTransB, bool kGated, class Table>
__device__ __forceinline__ void Sm90GroupedProduce(const Sm90GroupedArgs& args, const Table& table,
                                                   unsigned char* tiles_a, unsigned char* tiles_b, uint64_t* full,
                                                   uint64_t* empty) {
  Sm90ProducerRing<P> ring(full, empty);
  const auto view = table.View(args);
  const int32_t items = view.Items();
  for (int32_t j = 0, t = table.Walk(0); t < items; t = table.Walk(++j)) {
    const GroupedWork w = view.Get(t);
    for (int kt = 0; kt < w.k_tiles; ++kt) {
      uint64_t* const bar = ring.Acquire(P::kStageBytes);  // out-of-bounds parts count, as zeros
      const int k0 = w.k_begin + kt * P::kBK;
      unsigned char* sa = tiles_a + ring.stage * P::kTileABytes;
      unsigned char* sb = tiles_b + ring.stage * P::kTileBBytes;
      if constexpr (!kTransA) {  // lhs rows: one box of kBM rows
        TmaLoad2d(sa, &args.a, bar, k0, w.row0);
      } else {  // lhs read (k, m): 64-wide blocks of D's rows
#pragma unroll
        for (int j = 0; j < P::kBM / 64; ++j) TmaLoad2d(sa + j * P::kMnBlockTileBytes, &args.a, bar, w.row0 + 64 * j, k0);
      }
      auto load_b = [&](const CUtensorMap* map, void* dst, int c0, int c1) {
        if (args.b_per_group) {
          TmaLoad3d(dst, map, bar, c0, c1, w.group);
        } else {
          TmaLoad2d(dst, map, bar, c0, c1);
        }
      };
      if constexpr (kTransB) {  // rhs (g, n, k): a box of kBN rows
        load_b(&args.b, sb, k0, w.n0);
      } else {  // (k, n) rows: 64-wide n blocks; kGated: the gate's, then the up weights' same ones
        constexpr int kHalf = P::kBN / 128;
#pragma unroll
        for (int j = 0; j < P::kBN / 64; ++j) {
          const bool up = kGated && j >= kHalf;
          load_b(up ? &args.b_up : &args.b, sb + j * P::kMnBlockBytes, w.n0 + 64 * (up ? j - kHalf : j), k0);
        }
      }
      ring.Advance();
    }
  }
}

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

// Consumer warpgroup wg: rows [64 wg, 64 wg + 64) of every item's tile.
template <class P, class TIn, class TOut, bool kTransA, bool kTransB, bool kContraction, bool kGated, class Table>
__device__ __forceinline__ void Sm90GroupedConsume(const Sm90GroupedArgs& args, const Table& table, int wg,
                                                   unsigned char* tiles_a, unsigned char* tiles_b, uint64_t* full,
                                                   uint64_t* empty, unsigned char* box) {
  // The descriptors of Sm90ConsumerMma (mainloop.cuh): K-major steps 32 B, MN-major two 8-row groups.
  constexpr uint32_t kStepA = kTransA ? 2048 : 32, kStepB = kTransB ? 32 : 2048;
  constexpr uint32_t kLeadA = kTransA ? P::kMnBlockBytes : 16, kLeadB = kTransB ? 16 : P::kMnBlockBytes;
  const int first_row = 64 * wg, lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32;
  unsigned char* own_a = tiles_a + first_row * P::kRowBytes;
  const uint32_t desc_a0 = uint32_t(SmemDescriptorSw128(SharedAddress(own_a), kLeadA, 1024));
  const uint32_t desc_b0 = uint32_t(SmemDescriptorSw128(SharedAddress(tiles_b), kLeadB, 1024));
  constexpr uint32_t kDescHi = uint32_t(SmemDescriptorSw128(0, 0, 1024) >> 32);
  auto descriptor = [](uint32_t lo) { return (uint64_t(kDescHi) << 32) | lo; };
  int stage = 0;
  uint32_t phase = 0;
  float acc[1][P::kBN / 2];  // (Sm90PackBox's shape: one m64 block)
  const auto view = table.View(args);
  const int32_t items = view.Items();
  for (int32_t j = 0, t = table.Walk(0); t < items; t = table.Walk(++j)) {
    const GroupedWork w = view.Get(t);
    int previous = -1;
    for (int kt = 0; kt < w.k_tiles; ++kt) {
      MbarrierWait(&full[stage], phase);
      if constexpr (kContraction) {
        const int valid = w.k_end - (w.k_begin + kt * P::kBK);
        if (valid < P::kBK) Sm90ZeroRowsPast<P>(own_a + stage * P::kTileABytes, valid, wg);
      }
      const uint32_t desc_a = desc_a0 + stage * (P::kTileABytes / 16);
      const uint32_t desc_b = desc_b0 + stage * (P::kTileBBytes / 16);
      WgmmaFence();
#pragma unroll
      for (int kk = 0; kk < P::kKSteps; ++kk) {
        Wgmma<TIn, P::kBN, kTransA, !kTransB>(acc[0], descriptor(desc_a + kk * kStepA / 16),
                                              descriptor(desc_b + kk * kStepB / 16), (kt | kk) != 0);
      }
      WgmmaCommitGroup();
      WgmmaWaitGroup<1>();  // the previous k-tile's wgmmas are done: its stage is free
      if (previous >= 0 && lane == 0) MbarrierArrive(&empty[previous]);
      previous = stage;
      if (++stage == P::kStages) {
        stage = 0;
        phase ^= 1;
      }
    }
    WgmmaWaitGroup<0>();
    if (previous >= 0 && lane == 0) MbarrierArrive(&empty[previous]);

    if constexpr (kGated) {
      Sm90GroupedGluEpilogue<P, TOut>(args, acc, w, first_row, box, wg);
      continue;
    } else if constexpr (!kContraction && sizeof(TOut) == 2) {
      if (args.epilogue) {
        Sm90GroupedEpilogue<P, TOut>(args, acc, w, first_row, box, wg);
        continue;
      }
    }
    if (args.tma_store && w.row0 + first_row + 64 <= w.row_end) {
      const int32_t d_row = (kContraction ? w.group * args.k : 0) + w.row0 + first_row;
      Sm90GroupedStoreBoxes<P, TOut>(args, acc, w.k_tiles == 0, d_row, w.n0, box, wg);
      continue;
    }
    // acc[4 j + 2 h + e]: row 16 warp + lane / 4 + 8 h, column 8 j + 2 (lane % 4) + e.
    TOut* out = static_cast<TOut*>(args.out);
    if constexpr (kContraction) out += int64_t{w.group} * args.k * args.n;
    const bool pairs = args.n % 2 == 0;
    const bool live = w.k_tiles > 0;  // else zeros (acc holds the last item's sums; it is never written here)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int32_t row = w.row0 + first_row + 16 * warp + lane / 4 + 8 * h;
      if (row >= w.row_end) continue;
      TOut* out_row = out + int64_t{row} * args.n;
#pragma unroll
      for (int j = 0; j < P::kBN / 8; ++j) {
        const int32_t col = w.n0 + 8 * j + 2 * (lane % 4);
        if (col < args.n) {
          Sm90StorePair<TOut>(out_row + col, live ? acc[0][4 * j + 2 * h] : 0.f,
                              live ? acc[0][4 * j + 2 * h + 1] : 0.f, pairs, col + 1 < args.n);
        }
      }
    }
  }
  if (threadIdx.x % 128 == 0) BulkWaitGroupRead<0>();  // the box outlives its last store's read
}

#endif  // JG_SM90_ENABLED

template <class P>
struct Sm90GroupedLayout {
  static constexpr int kTableBytes = 2 * (kMaxGroupedGroups + 1) * 4 + kMaxGroupedGroups * 4;
  static constexpr int kBarrierBytes = 2 * P::kStages * 8;
  static constexpr int kBoxBytes = P::kConsumers * P::kOutBoxBytes;  // one output box per consumer
  static constexpr int kBiasStageBytes = P::kConsumers * P::kBN * 4;  // an item's bias per consumer
  static constexpr int kSmemBytes =
      P::kStages * P::kStageBytes + kBoxBytes + kBiasStageBytes + kBarrierBytes + kTableBytes + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "over the shared memory of one block");
};

template <class P, class TIn, class TOut, bool kTransA, bool kTransB, bool kContraction, bool kGated>
__global__ void __launch_bounds__(P::kThreads, 1) Sm90GroupedKernel(const __grid_constant__ Sm90GroupedArgs args) {
#if defined(JG_SM90_ENABLED)
  static_assert(!P::kPingpong && P::kConsumers == 2 && !P::kSwapped && P::kClusterM == 1,
                "grouped: the cooperative two-consumer schedule, one block");
  extern __shared__ unsigned char smem_raw[];
  unsigned char* tiles_a = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  unsigned char* tiles_b = tiles_a + P::kStages * P::kTileABytes;
  unsigned char* boxes = tiles_b + P::kStages * P::kTileBBytes;  // 1 KB aligned, as the swizzle needs
  using Layout = Sm90GroupedLayout<P>;
  // The boxes, then the consumers' bias stages (Sm90GroupedBiasStage), then the barriers.
  uint64_t* full = reinterpret_cast<uint64_t*>(boxes + Layout::kBoxBytes + Layout::kBiasStageBytes);
  uint64_t* empty = full + P::kStages;
  int32_t* row_end = reinterpret_cast<int32_t*>(empty + P::kStages);
  int32_t* item_end = row_end + kMaxGroupedGroups + 1;
  int32_t* sizes = item_end + kMaxGroupedGroups + 1;

  if (threadIdx.x == 0) {
    PrefetchTensorMap(&args.a);
    PrefetchTensorMap(&args.b);
    if (args.tma_store) PrefetchTensorMap(&args.d);
    for (int s = 0; s < P::kStages; ++s) {
      MbarrierInit(&full[s], 1);
      MbarrierInit(&empty[s], 4 * P::kConsumers);  // one arrival per consumer warp
    }
    FenceMbarrierInit();
  }
  Sm90GroupTable<P, kContraction, kGated ? P::kBN / 2 : P::kBN> table{row_end, item_end};
  table.Build(args, sizes);  // (its __syncthreads also publishes the barriers)

  if (threadIdx.x < 128) {
    SetMaxRegistersDecrease<P::kProducerRegisters>();
    if (threadIdx.x == 0) Sm90GroupedProduce<P, kTransA, kTransB, kGated>(args, table, tiles_a, tiles_b, full, empty);
  } else {
    SetMaxRegistersIncrease<P::kConsumerRegisters>();
    const int wg = threadIdx.x / 128 - 1;
    Sm90GroupedConsume<P, TIn, TOut, kTransA, kTransB, kContraction, kGated>(args, table, wg, tiles_a, tiles_b, full,
                                                                              empty, boxes + wg * P::kOutBoxBytes);
  }
#endif
}

}  // namespace jaxgemm
