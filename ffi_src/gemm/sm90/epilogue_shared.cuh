// The sm90 kernel's general epilogue, through shared memory: whatever GemmEpilogue applies
// (alpha, beta C, bias, activation, residual, Aux; any output type), convolutions' mapped
// output rows (Loads::kMapsRows), and swapped tiles (D transposed). For the tiles the
// TMA-store epilogues (epilogue.cuh) cannot take; called by Sm90Consume (sm90/kernel.cuh).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/ptx_sm90.cuh"
#include "gemm/epilogue.cuh"
#include "gemm/problem.h"
#include "gemm/sm90/mainloop.cuh"
#include "gemm/sm90/scheduler.cuh"

namespace jaxgemm {

#if defined(JG_SM90_ENABLED)

// One consumer's rows of the tile of item w (from tile row first_row), kEpilogueCols columns
// of one 64-row block at a time: the fragments go to this warpgroup's scratch, then each
// thread applies the epilogue to 4-column row pieces, so stores are coalesced vectors and
// the long epilogue code is one loop body (unrolled per fragment it overflows the
// instruction cache).
// Fragment layout (per warp, like mma.sync's m16n8): acc[mi][4 j + 2 h + e] is row
// 16 warp + lane / 4 + 8 h, column 8 j + 2 (lane % 4) + e of the 64-row block.
template <class P, class TOut, class Loads, bool kRegisterA, bool kScales>
__device__ __forceinline__ void Sm90StoreTileShared(const GemmProblem& p, const Loads& loads,
                                                    const float (&acc)[P::kMmaM][P::kBN / 2], const Sm90Work& w,
                                                    int first_row, int wg, int warp, float* scratch,
                                                    bool vector_store) {
  const int lane = threadIdx.x % 32, tid = threadIdx.x % 128;
  using Epilogue = GemmEpilogue<TOut, kScales>;
  typename Epilogue::Offsets off = Epilogue::ForBatch(p, w.batch);
  off.out = w.slab * p.m * p.n;
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
            const int r = Sm90TileRow<P, kRegisterA>(warp * 16 + lane / 4 + 8 * h);
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
    Epilogue::StoreRows(p, off, rows, live, col0 + tid % kRowPieces * 4, v, vector_store);
  }
}

#endif  // JG_SM90_ENABLED

}  // namespace jaxgemm
