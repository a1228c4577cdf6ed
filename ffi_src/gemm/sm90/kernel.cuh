// The sm90 (Hopper) GEMM kernel for 16-bit inputs, and for float32 inputs as tf32 (wgmma
// cannot transpose 32-bit types: B must be K-major, and an MN-major A is loaded into
// registers, Sm90RegisterAFragments): a persistent, warp-specialized kernel that wires the
// roles of this folder's files.
// Warpgroup 0 is the producer: one thread streams A and B k-tiles with TMA into a ring of
// shared-memory stages (full/empty mbarriers; the loads types of mainloop.cuh). The other
// warpgroups (1 to 3) are consumers (Sm90Consume): they multiply with wgmma (operands
// straight from the 128-byte-swizzled stages, fp32 accumulators in registers) and apply an
// epilogue, either all on every tile (cooperative) or on alternate tiles (pingpong; see
// Sm90Policy). The ring runs across output tiles, so the producer loads ahead during
// epilogues. Stored layouts are used as they are: a transposed operand is MN-major in
// shared memory and wgmma reads it with its transpose bit. Epilogues: the TMA-store ones
// of epilogue.cuh, or the general one through shared memory (epilogue_shared.cuh); on the
// cooperative schedules the producer warpgroup's warps 1 .. kConsumers issue the
// consumers' TMA stores (Sm90StoreWarp, Sm90HandedStores). Every role walks the same work
// items (scheduler.cuh). The grouped GEMM runs on this kernel too: its loads type brings
// its own tile scheduler and stores (grouped.cuh; Sm90KernelParts).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common/ptx_sm90.cuh"
#include "gemm/epilogue.cuh"
#include "gemm/problem.h"
#include "gemm/sm90/epilogue.cuh"
#include "gemm/sm90/epilogue_shared.cuh"
#include "gemm/sm90/grouped.cuh"
#include "gemm/sm90/mainloop.cuh"
#include "gemm/sm90/policy.cuh"
#include "gemm/sm90/scheduler.cuh"
#include "gemm/sm90/timeline.cuh"

namespace jaxgemm {

// What the kernel of a loads type walks and how it stores: the GEMM's schedule and stores
// (Sm90Schedule, Sm90Store; GEMM and convolution loads), or those the loads type names (the
// grouped GEMM's: Sm90GroupedLoads).
template <class P, class Loads, class = void>
struct Sm90KernelParts {
  using Schedule = Sm90Schedule<P>;
  using Store = Sm90Store;
};
template <class P, class Loads>
struct Sm90KernelParts<P, Loads, std::void_t<typename Loads::Store>> {
  using Schedule = typename Loads::template Schedule<P>;
  using Store = typename Loads::Store;
};

template <class Store>
inline constexpr bool kSm90GroupedStore = std::is_same_v<Store, Sm90GroupedStore>;

#if defined(JG_SM90_ENABLED)

// One item's mainloop on a consumer (Sm90Consume). m64 blocks of the tile at or past row M
// are not multiplied (their A rows are not loaded, nothing of them is stored): with few
// rows, half or more of the tensor work. (Unless the schedule multiplies them all: their
// stage rows hold zeros or stale values, whose products land in rows that are never
// stored.) Pingpong: the other consumer's turn starts once this one's wgmmas are issued.
template <class P, bool kGrouped, class Mma, class Schedule, class Work, class WritePending, class Note>
__device__ __forceinline__ void Sm90MultiplyItem(const Mma& mma, float (&acc)[P::kMmaM][P::kBN / 2],
                                                 Sm90ConsumerRing<P>& ring, const GemmProblem& p,
                                                 const Schedule& schedule, const Work& w, int first_row, int wg,
                                                 int lane, unsigned char* tiles_a, uint64_t* order,
                                                 WritePending& write_pending, Note& note) {
  auto multiply = [&](auto blocks) {
    constexpr int kBlocks = decltype(blocks)::value;
    Mma::template ZeroUnmultiplied<kBlocks>(acc, w.k_tiles);
    // The timeline's first-wait events here, not in the k-loop (the loop would carry their
    // predicated code); the loop's own wait for this stage then passes at once.
    if (w.k_tiles > 0) {
      note(kTimelineConsumerWaits);
      ring.WaitFull();
      note(kTimelineFirstData);
    }
    int previous;
    if constexpr (kGrouped) {
      const Sm90GroupedStageReady<P, Schedule::kMode> ready{w, tiles_a + first_row * P::kRowBytes, wg};
      previous = mma.template Multiply<kBlocks>(acc, ring, w.k_tiles, lane, write_pending, ready);
    } else if constexpr (P::kBlockScaled) {
      previous = mma.template Multiply<kBlocks>(acc, ring, w.k_tiles, lane, write_pending, Sm90StageReady{}, w.n0);
    } else {
      previous = mma.template Multiply<kBlocks>(acc, ring, w.k_tiles, lane, write_pending);
    }
    write_pending();  // items of fewer than two k-tiles, or no wgmmas
    if (P::kPingpong && threadIdx.x % 128 == 0) MbarrierArrive(&order[1 - wg]);
    Mma::Drain(ring, previous, lane);
  };
  const int64_t rows_left = schedule.RowsLeft(p, w, first_row);
  if (rows_left > 64 * (P::kMmaM - 1)) {
    multiply(std::integral_constant<int, P::kMmaM>{});
  } else if (P::kMmaM == 2 && rows_left > 0) {
    multiply(std::integral_constant<int, 1>{});
  } else {
    multiply(std::integral_constant<int, 0>{});
  }
}

// Consumer warpgroup `wg` (0 .. kConsumers - 1): rows [64 wg, 64 wg + 64) of each tile
// (cooperative), or all rows of tiles wg, wg + 2, ... of the block's sequence (pingpong).
// kEpilogues: which of the epilogues this instance holds (Sm90Epilogues). Per item: skip
// it or wait for its turn (pingpong), multiply (Sm90ConsumerMma), fix up a stream-K piece,
// then store: a TMA-store epilogue (Sm90TmaEpilogue) or the general one (Sm90StoreTileShared);
// the grouped GEMM's items, Sm90GroupedStoreItem.
template <class P, class TIn, class TOut, bool kTransA, bool kTransB, class Loads, Sm90Epilogues kEpilogues,
          class Schedule, class Store>
__device__ __forceinline__ void Sm90Consume(const GemmProblem& p, const Schedule& schedule, int wg,
                                            unsigned char* tiles_a, unsigned char* tiles_b, uint64_t* full,
                                            uint64_t* empty, uint64_t* order, float* scratch, const Store& store,
                                            const Sm90StreamK& stream_k, const Loads& loads,
                                            const Sm90Timeline& timeline) {
  using Mma = Sm90ConsumerMma<P, TIn, kTransA, kTransB>;
  constexpr bool kGrouped = kSm90GroupedStore<Store>;
  // The launcher takes a TMA-store instance only for problems whose store is enabled.
  constexpr bool kTmaStoresOnly = kEpilogues != Sm90Epilogues::kAll;
  constexpr bool kWithFused = kEpilogues != Sm90Epilogues::kPlain;
  const int lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32;
  const bool vector_store = p.ldd % 4 == 0 && IsAligned(p.d, 4 * sizeof(TOut)) &&
                            IsAligned(p.epilogue.aux, 4 * sizeof(TOut));
  uint32_t* bias_stage =
      reinterpret_cast<uint32_t*>(reinterpret_cast<unsigned char*>(scratch) + P::kEpilogueBytes) + wg * (P::kBN / 2);
  unsigned char* const grouped_box = reinterpret_cast<unsigned char*>(scratch) + wg * P::kOutBoxBytes;
  scratch += wg * P::kEpilogueRegionBytes / 4;
  const int tid = threadIdx.x % 128;
  unsigned char* boxes = reinterpret_cast<unsigned char*>(scratch);
  // Row block mi of this consumer starts at tile row (kPingpong ? 64 mi : 64 wg).
  const int first_row = P::kPingpong ? 0 : 64 * wg;
  const Mma mma(tiles_a, tiles_b, first_row);
  Sm90ConsumerRing<P> ring{full, empty};
  float acc[P::kMmaM][P::kBN / 2];
  uint32_t order_phase = 0;
  int64_t i = -1;  // position in the block's tile sequence
  // fp8 products' row and column scales (the block-scaled call takes no epilogue operands)
  constexpr bool kScales = sizeof(TIn) == 1 && !P::kBlockScaled;
  Sm90TmaEpilogue<P, TOut, Mma::kRegisterA, kWithFused, kScales> epilogue;
  auto write_pending = [&] {
    if constexpr (!kGrouped) epilogue.WritePending(wg, boxes);
  };
  // Consumer 0 records the timeline's events (Sm90Timeline) on its first two items (the
  // GEMM's: the grouped kernel has no timeline).
  int own = 0;  // items this consumer has taken
  auto note = [&](int event, int second_event = -1) {
    if (!kGrouped && wg == 0 && tid == 0) {
      if (own == 1) timeline.Record(event);
      if (own == 2 && second_event >= 0) timeline.Record(second_event);
    }
  };
  typename Schedule::Work w;
  for (typename Schedule::Cursor cursor = schedule.Start(); schedule.Next(p, cursor, &w);) {
    ++i;
    if (P::kPingpong && i % 2 != wg) {  // the other consumer's tile
      ring.Skip(w.k_tiles);
      continue;
    }
    // Pingpong: start this tile's mainloop only after the other consumer finished its
    // previous one. Besides alternating the tensor cores, this keeps each consumer within
    // one ring pass of the producer, which parity waits on the full barriers require.
    if (P::kPingpong && i > 0) {
      MbarrierWaitLong(&order[wg], order_phase);
      order_phase ^= 1;
    }
    ++own;
    note(kTimelineConsumerItem);
    uint32_t bias_word = 0;
    if constexpr (sizeof(TOut) == 2 && !kGrouped) {
      if (kWithFused && store.fused && store.bias && tid < P::kBN / 2) {
        bias_word = Sm90BiasWord<TOut>(store, w.n0 + 2 * tid, w.batch);
      }
    }
    if constexpr (kScales && !kGrouped) {
      if (store.enabled) Sm90PrefetchScales<P, 64 * P::kMmaM>(store, w.m0 + first_row, w.n0, w.batch, tid);
    }
    Sm90MultiplyItem<P, kGrouped>(mma, acc, ring, p, schedule, w, first_row, wg, lane, tiles_a, order, write_pending,
                                  note);
    note(kTimelineMainloopDone, kTimelineMainloop2Done);
    if constexpr (kGrouped) {
      Sm90GroupedStoreItem<P, TOut, Schedule::kMode>(store, acc, w, first_row, grouped_box, wg);
    } else {
      if (w.fixup == kSm90StorePartial) {
        Sm90StorePartial<P>(stream_k, acc, first_row / 64, wg);
        note(kTimelineEpilogueIssued, kTimelineEpilogue2Issued);
        continue;
      }
      if (w.fixup == kSm90AddPartial) Sm90AddPartial<P>(stream_k, acc, first_row / 64, wg, w.partners);
      if constexpr (!P::kSwapped) {  // (swapped tiles: the general epilogue, transposed)
        if (kTmaStoresOnly || store.enabled) {
          epilogue.Store(store, acc, p, w.m0 + first_row, w.n0, w.slab, wg, boxes, bias_word, bias_stage);
          note(kTimelineEpilogueIssued, kTimelineEpilogue2Issued);
          continue;
        }
      }
      Sm90StoreTileShared<P, TOut, Loads, Mma::kRegisterA, kScales>(p, loads, acc, w, first_row, wg, warp, scratch,
                                                                    vector_store);
      note(kTimelineEpilogueIssued, kTimelineEpilogue2Issued);
    }
  }
  if constexpr (kGrouped) {
    if (tid == 0) BulkWaitGroupRead<0>();  // the box outlives its last store's read
  } else {
    epilogue.Finish(store, wg, boxes);
  }
  if (tid == 0 && wg < 2) timeline.Record(wg == 0 ? kTimelineConsumer0Exit : kTimelineConsumer1Exit);
}

#endif  // JG_SM90_ENABLED

// Whether a schedule gets an instance of the kernel per epilogue set (Sm90Epilogues), of
// which the launcher takes the smallest that holds the problem's. Code a launch never runs
// still costs: with all the epilogues the 16-bit 128 x 256 instances spill 150-160 bytes
// (GEMM and conv fprop) and are ~130 KB; the plain ones are ~50 KB, the fused ones ~85 KB,
// neither spills, and they run plain products 1-2% and fused ones 2-3% faster.
// (tf32's float outputs have no fused set.) The swapped tiles keep one instance with all
// of them; convolutions whose rows are not D's (dgrad phases) take that one.
template <class P, class Loads>
inline constexpr bool kSm90EpilogueInstances = !P::kSwapped;

// The kernel: `loads` fills the ring (warpgroup 0), Sm90Consume multiplies and stores, over
// the items of `schedule` (Sm90KernelParts: the grouped GEMM's loads bring their schedule
// and stores; `p`, `stream_k` and `timeline` are then unused).
template <class P, class TIn, class TOut, bool kTransA, bool kTransB, class Loads, Sm90Epilogues kEpilogues>
__global__ void __launch_bounds__(P::kThreads, 1)
    Sm90GemmKernel(const __grid_constant__ Loads loads, const GemmProblem p,
                   const typename Sm90KernelParts<P, Loads>::Schedule schedule,
                   const __grid_constant__ typename Sm90KernelParts<P, Loads>::Store store,
                   const Sm90StreamK stream_k, const Sm90Timeline timeline) {
#if defined(JG_SM90_ENABLED)
  using Store = typename Sm90KernelParts<P, Loads>::Store;
  constexpr bool kGrouped = kSm90GroupedStore<Store>;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* tiles_a = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  unsigned char* tiles_b = tiles_a + P::kStages * P::kTileABytes;
  float* scratch = reinterpret_cast<float*>(tiles_b + P::kStages * P::kTileBBytes);
  uint64_t* full = reinterpret_cast<uint64_t*>(tiles_a + Store::template kBarrierOffset<P>);  // (behind the bias stage)
  uint64_t* empty = full + P::kStages;
  uint64_t* order = empty + P::kStages;
  const int warpgroup = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    timeline.Record(kTimelineEntry);
    loads.Prefetch();
    store.Prefetch();
    for (int s = 0; s < P::kStages; ++s) {
      MbarrierInit(&full[s], 1);                    // the producer's expect_tx arrival
      // One arrival per warp of the consumers that read a stage.
      MbarrierInit(&empty[s], (P::kPingpong ? 4 : 4 * P::kConsumers) * P::kClusterM);
    }
    MbarrierInit(&order[0], 1);
    MbarrierInit(&order[1], 1);
    // The dynamic walk's queue (Sm90Schedule::Take): its readers are the producer thread, the
    // consumers' warps and, when they store, the store warps, in every block of the cluster.
    if constexpr (!kGrouped) {
      int readers = 1 + 4 * P::kConsumers;
      if constexpr (Sm90HandedStores<P, TOut>::kUsed) {
        if (store.enabled) readers += P::kConsumers;
      }
      const Sm90TileQueue<P> queue = Sm90TileQueue<P>::At(tiles_a);
      for (int s = 0; s < P::kQueueDepth; ++s) {
        MbarrierInit(&queue.full[s], 1);
        MbarrierInit(&queue.empty[s], readers * P::kClusterM);
      }
    }
    FenceMbarrierInit();
  }
  schedule.Prepare();
  // The peers' barriers must be initialized before anything is multicast to them.
  if constexpr (P::kClusterM > 1) {
    ClusterSync();
  } else {
    __syncthreads();
  }
  if (threadIdx.x == 0) timeline.Record(kTimelineStarted);

  if (warpgroup == 0) {
    if constexpr (P::kMovesRegisters) SetMaxRegistersDecrease<P::kProducerRegisters>();
    if (threadIdx.x == 0) {
      timeline.Record(kTimelineProducerRegisters);
      if constexpr (kSm90GemmLoads<Loads>) {
        loads.template Produce<P, kTransA, kTransB>(p, schedule, tiles_a, tiles_b, full, empty, timeline);
      } else {
        loads.template Produce<P, kTransA, kTransB>(p, schedule, tiles_a, tiles_b, full, empty);
      }
    }
    // Warps 1 .. kConsumers: the consumers' store warps (Sm90HandedStores).
    if constexpr (Sm90HandedStores<P, TOut>::kUsed && !kGrouped) {
      const int warp = threadIdx.x / 32;
      if (warp >= 1 && warp <= P::kConsumers && store.enabled) {
        Sm90StoreWarp<P, TOut>(p, schedule, store, warp - 1,
                         reinterpret_cast<unsigned char*>(scratch) + (warp - 1) * P::kEpilogueRegionBytes,
                         timeline);
      }
    }
  } else {
    if constexpr (P::kMovesRegisters) SetMaxRegistersIncrease<P::kConsumerRegisters>();
    if (threadIdx.x == 128) timeline.Record(kTimelineConsumerRegisters);
    Sm90Consume<P, TIn, TOut, kTransA, kTransB, Loads, kEpilogues>(p, schedule, warpgroup - 1, tiles_a, tiles_b,
                                                                   full, empty, order, scratch, store, stream_k,
                                                                   loads, timeline);
  }
  // A block leaves only when its peers no longer arrive on its barriers.
  if constexpr (P::kClusterM > 1) ClusterSync();
#endif
}

}  // namespace jaxgemm
