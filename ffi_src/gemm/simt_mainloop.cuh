// SIMT mainloop (the CUTLASS 1.x / MegEngine SGEMM design): double-buffered shared memory
// and register fragments, the next k-tile prefetched from global memory into registers
// while the current one is multiplied, one __syncthreads per k-tile.
#pragma once
#include "gemm/simt_outer_product.cuh"
#include "gemm/simt_tile_loader.cuh"

namespace jaxgemm {

template <class Policy, class T, bool kTransA, bool kTransB, bool kVectorized>
struct SimtMainloop {
  static constexpr int kBM = Policy::kBM, kBN = Policy::kBN, kBK = Policy::kBK;
  using LoaderA = SimtTileLoader<T, kBM, kBK, Policy::kThreads, !kTransA, kVectorized>;
  using LoaderB = SimtTileLoader<T, kBN, kBK, Policy::kThreads, kTransB, kVectorized>;

  struct SharedStorage {
    alignas(16) float a[2][LoaderA::kSmemFloats];
    alignas(16) float b[2][LoaderB::kSmemFloats];
  };

  static_assert(Policy::kThreadTileM == 8, "the register-prefetch mainloop holds 8x8 accumulators");
  using Accumulators = float[8][8];

  // This thread's fragments of k-slice kk: rows (ty*4 .. +4) and (kBM/2 + ty*4 .. +4) of A,
  // likewise of B with tx; two LDS.128 each.
  __device__ __forceinline__ static void LoadFragments(const float* sa, const float* sb, int kk,
                                                       int ty, int tx, float (&fa)[8], float (&fb)[8]) {
    const float* pa = sa + kk * LoaderA::kSmemStride + ty * 4;
    const float* pb = sb + kk * LoaderB::kSmemStride + tx * 4;
    *reinterpret_cast<float4*>(&fa[0]) = *reinterpret_cast<const float4*>(pa);
    *reinterpret_cast<float4*>(&fa[4]) = *reinterpret_cast<const float4*>(pa + kBM / 2);
    *reinterpret_cast<float4*>(&fb[0]) = *reinterpret_cast<const float4*>(pb);
    *reinterpret_cast<float4*>(&fb[4]) = *reinterpret_cast<const float4*>(pb + kBN / 2);
  }

  __device__ __forceinline__ static void Run(LoaderA& load_a, LoaderB& load_b, int64_t k_size,
                                             SharedStorage& smem, Accumulators& acc, int ty, int tx) {
    const int k_tiles = static_cast<int>((k_size + kBK - 1) / kBK);
    float fa[2][8], fb[2][8];

    // Prologue: k-tile 0 into buffer 0, its first fragments into registers.
    load_a.LoadNext();
    load_b.LoadNext();
    load_a.Store(smem.a[0]);
    load_b.Store(smem.b[0]);
    __syncthreads();
    int read = 0;
    LoadFragments(smem.a[0], smem.b[0], 0, ty, tx, fa[0], fb[0]);

    // Steady state. Buffer `read` is being multiplied while k-tile t+1 travels
    // global -> registers; at the last k-slice the registers go to the other buffer. That
    // buffer was last read before the previous tile's barrier, so one barrier suffices.
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
        // Drain: after the last k-slice of the last tile this re-reads valid, unused data.
        LoadFragments(smem.a[read], smem.b[read], (kk + 1) % kBK, ty, tx, fa[(kk + 1) % 2],
                      fb[(kk + 1) % 2]);
        SimtOuterProduct(acc, fa[kk % 2], fb[kk % 2]);
      }
    }
  }
};

}  // namespace jaxgemm
