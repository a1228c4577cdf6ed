// Global -> shared memory for one float32 operand tile of the multistage SIMT mainloop,
// with cp.async: no staging registers, so the copy of a later k-tile is in flight while
// the current one is multiplied without the compiler being able to sink it next to its use.
//
// Same shared-memory layout as SimtTileLoader ([kBK][kExtent + 4] floats, K-major). An
// extent-contiguous operand goes over in 16-byte copies when aligned; a K-contiguous one
// is transposed element by element (4-byte copies), with its own thread map below.
#pragma once
#include <cstdint>

#include "common/ptx.cuh"
#include "gemm/simt_tile_loader.cuh"

namespace jaxgemm {

// Extent-contiguous operand (transposed A, row-major B): SimtTileMap's 4-element vectors.
template <int kExtent, int kBK, int kThreads, bool kKContiguous, bool kVectorized>
struct SimtAsyncTileLoader : SimtTileCursor<float, kExtent, kBK, kThreads, false> {
  static_assert(!kKContiguous, "K-contiguous operands take the specialization below");
  using Cursor = SimtTileCursor<float, kExtent, kBK, kThreads, false>;
  using Cursor::Cursor;
  using Cursor::k_left;
  using Cursor::ptr;
  using Cursor::rows_left;
  static constexpr int kVecsPerThread = Cursor::kVecsPerThread, kVecStepK = Cursor::kVecStepK;
  static constexpr int kSmemStride = Cursor::kSmemStride, kSmemFloats = Cursor::kSmemFloats;

  // Starts copying the next k-tile into `smem`; out-of-range elements become zeros.
  __device__ __forceinline__ void IssueNext(float* smem) {
#pragma unroll
    for (int v = 0; v < kVecsPerThread; ++v) {
      int i, k;
      Cursor::Coord(v, &i, &k);
      const int k_left_v = k_left - v * kVecStepK;
      if (kVectorized) {
        const bool ok = rows_left(v) > 0 && k_left_v > 0;
        CpAsync16(smem + k * kSmemStride + i, ok ? ptr(v) : ptr(0), ok);
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const bool ok = rows_left(v) > j && k_left_v > 0;
          CpAsync4(smem + k * kSmemStride + i + j, ok ? ptr(v) + j : ptr(0), ok);
        }
      }
    }
    this->Advance();
  }
};

// K-contiguous operand (row-major A, transposed B), transposed on the way in. Each warp
// copy instruction moves a 4-row x 8-k block: in global memory that is four whole 32-byte
// sectors, and in shared memory (row pitch kExtent + 4 = 4 mod 32 banks) element (k, row)
// lands in bank 4k + row, so the 32 lanes hit 32 distinct banks. (Spreading a warp over 8
// rows x 16 k in 4-element vectors instead, as SimtTileMap does, touched 16 sectors per
// instruction and wrote with 2-way bank conflicts.) A thread keeps one k and one row and
// steps down the tile kRowStep rows at a time.
template <int kExtent, int kBK, int kThreads, bool kVectorized>
struct SimtAsyncTileLoader<kExtent, kBK, kThreads, true, kVectorized> {
  static constexpr int kSmemStride = kExtent + 4, kSmemFloats = kBK * kSmemStride;
  static constexpr int kWarps = kThreads / 32, kKGroups = kBK / 8;
  static_assert(kBK % 8 == 0 && kWarps % kKGroups == 0, "every warp copies whole 8-k groups");
  static constexpr int kRowStep = 4 * kWarps / kKGroups;  // rows between a thread's copies
  static constexpr int kCopies = kExtent / kRowStep;
  static_assert(kExtent % kRowStep == 0, "the tile is whole 4-row blocks per warp");

  const float* ptr0;  // this thread's next element (its first row, its k)
  int64_t row_step;   // pointer distance of kRowStep rows
  int rows_left0;     // rows from the first row to the matrix edge, capped at 2 * kExtent
  int k_left;         // K minus this thread's next k
  int smem_offset;    // the first element's place in a stage

  __device__ __forceinline__ SimtAsyncTileLoader(const float* base, int64_t ld, int64_t extent, int64_t k_size) {
    const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
    const int k = warp % kKGroups * 8 + lane % 8;
    const int row = warp / kKGroups * 4 + lane / 8;
    ptr0 = base + row * ld + k;
    row_step = kRowStep * ld;
    rows_left0 = static_cast<int>(extent - row < 2 * kExtent ? extent - row : 2 * kExtent);
    k_left = static_cast<int>(k_size) - k;
    smem_offset = k * kSmemStride + row;
  }

  // Starts copying the next k-tile into `smem`; out-of-range elements become zeros.
  __device__ __forceinline__ void IssueNext(float* smem) {
#pragma unroll
    for (int c = 0; c < kCopies; ++c) {
      const bool ok = rows_left0 > c * kRowStep && k_left > 0;
      CpAsync4(smem + smem_offset + c * kRowStep, ok ? ptr0 + c * row_step : ptr0, ok);
    }
    ptr0 += kBK;
    k_left -= kBK;
  }
};

}  // namespace jaxgemm
