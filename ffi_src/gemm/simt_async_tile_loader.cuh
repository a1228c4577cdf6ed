// Global -> shared memory for one float32 operand tile of the multistage SIMT mainloop,
// with cp.async: no staging registers, so the copy of a later k-tile is in flight while
// the current one is multiplied without the compiler being able to sink it next to its use.
//
// Same tile and shared-memory layout as SimtTileLoader ([kBK][kExtent + 4] floats,
// K-major). A K-contiguous operand is transposed element by element (4-byte copies); an
// extent-contiguous one goes over in 16-byte copies when aligned.
#pragma once
#include <cstdint>

#include "common/ptx.cuh"

namespace jaxgemm {

template <int kExtent, int kBK, int kThreads, bool kKContiguous, bool kVectorized>
struct SimtAsyncTileLoader {
  static constexpr int kSmemStride = kExtent + 4;
  static constexpr int kSmemFloats = kBK * kSmemStride;
  static constexpr int kVecsPerThread = kExtent * kBK / (4 * kThreads);
  static_assert(kVecsPerThread >= 1 && kExtent * kBK % (4 * kThreads) == 0,
                "each thread copies whole 4-element vectors");
  static_assert(kKContiguous ? kThreads % (kBK / 4) == 0 : kThreads % (kExtent / 4) == 0,
                "a thread's vectors are a fixed k distance apart");
  static constexpr int kVecStepK = kKContiguous ? 0 : kThreads / (kExtent / 4);

  // Row i and first k of this thread's v-th 4-element vector (as in SimtTileLoader).
  __device__ __forceinline__ static void Coord(int v, int* i, int* k) {
    const int linear = v * kThreads + static_cast<int>(threadIdx.x);
    if (kKContiguous) {
      *i = linear / (kBK / 4);
      *k = linear % (kBK / 4) * 4;
    } else {
      *k = linear / (kExtent / 4);
      *i = linear % (kExtent / 4) * 4;
    }
  }

  const float* ptr[kVecsPerThread];
  int rows_left[kVecsPerThread];
  int k_left;  // K minus the next k of vector 0
  int64_t k_step;

  __device__ __forceinline__ SimtAsyncTileLoader(const float* base, int64_t ld, int64_t extent, int64_t k_size) {
    const int64_t step = kKContiguous ? 1 : ld, row_step = kKContiguous ? ld : 1;
    k_step = kBK * step;
    int i = 0, k = 0;
#pragma unroll
    for (int v = 0; v < kVecsPerThread; ++v) {
      Coord(v, &i, &k);
      ptr[v] = base + i * row_step + k * step;
      rows_left[v] = static_cast<int>(extent - i < kExtent ? extent - i : kExtent);
      if (v == 0) k_left = static_cast<int>(k_size) - k;
    }
  }

  // Starts copying the next k-tile into `smem`; out-of-range elements become zeros.
  __device__ __forceinline__ void IssueNext(float* smem) {
#pragma unroll
    for (int v = 0; v < kVecsPerThread; ++v) {
      int i, k;
      Coord(v, &i, &k);
      const int k_left_v = k_left - v * kVecStepK;
      if (kKContiguous) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const bool ok = rows_left[v] > 0 && k_left_v > j;
          CpAsync4(smem + (k + j) * kSmemStride + i, ok ? ptr[v] + j : ptr[0], ok);
        }
      } else if (kVectorized) {
        const bool ok = rows_left[v] > 0 && k_left_v > 0;
        CpAsync16(smem + k * kSmemStride + i, ok ? ptr[v] : ptr[0], ok);
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const bool ok = rows_left[v] > j && k_left_v > 0;
          CpAsync4(smem + k * kSmemStride + i + j, ok ? ptr[v] + j : ptr[0], ok);
        }
      }
      ptr[v] += k_step;
    }
    k_left -= kBK;
  }
};

}  // namespace jaxgemm
