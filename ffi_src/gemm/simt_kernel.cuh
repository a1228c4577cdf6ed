// The SIMT GEMM kernel: wires the tile scheduler, the mainloop and the epilogue, and its
// host-side launcher.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "gemm/epilogue.cuh"
#include "gemm/problem.h"
#include "gemm/simt_mainloop.cuh"
#include "gemm/simt_multistage_mainloop.cuh"
#include "gemm/tile_scheduler.cuh"

namespace jaxgemm {

// A policy with kStages > 0 streams float32 through a cp.async ring; otherwise tiles go
// global -> registers -> float shared memory (16-bit inputs, which cp.async cannot convert).
template <class Policy, class TIn, bool kTransA, bool kTransB, bool kVectorized>
using SimtMainloopFor =
    std::conditional_t<(Policy::kStages > 0),
                       SimtMultistageMainloop<Policy, Policy::kStages, kTransA, kTransB, kVectorized>,
                       SimtMainloop<Policy, TIn, kTransA, kTransB, kVectorized>>;

// The mainloop's shared memory is free after its last k-tile; the epilogue reuses it to
// stage half the block's accumulators (kBM/2 rows) at a time. Only the 128x64 register
// mainloop and the 16-bit 128x128 one grow (to 16 / 32 KB); the float32 flagship does not.
template <class Policy, class TIn, bool kTransA, bool kTransB, bool kVectorized>
union SimtSharedStorage {
  typename SimtMainloopFor<Policy, TIn, kTransA, kTransB, kVectorized>::SharedStorage mainloop;
  alignas(16) float epilogue[Policy::kBM / 2 * Policy::kBN];
};

template <class Policy, class TIn, class TOut, bool kTransA, bool kTransB, bool kVectorized>
__global__ void __launch_bounds__(Policy::kThreads, Policy::kMinBlocksPerSm)
    SimtGemmKernel(const GemmProblem p) {
  using Mainloop = SimtMainloopFor<Policy, TIn, kTransA, kTransB, kVectorized>;
  static_assert(Policy::kStages == 0 || std::is_same_v<TIn, float>, "the cp.async ring takes float32 only");
  constexpr int kBM = Policy::kBM, kBN = Policy::kBN;
  extern __shared__ __align__(16) unsigned char smem_bytes[];  // dynamic: may exceed 48 KB
  auto& smem = *reinterpret_cast<SimtSharedStorage<Policy, TIn, kTransA, kTransB, kVectorized>*>(smem_bytes);

  int64_t tile_m, tile_n;
  GroupedRaster{(p.m + kBM - 1) / kBM, (p.n + kBN - 1) / kBN}.Tile(blockIdx.x, &tile_m, &tile_n);
  const int64_t m0 = tile_m * kBM, n0 = tile_n * kBN;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int ty = warp / Policy::kWarpsN * Policy::kWarpThreadsM + lane / Policy::kWarpThreadsN;
  const int tx = warp % Policy::kWarpsN * Policy::kWarpThreadsN + lane % Policy::kWarpThreadsN;

  // Vector stores need every row start of D (and Aux) 4-element aligned.
  const bool vector_store = p.ldd % 4 == 0 && IsAligned(p.d, 4 * sizeof(TOut)) &&
                            IsAligned(p.epilogue.aux, 4 * sizeof(TOut));

  // blockIdx.y walks (batch index, split-K chunk) pairs; D holds one m x n slab per pair.
  const int64_t slabs = p.batch.count * p.split_k;
  for (int64_t z = blockIdx.y; z < slabs; z += gridDim.y) {
    const int64_t split = z % p.split_k;
    const int64_t batch = z / p.split_k;
    const TIn* a = static_cast<const TIn*>(p.a) + p.batch.Offset(batch, kOperandA) + p.ChunkOffsetA(split);
    const TIn* b = static_cast<const TIn*>(p.b) + p.batch.Offset(batch, kOperandB) + p.ChunkOffsetB(split);
    const int64_t k_size = p.split_k > 1 ? p.ChunkK(split) : p.k;
    typename Mainloop::LoaderA load_a(a + (kTransA ? m0 : m0 * p.lda), p.lda, p.m - m0, k_size);
    typename Mainloop::LoaderB load_b(b + (kTransB ? n0 * p.ldb : n0), p.ldb, p.n - n0, k_size);

    constexpr int kTM = Policy::kThreadTileM, kFragmentsM = Policy::kFragmentsM;
    float acc[kTM][8];
#pragma unroll
    for (int i = 0; i < kTM; ++i) {
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[i][j] = 0.f;
    }
    Mainloop::Run(load_a, load_b, k_size, smem.mainloop, acc, ty, tx);

    // Epilogue, from shared memory so that it does not compete with the mainloop for
    // registers (under the 128-register cap it spilled): each half of the tile's rows is
    // written there as this thread's 4x4 fragments, then read back row-wise, each thread
    // taking 4-column vectors of rows kRowStep apart, in a loop that is not unrolled. With
    // split-K, slab z holds partial sums (no epilogue operands, by contract).
    // Each 4-column group is staged pair-swapped (columns 1, 0, 3, 2) and swapped back when
    // read: the 128-bit store then takes acc[i][j] from a register of the other bank than
    // fb[j], whose quad comes from a 128-bit load in column order, so the mainloop's FFMAs
    // do not read both from one bank (simt_outer_product.cuh; +6% with the serpentine order).
    constexpr int kVecsPerRow = kBN / 4, kRowStep = Policy::kThreads / kVecsPerRow;
    static_assert(Policy::kThreads % kVecsPerRow == 0 && kBM / 2 % (2 * kRowStep) == 0,
                  "each thread takes whole pairs of rows of a half tile");
    typename GemmEpilogue<TOut>::Offsets off = GemmEpilogue<TOut>::ForBatch(p, batch);
    off.out = z * p.m * p.n;
    const int64_t col = n0 + threadIdx.x % kVecsPerRow * 4;
    const int first_row = threadIdx.x / kVecsPerRow;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      __syncthreads();  // everyone is done with the mainloop's tiles or the previous half
      // The half's rows are A's fragments half * kFragmentsM / 2 ...: fragment g of the half
      // starts kBM / kFragmentsM rows after fragment g - 1.
#pragma unroll
      for (int g = 0; g < kFragmentsM / 2; ++g) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float* f = &acc[(half * kFragmentsM / 2 + g) * 4 + r][h * 4];
            const int row = g * (kBM / kFragmentsM) + ty * 4 + r;
            *reinterpret_cast<float4*>(&smem.epilogue[row * kBN + h * (kBN / 2) + tx * 4]) =
                make_float4(f[1], f[0], f[3], f[2]);
          }
        }
      }
      __syncthreads();
      if (col < p.n) {
#pragma unroll 1
        for (int r = first_row; r < kBM / 2; r += 2 * kRowStep) {
          const int64_t rows[2] = {m0 + half * (kBM / 2) + r, m0 + half * (kBM / 2) + r + kRowStep};
          if (rows[0] >= p.m) break;
          const bool live[2] = {true, rows[1] < p.m};
          float v[2][4];
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const float4 x = *reinterpret_cast<const float4*>(
                &smem.epilogue[(r + i * kRowStep) * kBN + (col - n0)]);
            v[i][0] = x.y, v[i][1] = x.x, v[i][2] = x.w, v[i][3] = x.z;
          }
          GemmEpilogue<TOut>::StoreRows(p, off, rows, live, col, v, vector_store);
        }
      }
    }
    __syncthreads();  // shared memory is reused by the next batch index
  }
}

template <class Policy, class TIn, class TOut>
cudaError_t LaunchSimtGemm(const GemmProblem& p, cudaStream_t stream) {
  const int64_t tiles = ((p.m + Policy::kBM - 1) / Policy::kBM) * ((p.n + Policy::kBN - 1) / Policy::kBN);
  if (tiles > INT32_MAX) return cudaErrorInvalidConfiguration;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(std::min<int64_t>(p.batch.count * p.split_k, 65535)));
  const dim3 block(Policy::kThreads);
  // Vector loads need every row start 4-element aligned: base pointers and pitches.
  const int vec_bytes = 4 * sizeof(TIn);
  const bool vec = p.lda % 4 == 0 && p.ldb % 4 == 0 && IsAligned(p.a, vec_bytes) && IsAligned(p.b, vec_bytes);

  cudaError_t status = cudaSuccess;
  auto launch = [&](auto trans_a, auto trans_b, auto vectorized) {
    constexpr bool kTransA = decltype(trans_a)::value, kTransB = decltype(trans_b)::value;
    constexpr bool kVec = decltype(vectorized)::value;
    auto* kernel = SimtGemmKernel<Policy, TIn, TOut, kTransA, kTransB, kVec>;
    constexpr int kSmemBytes = sizeof(SimtSharedStorage<Policy, TIn, kTransA, kTransB, kVec>);
    if (kSmemBytes > 48 * 1024) {
      // Per kernel and device; cheap and idempotent, so done at every launch.
      status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
      if (status != cudaSuccess) return;
    }
    kernel<<<grid, block, kSmemBytes, stream>>>(p);
  };
  using T = std::true_type;
  using F = std::false_type;
  auto with_layout = [&](auto vectorized) {
    if (p.trans_a) {
      p.trans_b ? launch(T{}, T{}, vectorized) : launch(T{}, F{}, vectorized);
    } else {
      p.trans_b ? launch(F{}, T{}, vectorized) : launch(F{}, F{}, vectorized);
    }
  };
  vec ? with_layout(T{}) : with_layout(F{});
  return status != cudaSuccess ? status : cudaGetLastError();
}

}  // namespace jaxgemm
