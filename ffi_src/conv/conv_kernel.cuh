// The implicit-GEMM conv kernels: the GEMM kernels' wiring (tile scheduler -> mainloop ->
// shared epilogue) with the conv's A loaders, one (group, split) slab per blockIdx.y, and
// their launchers. The output of a group is the m x n block of D at column group * n.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "conv/implicit_gemm.h"
#include "conv/launch.h"
#include "conv/slab.cuh"
#include "conv/simt_conv_loaders.cuh"
#include "conv/simt_conv_mainloop.cuh"
#include "conv/sm80_conv_loaders.cuh"
#include "gemm/epilogue.cuh"
#include "gemm/simt_policy.h"
#include "gemm/simt_tile_loader.cuh"
#include "gemm/sm80_mainloop.cuh"
#include "gemm/tile_scheduler.cuh"

namespace jaxgemm {

// The GEMM's 128 x 128 tile, and a 128 x 64 one (8 warps as 4 x 2 of 32 x 32) for convs
// with 64 or fewer output channels per group, common in CNNs, which would leave half of the
// wide tile idle; it is small enough for two blocks per SM.
struct Sm80ConvPolicy128x64 {
  static constexpr int kBM = 128, kBN = 64, kBK = 32, kStages = 4;
  static constexpr int kWarpsM = 4, kWarpsN = 2, kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kWarpM = kBM / kWarpsM, kWarpN = kBN / kWarpsN;  // 32 x 32
  static constexpr int kMmaM = kWarpM / 16, kMmaN = kWarpN / 8;         // 2 x 4
};

template <class P>
constexpr int kSm80ConvBlocksPerSm = P::kBN == 128 ? 1 : 2;

template <class TIn, class TOut, ConvKind kKind, class P>
__global__ void __launch_bounds__(P::kThreads, kSm80ConvBlocksPerSm<P>)
    Sm80ConvKernel(const __grid_constant__ ConvGemm g, bool vector_store) {
  constexpr bool kWgrad = kKind == ConvKind::kWgrad;
  using Mainloop = Sm80Mainloop<TIn, /*kTransA=*/kWgrad, /*kTransB=*/false, P>;
  static_assert(P::kThreads == 256, "the loaders' thread maps assume 256 threads");
  extern __shared__ __align__(128) unsigned char smem_bytes[];
  auto& smem = *reinterpret_cast<typename Mainloop::SharedStorage*>(smem_bytes);

  int64_t tile_m, tile_n;
  GroupedRaster{(g.m + P::kBM - 1) / P::kBM, (g.n + P::kBN - 1) / P::kBN}.Tile(blockIdx.x, &tile_m, &tile_n);
  const int64_t m0 = tile_m * P::kBM, n0 = tile_n * P::kBN;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_m = warp % P::kWarpsM, warp_n = warp / P::kWarpsM;

  // One (group, split) slab per blockIdx.y (the host keeps groups * split <= 65535).
  const int group = static_cast<int>(blockIdx.y / g.split), part = static_cast<int>(blockIdx.y % g.split);
  int64_t k_begin, k_size;
  ConvChunk(g, part, &k_begin, &k_size);
  const TIn* b = static_cast<const TIn*>(g.b) + group * g.n + n0 + k_begin * g.ldb;
  typename Mainloop::LoaderB load_b(b, g.ldb, g.n - n0, k_size);
  typename Mainloop::Accumulators acc;
#pragma unroll
  for (int mi = 0; mi < P::kMmaM; ++mi)
#pragma unroll
    for (int ni = 0; ni < P::kMmaN; ++ni)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[mi][ni][r] = 0.f;
  if constexpr (kWgrad) {
    Sm80WgradLoader<TIn, typename Mainloop::TileA> load_a(g, group, m0, k_begin, k_size);
    Mainloop::Run(load_a, load_b, k_size, smem, acc);
  } else {
    Sm80Im2colLoader<TIn, typename Mainloop::TileA> load_a(g, group, m0);
    Mainloop::Run(load_a, load_b, k_size, smem, acc);
  }

  // mma accumulator layout: d[0..1] at (row lane / 4, cols 2 (lane % 4) + 0, 1), d[2..3] 8 rows below.
  const typename GemmEpilogue<TOut>::Offsets off = ConvOutOffsets<TOut>(g, group, part);
#pragma unroll
  for (int mi = 0; mi < P::kMmaM; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t row = m0 + warp_m * P::kWarpM + mi * 16 + lane / 4 + half * 8;
      if (row >= g.m) continue;
      const int64_t out_row = g.template OutRow<kKind == ConvKind::kDgrad>(row);
#pragma unroll
      for (int ni = 0; ni < P::kMmaN; ++ni) {
        const int64_t col = n0 + warp_n * P::kWarpN + ni * 8 + lane % 4 * 2;
        if (col >= g.n) continue;
        const float v[2] = {acc[mi][ni][half * 2], acc[mi][ni][half * 2 + 1]};
        GemmEpilogue<TOut>::template Store<2>(g.out, off, out_row, col, v, vector_store);
      }
    }
  }
}

// The GEMM's SIMT tiles and occupancy (a 128-register cap); the loaders read the geometry
// from the __grid_constant__ parameter instead of holding copies.
template <class TIn, class TOut, ConvKind kKind, bool kVec, class Policy>
__global__ void __launch_bounds__(Policy::kThreads, Policy::kMinBlocksPerSm)
    SimtConvKernel(const __grid_constant__ ConvGemm g, bool vector_store) {
  using Mainloop = SimtConvMainloop<Policy>;
  constexpr int kBM = Policy::kBM, kBN = Policy::kBN, kBK = Policy::kBK, kThreads = Policy::kThreads;
  extern __shared__ __align__(128) unsigned char smem_bytes[];
  auto& smem = *reinterpret_cast<typename Mainloop::SharedStorage*>(smem_bytes);

  int64_t tile_m, tile_n;
  GroupedRaster{(g.m + kBM - 1) / kBM, (g.n + kBN - 1) / kBN}.Tile(blockIdx.x, &tile_m, &tile_n);
  const int64_t m0 = tile_m * kBM, n0 = tile_n * kBN;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int ty = warp / Policy::kWarpsN * Policy::kWarpThreadsM + lane / Policy::kWarpThreadsN;
  const int tx = warp % Policy::kWarpsN * Policy::kWarpThreadsN + lane % Policy::kWarpThreadsN;

  // One (group, split) slab per blockIdx.y (the host keeps groups * split <= 65535).
  const int group = static_cast<int>(blockIdx.y / g.split), part = static_cast<int>(blockIdx.y % g.split);
  int64_t k_begin, k_size;
  ConvChunk(g, part, &k_begin, &k_size);
  const TIn* b = static_cast<const TIn*>(g.b) + group * g.n + n0 + k_begin * g.ldb;
  SimtTileLoader<TIn, kBN, kBK, kThreads, /*kKContiguous=*/false, kVec> load_b(b, g.ldb, g.n - n0, k_size);
  float acc[8][8];
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[i][j] = 0.f;
  if constexpr (kKind == ConvKind::kWgrad) {
    SimtWgradLoader<TIn, kBM, kBK, kThreads, kVec> load_a(g, group, m0, k_begin, k_size);
    Mainloop::Run(load_a, load_b, k_size, smem, acc, ty, tx);
  } else {
    SimtIm2colLoader<TIn, kBM, kBK, kThreads, kVec> load_a(g, group, m0);
    Mainloop::Run(load_a, load_b, k_size, smem, acc, ty, tx);
  }

  const typename GemmEpilogue<TOut>::Offsets off = ConvOutOffsets<TOut>(g, group, part);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int64_t row = m0 + i / 4 * (kBM / 2) + ty * 4 + i % 4;
    if (row >= g.m) continue;
    const int64_t out_row = g.template OutRow<kKind == ConvKind::kDgrad>(row);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t col = n0 + h * (kBN / 2) + tx * 4;
      if (col >= g.n) continue;
      const float v[4] = {acc[i][h * 4], acc[i][h * 4 + 1], acc[i][h * 4 + 2], acc[i][h * 4 + 3]};
      GemmEpilogue<TOut>::template Store<4>(g.out, off, out_row, col, v, vector_store);
    }
  }
}

inline dim3 ConvGrid(const ConvGemm& g, int bm, int bn) {
  const int64_t tiles = ((g.m + bm - 1) / bm) * ((g.n + bn - 1) / bn);
  return dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(g.groups * g.split));
}

template <class TIn, class TOut, ConvKind kKind, class P>
cudaError_t LaunchSm80ConvTile(const ConvGemm& g, cudaStream_t stream) {
  constexpr bool kWgrad = kKind == ConvKind::kWgrad;
  if (((g.m + P::kBM - 1) / P::kBM) * ((g.n + P::kBN - 1) / P::kBN) > INT32_MAX) return cudaErrorInvalidConfiguration;
  if (g.groups * g.split > 65535) return cudaErrorInvalidConfiguration;
  auto* kernel = Sm80ConvKernel<TIn, TOut, kKind, P>;
  constexpr int kSmemBytes = sizeof(typename Sm80Mainloop<TIn, kWgrad, false, P>::SharedStorage);
  cudaError_t status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (status != cudaSuccess) return status;
  kernel<<<ConvGrid(g, P::kBM, P::kBN), P::kThreads, kSmemBytes, stream>>>(g, ConvVectorStore<TOut, 2>(g));
  return cudaGetLastError();
}

template <class TIn, class TOut, ConvKind kKind>
cudaError_t LaunchSm80Conv(const ConvGemm& g, cudaStream_t stream) {
  if (g.n <= Sm80ConvPolicy128x64::kBN) return LaunchSm80ConvTile<TIn, TOut, kKind, Sm80ConvPolicy128x64>(g, stream);
  return LaunchSm80ConvTile<TIn, TOut, kKind, Sm80Policy>(g, stream);
}

template <class TIn, class TOut, ConvKind kKind, class Policy>
cudaError_t LaunchSimtConvTile(const ConvGemm& g, cudaStream_t stream) {
  if (((g.m + Policy::kBM - 1) / Policy::kBM) * ((g.n + Policy::kBN - 1) / Policy::kBN) > INT32_MAX) {
    return cudaErrorInvalidConfiguration;
  }
  if (g.groups * g.split > 65535) return cudaErrorInvalidConfiguration;
  // 4-element vectors: float32 only (16-bit inputs reach SIMT only with odd channel
  // counts), channels per group and pitches multiples of 4, 16-byte aligned bases.
  const bool vec = std::is_same_v<TIn, float> && g.a_cg % 4 == 0 && g.a_pitch % 4 == 0 && g.n % 4 == 0 &&
                   g.ldb % 4 == 0 && IsAligned(g.a, 16) && IsAligned(g.b, 16);
  constexpr int kSmemBytes = sizeof(typename SimtConvMainloop<Policy>::SharedStorage);
  static_assert(kSmemBytes <= 48 * 1024, "static shared-memory limit");
  const dim3 grid = ConvGrid(g, Policy::kBM, Policy::kBN);
  const bool vector_store = ConvVectorStore<TOut, 4>(g);
  if constexpr (std::is_same_v<TIn, float>) {
    if (vec) {
      SimtConvKernel<TIn, TOut, kKind, true, Policy><<<grid, Policy::kThreads, kSmemBytes, stream>>>(g, vector_store);
      return cudaGetLastError();
    }
  }
  SimtConvKernel<TIn, TOut, kKind, false, Policy><<<grid, Policy::kThreads, kSmemBytes, stream>>>(g, vector_store);
  return cudaGetLastError();
}

// 128 x 64 tiles when a group has at most 64 output columns (half of a 128-wide tile would
// idle); 16-bit inputs (rare here) take the 128 x 128 tile only, to keep the build small.
template <class TIn, class TOut, ConvKind kKind>
cudaError_t LaunchSimtConv(const ConvGemm& g, cudaStream_t stream) {
  if constexpr (std::is_same_v<TIn, float>) {
    if (g.n <= SimtPolicy128x64::kBN) return LaunchSimtConvTile<TIn, TOut, kKind, SimtPolicy128x64>(g, stream);
  }
  return LaunchSimtConvTile<TIn, TOut, kKind, SimtPolicy128x128>(g, stream);
}

}  // namespace jaxgemm
