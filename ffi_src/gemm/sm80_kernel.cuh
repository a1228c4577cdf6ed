// The sm80 tensor-core GEMM kernel for 16-bit inputs: scheduler + Sm80Mainloop + the shared
// epilogue, and its launcher. Needs leading dimensions that are multiples of 8 elements
// and 16-byte aligned bases (dispatch falls back to SIMT otherwise).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "gemm/epilogue.cuh"
#include "gemm/problem.h"
#include "gemm/sm80_launch.h"
#include "gemm/sm80_mainloop.cuh"
#include "gemm/tile_scheduler.cuh"

namespace jaxgemm {

template <class TIn, class TOut, bool kTransA, bool kTransB>
__global__ void __launch_bounds__(Sm80Policy::kThreads, 1) Sm80GemmKernel(const GemmProblem p) {
  using Mainloop = Sm80Mainloop<TIn, kTransA, kTransB>;
  using P = Sm80Policy;
  extern __shared__ __align__(128) unsigned char smem_bytes[];
  auto& smem = *reinterpret_cast<typename Mainloop::SharedStorage*>(smem_bytes);

  int64_t tile_m, tile_n;
  GroupedRaster{(p.m + P::kBM - 1) / P::kBM, (p.n + P::kBN - 1) / P::kBN}.Tile(blockIdx.x, &tile_m, &tile_n);
  const int64_t m0 = tile_m * P::kBM, n0 = tile_n * P::kBN;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_m = warp % P::kWarpsM, warp_n = warp / P::kWarpsM;
  const bool vector_store = p.ldd % 2 == 0 && IsAligned(p.d, 2 * sizeof(TOut)) &&
                            IsAligned(p.epilogue.aux, 2 * sizeof(TOut));

  const int64_t slabs = p.batch.count * p.split_k;
  for (int64_t z = blockIdx.y; z < slabs; z += gridDim.y) {
    const int64_t split = z % p.split_k, batch = z / p.split_k;
    const TIn* a = static_cast<const TIn*>(p.a) + p.batch.Offset(batch, kOperandA) + p.ChunkOffsetA(split);
    const TIn* b = static_cast<const TIn*>(p.b) + p.batch.Offset(batch, kOperandB) + p.ChunkOffsetB(split);
    const int64_t k_size = p.split_k > 1 ? p.ChunkK(split) : p.k;
    typename Mainloop::LoaderA load_a(a + (kTransA ? m0 : m0 * p.lda), p.lda, p.m - m0, k_size);
    typename Mainloop::LoaderB load_b(b + (kTransB ? n0 * p.ldb : n0), p.ldb, p.n - n0, k_size);

    typename Mainloop::Accumulators acc;
#pragma unroll
    for (int mi = 0; mi < P::kMmaM; ++mi)
#pragma unroll
      for (int ni = 0; ni < P::kMmaN; ++ni)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[mi][ni][r] = 0.f;
    Mainloop::Run(load_a, load_b, k_size, smem, acc);

    // mma accumulator layout: d[0..1] at (row g, cols 2t, 2t+1), d[2..3] at row g + 8.
    typename GemmEpilogue<TOut>::Offsets off = GemmEpilogue<TOut>::ForBatch(p, batch);
    off.out = z * p.m * p.n;
#pragma unroll
    for (int mi = 0; mi < P::kMmaM; ++mi) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int64_t row = m0 + warp_m * P::kWarpM + mi * 16 + lane / 4 + half * 8;
        if (row >= p.m) continue;
#pragma unroll
        for (int ni = 0; ni < P::kMmaN; ++ni) {
          const int64_t col = n0 + warp_n * P::kWarpN + ni * 8 + lane % 4 * 2;
          if (col >= p.n) continue;
          const float v[2] = {acc[mi][ni][half * 2], acc[mi][ni][half * 2 + 1]};
          GemmEpilogue<TOut>::template Store<2>(p, off, row, col, v, vector_store);
        }
      }
    }
  }
}

template <class TIn, class TOut>
cudaError_t LaunchSm80Gemm(const GemmProblem& p, cudaStream_t stream) {
  using P = Sm80Policy;
  const int64_t tiles = ((p.m + P::kBM - 1) / P::kBM) * ((p.n + P::kBN - 1) / P::kBN);
  if (tiles > INT32_MAX) return cudaErrorInvalidConfiguration;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(std::min<int64_t>(p.batch.count * p.split_k, 65535)));
  cudaError_t status = cudaSuccess;
  auto launch = [&](auto trans_a, auto trans_b) {
    constexpr bool kTransA = decltype(trans_a)::value, kTransB = decltype(trans_b)::value;
    auto* kernel = Sm80GemmKernel<TIn, TOut, kTransA, kTransB>;
    constexpr int kSmemBytes = sizeof(typename Sm80Mainloop<TIn, kTransA, kTransB>::SharedStorage);
    status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
    if (status != cudaSuccess) return;
    kernel<<<grid, P::kThreads, kSmemBytes, stream>>>(p);
  };
  using T = std::true_type;
  using F = std::false_type;
  if (p.trans_a) {
    p.trans_b ? launch(T{}, T{}) : launch(T{}, F{});
  } else {
    p.trans_b ? launch(F{}, T{}) : launch(F{}, F{});
  }
  return status != cudaSuccess ? status : cudaGetLastError();
}

}  // namespace jaxgemm
