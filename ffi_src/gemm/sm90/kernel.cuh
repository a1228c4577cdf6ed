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
// of epilogue.cuh, or the general one through shared memory (here); on the cooperative
// schedules the producer warpgroup's warps 1 .. kConsumers issue the consumers' TMA stores
// (Sm90StoreWarp, Sm90HandedStores). Every role walks the same work items (scheduler.cuh).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common/ptx_sm90.cuh"
#include "gemm/epilogue.cuh"
#include "gemm/problem.h"
#include "gemm/sm90/epilogue.cuh"
#include "gemm/sm90/mainloop.cuh"
#include "gemm/sm90/policy.cuh"
#include "gemm/sm90/scheduler.cuh"
#include "gemm/sm90/timeline.cuh"

namespace jaxgemm {

#if defined(JG_SM90_ENABLED)

// Consumer warpgroup `wg` (0 .. kConsumers - 1): rows [64 wg, 64 wg + 64) of each tile
// (cooperative), or all rows of tiles wg, wg + 2, ... of the block's sequence (pingpong).
// kEpilogues: which of the epilogues this instance holds (Sm90Epilogues).
template <class P, class TIn, class TOut, bool kTransA, bool kTransB, class Loads, Sm90Epilogues kEpilogues>
__device__ __forceinline__ void Sm90Consume(const GemmProblem& p, const Sm90Schedule<P>& schedule, int wg,
                                            unsigned char* tiles_a, unsigned char* tiles_b, uint64_t* full,
                                            uint64_t* empty, uint64_t* order, float* scratch,
                                            const Sm90Store& store, const Sm90StreamK& stream_k,
                                            const Loads& loads, const Sm90Timeline& timeline) {
  // Descriptor geometry: K-major tiles step 32 B per wgmma (k16, or k8 for tf32) inside the
  // swizzled row; MN-major tiles step two 8-row (1 KB) groups.
  // The leading byte offset matters only for MN-major tiles (the 64-wide block stride).
  constexpr uint32_t kStepA = kTransA ? 2048 : 32, kStepB = kTransB ? 32 : 2048;
  constexpr uint32_t kLeadA = kTransA ? P::kMnBlockBytes : 16, kLeadB = kTransB ? 16 : P::kMnBlockBytes;
  // The launcher takes a TMA-store instance only for problems whose store is enabled.
  constexpr bool kTmaStoresOnly = kEpilogues != Sm90Epilogues::kAll;
  constexpr bool kWithFused = kEpilogues != Sm90Epilogues::kPlain;
  const int lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32;
  const bool vector_store = p.ldd % 4 == 0 && IsAligned(p.d, 4 * sizeof(TOut)) &&
                            IsAligned(p.epilogue.aux, 4 * sizeof(TOut));
  uint32_t* bias_stage =
      reinterpret_cast<uint32_t*>(reinterpret_cast<unsigned char*>(scratch) + P::kEpilogueBytes) + wg * (P::kBN / 2);
  scratch += wg * P::kEpilogueRegionBytes / 4;
  const int tid = threadIdx.x % 128;
  // Row block mi of this consumer starts at tile row (kPingpong ? 64 mi : 64 wg).
  const int first_row = P::kPingpong ? 0 : 64 * wg;
  const uint32_t smem_a = SharedAddress(tiles_a) + first_row * P::kRowBytes;
  const uint32_t smem_b = SharedAddress(tiles_b);
  // Stage 0's descriptors at k-step 0, as low and high words. Another stage's, k-step's or
  // m64 block's descriptor adds its byte offset / 16 (the address field's unit) to the low
  // word: shared memory is below 256 KB, so the 14-bit field never carries into the rest.
  // One 32-bit add per descriptor in the k-loop instead of rebuilding it (NOTES.md,
  // session 25).
  const uint32_t desc_a0_lo = uint32_t(SmemDescriptorSw128(smem_a, kLeadA, 1024));
  const uint32_t desc_b0_lo = uint32_t(SmemDescriptorSw128(smem_b, kLeadB, 1024));
  constexpr uint32_t kDescHi = uint32_t(SmemDescriptorSw128(0, 0, 1024) >> 32);
  auto descriptor = [](uint32_t lo) { return (uint64_t(kDescHi) << 32) | lo; };
  // tf32 with an MN-major A: A from registers (Sm90RegisterAFragments).
  constexpr bool kRegisterA = std::is_same_v<TIn, float> && kTransA;
  static_assert(!kRegisterA || P::kMmaM == 1, "register A: one m64 block per consumer");
  const uint32_t tiles_a_address = SharedAddress(tiles_a);
  const Sm90RegisterAFragments<P> register_a(first_row);
  // The tile row (of the consumer's 64) that accumulator row r holds: r, or with register A
  // its permutation, which every epilogue undoes.
  auto tile_row = [](int r) { return kRegisterA ? Sm90RegisterAFragments<P>::Row(r) : r; };
  // A consumed stage is free once every cluster block's consumers are done with it (the
  // producers of all of them write into it).
  auto Release = [](uint64_t* empty_barrier) {
    if constexpr (P::kClusterM == 1) {
      MbarrierArrive(empty_barrier);
    } else {
#pragma unroll
      for (int r = 0; r < P::kClusterM; ++r) MbarrierArriveCluster(empty_barrier, r);
    }
  };
  int stage = 0;
  uint32_t phase = 0;
  float acc[P::kMmaM][P::kBN / 2];
  uint32_t order_phase = 0;
  int64_t i = -1;  // position in the block's tile sequence
  bool boxes_in_use = false;  // Sm90HandedStores: this consumer's boxes hold a tile's blocks
  // Sm90HandedStores' plain epilogue: boxes 0 and 1 of a tile are written at once; boxes
  // 2 and 3 (kBN = 256), which must wait for their slots' stores, wait in registers as
  // rounded words and are written while the next tile's first wgmmas run (or at the exit),
  // so that the tensor cores do not idle through those waits.
  // (A float tile's 8 boxes are all written at once: their words would not fit registers.)
  using Handed = Sm90HandedStores<P, TOut>;
  constexpr int kLateBoxes = sizeof(TOut) == 2 && Handed::kUsed && Handed::kBoxes > 2 ? Handed::kBoxes - 2 : 0;
  uint32_t late_words[kLateBoxes > 0 ? kLateBoxes : 1][16];
  bool pending = false;  // `late_words` hold boxes not yet written
  // Where this thread's values go in an output box (made where used, so that it holds no
  // registers through the mainloop).
  static_assert(!kRegisterA || sizeof(TOut) == 4, "tf32 products have float outputs (16-bit boxes: fragment rows)");
  auto box_writer = [&] {
    using W = Sm90BoxWriter<TOut>;
    return W(tile_row(W::FragmentRow(0)), tile_row(W::FragmentRow(1)));
  };
  auto write_pending = [&] {
    if constexpr (kLateBoxes > 0) {
      if (pending) {
        const Sm90BoxWriter<TOut> writer = box_writer();
#pragma unroll
        for (int c = 0; c < kLateBoxes; ++c) {
          Sm90WriteBoxWords<P, TOut>(writer, late_words[c], 2 + c, wg, reinterpret_cast<unsigned char*>(scratch), true);
        }
        pending = false;
      }
    }
  };
  // Consumer 0 records the timeline's events (Sm90Timeline) on its first two items.
  int own = 0;  // items this consumer has taken
  auto note = [&](int event, int second_event = -1) {
    if (wg == 0 && tid == 0) {
      if (own == 1) timeline.Record(event);
      if (own == 2 && second_event >= 0) timeline.Record(second_event);
    }
  };
  Sm90Work w;
  for (Sm90Cursor cursor = schedule.Start(); schedule.Next(p, cursor, &w);) {
    const int64_t slab = w.slab;
    ++i;
    if (P::kPingpong && i % 2 != wg) {  // the other consumer's tile: skip its stages
      const int next = stage + w.k_tiles;
      phase ^= (next / P::kStages) & 1;
      stage = next % P::kStages;
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
    if constexpr (sizeof(TOut) == 2) {
      if (kWithFused && store.fused && store.bias && tid < P::kBN / 2) {
        bias_word = Sm90BiasWord<TOut>(store, w.n0 + 2 * tid, w.batch);
      }
    }
    // The mainloop over the tile's first kBlocks m64 blocks (a compile-time count: a wgmma
    // under a runtime condition makes ptxas serialize the wgmmas); the others hold zeros.
    // With none, the consumer only hands the stages back.
    auto mainloop = [&](auto blocks) {
      constexpr int kBlocks = decltype(blocks)::value;
#pragma unroll
      for (int mi = 0; mi < P::kMmaM; ++mi) {
        if (mi >= kBlocks || w.k_tiles == 0) {
#pragma unroll
          for (int j = 0; j < P::kBN / 2; ++j) acc[mi][j] = 0.f;
        }
      }
      int previous = -1;
      // Register A: two fragment sets, so that a k-tile's loads do not overwrite the set the
      // previous k-tile's wgmmas (still in flight) read. Each set needs fixed registers, so
      // the k-loop runs k-tile pairs, then an odd last k-tile after it: ptxas serializes
      // every wgmma (C7513) if any path could load a set while its group is in flight.
      [[maybe_unused]] uint32_t a_frags[kRegisterA ? 2 : 1][P::kKSteps][4];
      auto k_tile = [&](int kt, auto set) {
        MbarrierWait(&full[stage], phase);
        if constexpr (kBlocks > 0) {
          const uint32_t desc_b = desc_b0_lo + stage * (P::kTileBBytes / 16);
          if constexpr (kRegisterA) {
            constexpr int kSet = decltype(set)::value;
            register_a.Load(tiles_a_address + stage * P::kTileABytes, a_frags[kSet]);
            WgmmaFence();
#pragma unroll
            for (int kk = 0; kk < P::kKSteps; ++kk) {
              WgmmaTf32RegisterA<P::kBN>(acc[0], a_frags[kSet][kk], descriptor(desc_b + kk * kStepB / 16),
                                         (kt | kk) != 0);
            }
          } else {
            const uint32_t desc_a = desc_a0_lo + stage * (P::kTileABytes / 16);
            WgmmaFence();
#pragma unroll
            for (int kk = 0; kk < P::kKSteps; ++kk) {
#pragma unroll
              for (int mi = 0; mi < kBlocks; ++mi) {
                // 64 rows of A further on: 64 x 128 B rows (K-major) or the next 64-wide block.
                const uint32_t a_offset = (mi * P::kMnBlockBytes + kk * kStepA) / 16;
                Wgmma<TIn, P::kBN, kTransA, !kTransB>(acc[mi], descriptor(desc_a + a_offset),
                                                      descriptor(desc_b + kk * kStepB / 16), (kt | kk) != 0);
              }
            }
          }
          WgmmaCommitGroup();
          if (kt == 1) write_pending();  // two k-tiles of wgmmas queued meanwhile
          // Keep one group in flight: the previous k-tile's group is done, its stage is free.
          WgmmaWaitGroup<1>();
          if (previous >= 0 && lane == 0) Release(&empty[previous]);
          previous = stage;
        } else {
          if (lane == 0) Release(&empty[stage]);
        }
        if (++stage == P::kStages) {
          stage = 0;
          phase ^= 1;
        }
      };
      // The timeline's first-wait events here, not in the k-loop (the loop would carry their
      // predicated code); the loop's own wait for this stage then passes at once.
      if (w.k_tiles > 0) {
        note(kTimelineConsumerWaits);
        MbarrierWait(&full[stage], phase);
        note(kTimelineFirstData);
      }
      using First = std::integral_constant<int, 0>;
      if constexpr (kRegisterA) {
        int kt = 0;
        for (; kt + 1 < w.k_tiles; kt += 2) {
          k_tile(kt, First{});
          k_tile(kt + 1, std::integral_constant<int, 1>{});
        }
        if (kt < w.k_tiles) k_tile(kt, First{});
      } else {
        for (int kt = 0; kt < w.k_tiles; ++kt) k_tile(kt, First{});
      }
      write_pending();  // items of fewer than two k-tiles, or no wgmmas
      if (P::kPingpong && threadIdx.x % 128 == 0) MbarrierArrive(&order[1 - wg]);
      WgmmaWaitGroup<0>();
      if (previous >= 0 && lane == 0) Release(&empty[previous]);
    };
    // m64 blocks of the tile at or past row M are not multiplied (their A rows are not
    // loaded, nothing of them is stored): with few rows, half or more of the tensor work.
    // (Unless the schedule multiplies them all: their stage rows hold zeros or stale values,
    // whose products land in rows that are never stored.)
    const int64_t rows_left = schedule.multiply_empty ? 64 * P::kMmaM : p.m - (w.m0 + first_row);
    if (rows_left > 64 * (P::kMmaM - 1)) {
      mainloop(std::integral_constant<int, P::kMmaM>{});
    } else if (P::kMmaM == 2 && rows_left > 0) {
      mainloop(std::integral_constant<int, 1>{});
    } else {
      mainloop(std::integral_constant<int, 0>{});
    }
    note(kTimelineMainloopDone, kTimelineMainloop2Done);
    if (w.fixup == kSm90StorePartial) {
      Sm90StorePartial<P>(stream_k, acc, first_row / 64, wg);
      note(kTimelineEpilogueIssued, kTimelineEpilogue2Issued);
      continue;
    }
    if (w.fixup == kSm90AddPartial) Sm90AddPartial<P>(stream_k, acc, first_row / 64, wg, w.partners);

    if constexpr (!P::kSwapped) {  // (swapped tiles: the general epilogue, transposed)
      if (kTmaStoresOnly || store.enabled) {
        if (kWithFused && store.fused) {  // 16-bit outputs only (MakeSm90Store)
          if constexpr (sizeof(TOut) == 2) {
            Sm90StoreTileFused<P, TOut, Handed::kUsed>(store, acc, w.m0 + first_row, w.n0, slab, wg,
                                                        reinterpret_cast<unsigned char*>(scratch), bias_word, bias_stage,
                                                        boxes_in_use);
            boxes_in_use = Handed::kUsed;
          }
        } else if constexpr (Handed::kUsed) {
          if constexpr (kRegisterA) {
            if (store.transposed) {
              Sm90WriteTransposedBoxes<P>(acc[0], p.epilogue.alpha, wg, reinterpret_cast<unsigned char*>(scratch),
                                          boxes_in_use);
              boxes_in_use = true;
              note(kTimelineEpilogueIssued, kTimelineEpilogue2Issued);
              continue;
            }
          }
          const Sm90BoxWriter<TOut> writer = box_writer();
#pragma unroll
          for (int c = 0; c < Handed::kBoxes; ++c) {
            if (c < Handed::kBoxes - kLateBoxes) {
              uint32_t box_words[16];
              Sm90PackBox<P, TOut>(acc, c, p.epilogue.alpha, box_words);
              Sm90WriteBoxWords<P, TOut>(writer, box_words, c, wg, reinterpret_cast<unsigned char*>(scratch),
                                         boxes_in_use || c >= 2);
            } else if constexpr (kLateBoxes > 0) {
              Sm90PackBox<P, TOut>(acc, c, p.epilogue.alpha, late_words[c - 2]);
            }
          }
          boxes_in_use = true;
          pending = kLateBoxes > 0;
        } else {
          Sm90StoreTile<P, TOut>(store, acc, w.m0 + first_row, w.n0, slab, p.epilogue.alpha, wg,
                                 reinterpret_cast<unsigned char*>(scratch), box_writer());
        }
        note(kTimelineEpilogueIssued, kTimelineEpilogue2Issued);
        continue;
      }
    }

    // Epilogue through shared memory, kEpilogueCols columns of one 64-row block at a time:
    // the fragments go to this warpgroup's scratch, then each thread applies the epilogue
    // to 4-column row pieces, so stores are coalesced vectors and the long epilogue code is
    // one loop body (unrolled per fragment it overflows the instruction cache).
    // Fragment layout (per warp, like mma.sync's m16n8): acc[mi][4 j + 2 h + e] is row
    // 16 warp + lane / 4 + 8 h, column 8 j + 2 (lane % 4) + e of the 64-row block.
    typename GemmEpilogue<TOut>::Offsets off = GemmEpilogue<TOut>::ForBatch(p, w.batch);
    off.out = slab * p.m * p.n;
    constexpr int kChunks = P::kBN / P::kEpilogueCols;
    constexpr int kPieces = 64 * P::kEpilogueCols / 4 / 128;  // 4-column pieces per thread
    constexpr int kPiecesPerRow = P::kEpilogueCols / 4;
    constexpr int kSwappedPitch = 68;  // floats per scratch row of a swapped tile's chunk
    static_assert(!P::kSwapped || (P::kEpilogueCols == 32 && kPieces == 4 &&
                                   P::kEpilogueCols * kSwappedPitch * 4 <= P::kEpilogueRegionBytes),
                  "a swapped chunk: 32 rows of D by 64 columns, four pieces per thread");
    static_assert(!P::kSwapped || !Loads::kMapsRows, "swapped tiles: GEMMs only");
    // A runtime loop keeps one copy of the store code; the fragment writes pick the
    // chunk's registers with compile-time indices (one guarded block per chunk).
#pragma unroll 1
    for (int c = 0; c < P::kMmaM * kChunks; ++c) {
      NamedBarrierSync(1 + wg, 128);  // the previous chunk's (or tile's) reads are done
#pragma unroll
      for (int mi = 0; mi < P::kMmaM; ++mi) {
#pragma unroll
        for (int cc = 0; cc < kChunks; ++cc) {
          if (mi * kChunks + cc != c) continue;
#pragma unroll
          for (int jj = 0; jj < P::kEpilogueCols / 8; ++jj) {
            const int j = cc * P::kEpilogueCols / 8 + jj;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int r = tile_row(warp * 16 + lane / 4 + 8 * h);
              if constexpr (P::kSwapped) {
                // Transposed: a scratch row per chunk column (a row of D); a warp's 32
                // values of one store land in 32 banks (2 (lane % 4) rows of 68 floats).
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                  scratch[(8 * jj + 2 * (lane % 4) + e) * kSwappedPitch + r] = acc[mi][4 * j + 2 * h + e];
                }
              } else {
                *reinterpret_cast<float2*>(&scratch[r * P::kEpiloguePitch + 8 * jj + 2 * (lane % 4)]) =
                    make_float2(acc[mi][4 * j + 2 * h], acc[mi][4 * j + 2 * h + 1]);
              }
            }
          }
        }
      }
      NamedBarrierSync(1 + wg, 128);
      const int64_t block_row = w.m0 + first_row + 64 * (c / kChunks);
      const int64_t chunk_col = w.n0 + (c % kChunks) * P::kEpilogueCols;
      // The chunk by rows of D: the tile's rows block_row ... (64) by its columns chunk_col ...
      // (32), or, swapped, D's rows chunk_col ... (32) by its columns block_row ... (64) (p is
      // then the swapped problem: D has p.n rows and p.m columns), so that each thread's
      // pieces lie along rows of D either way.
      constexpr int kRowPieces = P::kSwapped ? 16 : kPiecesPerRow;  // 4-column pieces per row
      constexpr int kPitch = P::kSwapped ? kSwappedPitch : P::kEpiloguePitch;
      const int64_t row0 = P::kSwapped ? chunk_col : block_row, col0 = P::kSwapped ? block_row : chunk_col;
      const int64_t rows_of_d = P::kSwapped ? p.n : p.m, cols_of_d = P::kSwapped ? p.m : p.n;
      if (col0 + tid % kRowPieces * 4 >= cols_of_d) continue;
      // All of this thread's pieces at once (same columns, rows 128 / kRowPieces apart).
      int64_t rows[kPieces];
      bool live[kPieces];
      float v[kPieces][4];
#pragma unroll
      for (int piece = 0; piece < kPieces; ++piece) {
        const int r = piece * (128 / kRowPieces) + tid / kRowPieces;
        rows[piece] = row0 + r;
        live[piece] = rows[piece] < rows_of_d;
        if constexpr (Loads::kMapsRows) {
          if (live[piece]) rows[piece] = loads.OutputRow(rows[piece]);
        }
        const float4 v4 = *reinterpret_cast<const float4*>(&scratch[r * kPitch + tid % kRowPieces * 4]);
        v[piece][0] = v4.x, v[piece][1] = v4.y, v[piece][2] = v4.z, v[piece][3] = v4.w;
      }
      GemmEpilogue<TOut>::StoreRows(p, off, rows, live, col0 + tid % kRowPieces * 4, v, vector_store);
    }
    note(kTimelineEpilogueIssued, kTimelineEpilogue2Issued);
  }
  write_pending();
  // The block's shared memory must outlive the TMA stores that read it. Their writes need
  // no wait: the grid's completion makes them visible to later work, and waiting for them
  // here would add their latency to the last tile's exposed epilogue.
  if (store.enabled && tid == 0) BulkWaitGroupRead<0>();
  if (boxes_in_use) {  // the store warp's last stores have read the boxes (with Aux: one pair)
    NamedBarrierSync(Handed::Free(wg, 0), Handed::kThreads);
    if (!(store.fused && store.with_aux)) NamedBarrierSync(Handed::Free(wg, 1), Handed::kThreads);
  }
  if (tid == 0 && wg < 2) timeline.Record(wg == 0 ? kTimelineConsumer0Exit : kTimelineConsumer1Exit);
}

#endif  // JG_SM90_ENABLED

// Whether a GEMM schedule gets an instance of the kernel per epilogue set (Sm90Epilogues),
// of which the launcher takes the smallest that holds the problem's. Code a launch never
// runs still costs: with all the epilogues the 16-bit 128 x 256 instances spill 130-140
// bytes and are ~130 KB; the plain ones are ~50 KB, the fused ones ~85 KB, neither spills,
// and they run plain products 1-2% and fused ones 2-3% faster (NOTES.md, session 38).
// (tf32's float outputs have no fused set.) Convolutions and the swapped tiles keep one
// instance with all of them.
template <class P, class Loads>
inline constexpr bool kSm90EpilogueInstances = !P::kSwapped && std::is_same_v<Loads, Sm90MatrixLoads>;

// The kernel: `loads` fills the ring (warpgroup 0), Sm90Consume multiplies and stores.
template <class P, class TIn, class TOut, bool kTransA, bool kTransB, class Loads, Sm90Epilogues kEpilogues>
__global__ void __launch_bounds__(P::kThreads, 1)
    Sm90GemmKernel(const __grid_constant__ Loads loads, const GemmProblem p, const Sm90Schedule<P> schedule,
                   const __grid_constant__ Sm90Store store, const Sm90StreamK stream_k, const Sm90Timeline timeline) {
#if defined(JG_SM90_ENABLED)
  extern __shared__ unsigned char smem_raw[];
  unsigned char* tiles_a = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  unsigned char* tiles_b = tiles_a + P::kStages * P::kTileABytes;
  float* scratch = reinterpret_cast<float*>(tiles_b + P::kStages * P::kTileBBytes);
  uint64_t* full =
      reinterpret_cast<uint64_t*>(reinterpret_cast<unsigned char*>(scratch) + P::kEpilogueBytes + P::kBiasStageBytes);
  uint64_t* empty = full + P::kStages;
  uint64_t* order = empty + P::kStages;
  const int warpgroup = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    timeline.Record(kTimelineEntry);
    loads.Prefetch();
    if (store.enabled) PrefetchTensorMap(&store.d);
    if (store.with_aux) PrefetchTensorMap(&store.aux);
    for (int s = 0; s < P::kStages; ++s) {
      MbarrierInit(&full[s], 1);                    // the producer's expect_tx arrival
      // One arrival per warp of the consumers that read a stage.
      MbarrierInit(&empty[s], (P::kPingpong ? 4 : 4 * P::kConsumers) * P::kClusterM);
    }
    MbarrierInit(&order[0], 1);
    MbarrierInit(&order[1], 1);
    FenceMbarrierInit();
  }
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
      if constexpr (std::is_same_v<Loads, Sm90MatrixLoads>) {
        loads.template Produce<P, kTransA, kTransB>(p, schedule, tiles_a, tiles_b, full, empty, timeline);
      } else {
        loads.template Produce<P, kTransA, kTransB>(p, schedule, tiles_a, tiles_b, full, empty);
      }
    }
    // Warps 1 .. kConsumers: the consumers' store warps (Sm90HandedStores).
    if constexpr (Sm90HandedStores<P, TOut>::kUsed) {
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
