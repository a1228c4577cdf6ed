// Multistage SIMT mainloop for float32 (CUTLASS 2.x's MmaMultistage idea on CUDA cores):
// a ring of kStages shared-memory k-tiles filled by cp.async, kStages - 1 tiles in flight
// ahead of the math, double-buffered register fragments, one __syncthreads per k-tile.
// Same tile, thread and fragment layout as SimtMainloop.
#pragma once
#include "common/ptx.cuh"
#include "gemm/simt_async_tile_loader.cuh"
#include "gemm/simt_outer_product.cuh"

namespace jaxgemm {

template <class Policy, int kStages, bool kTransA, bool kTransB, bool kVectorized>
struct SimtMultistageMainloop {
  static constexpr int kBM = Policy::kBM, kBN = Policy::kBN, kBK = Policy::kBK;
  static_assert(kStages >= 2, "the ring needs a stage in flight besides the one being read");
  using LoaderA = SimtAsyncTileLoader<kBM, kBK, Policy::kThreads, !kTransA, kVectorized>;
  using LoaderB = SimtAsyncTileLoader<kBN, kBK, Policy::kThreads, kTransB, kVectorized>;

  struct SharedStorage {
    alignas(16) float a[kStages][LoaderA::kSmemFloats];
    alignas(16) float b[kStages][LoaderB::kSmemFloats];
  };

  static constexpr int kTM = Policy::kThreadTileM, kFragmentsM = Policy::kFragmentsM;
  using Accumulators = float[kTM][8];

  // This thread's fragments of k-slice kk: rows ty*4 .. +4 of each of A's kFragmentsM
  // fragments (kBM / kFragmentsM apart), columns tx*4 .. +4 of B's two (kBN / 2 apart);
  // one LDS.128 each.
  __device__ __forceinline__ static void LoadFragments(const float* sa, const float* sb, int kk, int ty, int tx,
                                                       float (&fa)[kTM], float (&fb)[8]) {
    const float* pa = sa + kk * LoaderA::kSmemStride + ty * 4;
    const float* pb = sb + kk * LoaderB::kSmemStride + tx * 4;
#pragma unroll
    for (int f = 0; f < kFragmentsM; ++f) {
      *reinterpret_cast<float4*>(&fa[4 * f]) = *reinterpret_cast<const float4*>(pa + f * (kBM / kFragmentsM));
    }
    *reinterpret_cast<float4*>(&fb[0]) = *reinterpret_cast<const float4*>(pb);
    *reinterpret_cast<float4*>(&fb[4]) = *reinterpret_cast<const float4*>(pb + kBN / 2);
  }

  __device__ __forceinline__ static void Run(LoaderA& load_a, LoaderB& load_b, int64_t k_size, SharedStorage& smem,
                                             Accumulators& acc, int ty, int tx) {
    const int k_tiles = static_cast<int>((k_size + kBK - 1) / kBK);

    // Prologue: k-tiles 0 .. kStages-2 in flight, wait for tile 0.
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < k_tiles) {
        load_a.IssueNext(smem.a[s]);
        load_b.IssueNext(smem.b[s]);
      }
      CpAsyncCommitGroup();
    }
    CpAsyncWaitGroup<kStages - 2>();
    __syncthreads();

    float fa[2][kTM], fb[2][8];
    int read = 0, write = kStages - 1;
    LoadFragments(smem.a[0], smem.b[0], 0, ty, tx, fa[0], fb[0]);

    // Steady state. At k-slice 0 of tile t the copy of tile t + kStages - 1 starts into the
    // stage tile t-1 occupied (everyone passed the barrier after reading it). At the last
    // k-slice we wait for tile t+1 (one group per tile keeps the count uniform), then one
    // barrier makes every thread's copies visible.
    for (int t = 0; t < k_tiles; ++t) {
#pragma unroll
      for (int kk = 0; kk < kBK; ++kk) {
        if (kk == kBK - 1) {
          CpAsyncWaitGroup<kStages - 2>();
          __syncthreads();
          read = read + 1 == kStages ? 0 : read + 1;
        }
        LoadFragments(smem.a[read], smem.b[read], (kk + 1) % kBK, ty, tx, fa[(kk + 1) % 2], fb[(kk + 1) % 2]);
        if (kk == 0) {
          if (t + kStages - 1 < k_tiles) {
            load_a.IssueNext(smem.a[write]);
            load_b.IssueNext(smem.b[write]);
          }
          CpAsyncCommitGroup();
          write = write + 1 == kStages ? 0 : write + 1;
        }
        SimtOuterProduct(acc, fa[kk % 2], fb[kk % 2]);
      }
    }
    CpAsyncWaitGroup<0>();  // no copy may land after the block moves on
  }
};

}  // namespace jaxgemm
