// The SIMT mainloop of gemm/simt_mainloop.cuh (double-buffered shared memory, register
// prefetch of the next k-tile, one __syncthreads per k-tile) over any pair of loaders with
// LoadNext() / Store(float* stage) in SimtTileLoader's layout: the conv's im2col loaders
// for A, SimtTileLoader for the dense B.
#pragma once
#include <cstdint>

#include "gemm/simt_outer_product.cuh"

namespace jaxgemm {

template <class Policy>
struct SimtConvMainloop {
  static constexpr int kBM = Policy::kBM, kBN = Policy::kBN, kBK = Policy::kBK;
  static constexpr int kStrideA = kBM + 4, kStrideB = kBN + 4;  // SimtTileMap's padded rows

  struct SharedStorage {
    alignas(16) float a[2][kBK * kStrideA];
    alignas(16) float b[2][kBK * kStrideB];
  };

  using Accumulators = float[8][8];

  __device__ __forceinline__ static void LoadFragments(const float* sa, const float* sb, int kk, int ty, int tx,
                                                       float (&fa)[8], float (&fb)[8]) {
    const float* pa = sa + kk * kStrideA + ty * 4;
    const float* pb = sb + kk * kStrideB + tx * 4;
    *reinterpret_cast<float4*>(&fa[0]) = *reinterpret_cast<const float4*>(pa);
    *reinterpret_cast<float4*>(&fa[4]) = *reinterpret_cast<const float4*>(pa + kBM / 2);
    *reinterpret_cast<float4*>(&fb[0]) = *reinterpret_cast<const float4*>(pb);
    *reinterpret_cast<float4*>(&fb[4]) = *reinterpret_cast<const float4*>(pb + kBN / 2);
  }

  template <class LoadA, class LoadB>
  __device__ __forceinline__ static void Run(LoadA& load_a, LoadB& load_b, int64_t k_size, SharedStorage& smem,
                                             Accumulators& acc, int ty, int tx) {
    static_assert(LoadA::kSmemStride == kStrideA && LoadB::kSmemStride == kStrideB, "SimtTileMap layout");
    const int k_tiles = static_cast<int>((k_size + kBK - 1) / kBK);
    if (k_tiles == 0) return;
    float fa[2][8], fb[2][8];

    // Prologue: k-tile 0 into buffer 0, its first fragments into registers.
    load_a.LoadNext();
    load_b.LoadNext();
    load_a.Store(smem.a[0]);
    load_b.Store(smem.b[0]);
    __syncthreads();
    int read = 0;
    LoadFragments(smem.a[0], smem.b[0], 0, ty, tx, fa[0], fb[0]);

    // Steady state: tile t+1 travels global -> registers while tile t is multiplied; at
    // the last k-slice the registers go to the other buffer (last read before the
    // previous barrier, so one barrier per tile suffices).
    for (int t = 0; t < k_tiles; ++t) {
      const bool has_next = t + 1 < k_tiles;
      if (has_next) {
        load_a.LoadNext();
        load_b.LoadNext();
      }
#pragma unroll
      for (int kk = 0; kk < kBK; ++kk) {
        if (kk == kBK - 1 && has_next) {
          load_a.Store(smem.a[read ^ 1]);
          load_b.Store(smem.b[read ^ 1]);
          __syncthreads();
          read ^= 1;
        }
        LoadFragments(smem.a[read], smem.b[read], (kk + 1) % kBK, ty, tx, fa[(kk + 1) % 2], fb[(kk + 1) % 2]);
        SimtOuterProduct(acc, fa[kk % 2], fb[kk % 2]);
      }
    }
  }
};

}  // namespace jaxgemm
