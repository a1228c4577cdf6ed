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
#include "gemm/simt_tile_loader.cuh"

namespace jaxgemm {

template <int kExtent, int kBK, int kThreads, bool kKContiguous, bool kVectorized>
struct SimtAsyncTileLoader : SimtTileMap<kExtent, kBK, kThreads, kKContiguous> {
  using Map = SimtTileMap<kExtent, kBK, kThreads, kKContiguous>;
  using Map::Coord;
  using Map::kSmemStride;
  using Map::kVecsPerThread;
  using Map::kVecStepK;

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
