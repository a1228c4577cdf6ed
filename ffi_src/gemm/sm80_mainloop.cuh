// sm80 tensor-core mainloop (Ampere-style, runs on any sm_80+ GPU): a ring of kStages
// shared-memory k-tiles filled by 16-byte cp.async, ldmatrix into mma.sync m16n8k16
// fragments, fp32 accumulators. 8 warps as 2 (M) x 4 (N), each owning a 64 x 32 tile =
// 4 x 4 mma tiles.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "common/ptx.cuh"
#include "gemm/sm80_tile.cuh"

namespace jaxgemm {

struct Sm80Policy {
  static constexpr int kBM = 128, kBN = 128, kBK = 32, kStages = 4;
  static constexpr int kWarpsM = 2, kWarpsN = 4, kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kWarpM = kBM / kWarpsM, kWarpN = kBN / kWarpsN;  // 64 x 32
  static constexpr int kMmaM = kWarpM / 16, kMmaN = kWarpN / 8;         // 4 x 4
};

// Policy: any Sm80Policy-shaped tile (the conv also uses a 128 x 64 one for narrow N).
template <class T, bool kTransA, bool kTransB, class Policy = Sm80Policy>
struct Sm80Mainloop {
  using P = Policy;
  using TileA = Sm80Tile<T, P::kBM, P::kBK, P::kThreads, !kTransA>;
  using TileB = Sm80Tile<T, P::kBN, P::kBK, P::kThreads, kTransB>;
  using LoaderA = typename TileA::Loader;
  using LoaderB = typename TileB::Loader;
  static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>,
                "the sm80 mainloop's MMAs are float16's and bfloat16's: a new 16-bit type needs its own");
  static constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;

  struct SharedStorage {
    alignas(128) T a[P::kStages][TileA::kElems];
    alignas(128) T b[P::kStages][TileB::kElems];
  };

  using Accumulators = float[P::kMmaM][P::kMmaN][4];

  // A fragments of the warp's 4 m16 tiles at k-offset kk (see ldmatrix's lane addressing).
  __device__ __forceinline__ static void LoadA(const T* sa, int warp_m, int kk, int lane, uint32_t (&fa)[P::kMmaM][4]) {
#pragma unroll
    for (int mi = 0; mi < P::kMmaM; ++mi) {
      const int m = warp_m * P::kWarpM + mi * 16;
      if (!kTransA) {  // [m][k]: matrices (m 0-7 | 8-15) x (k 0-7 | 8-15), k-halves last
        LdMatrixX4(fa[mi], sa + TileA::OffsetOf(m + lane % 8 + (lane / 8) % 2 * 8, kk + lane / 16 * 8));
      } else {  // [k][m], transposed on load
        LdMatrixX4Trans(fa[mi], sa + TileA::OffsetOf(m + (lane / 8) % 2 * 8, kk + lane % 8 + lane / 16 * 8));
      }
    }
  }

  // B fragments: fb[j][0..1] for n8 tile 2j, fb[j][2..3] for n8 tile 2j+1.
  __device__ __forceinline__ static void LoadB(const T* sb, int warp_n, int kk, int lane,
                                               uint32_t (&fb)[P::kMmaN / 2][4]) {
#pragma unroll
    for (int j = 0; j < P::kMmaN / 2; ++j) {
      const int n = warp_n * P::kWarpN + j * 16;
      if (kTransB) {  // [n][k]
        LdMatrixX4(fb[j], sb + TileB::OffsetOf(n + lane % 8 + lane / 16 * 8, kk + (lane / 8) % 2 * 8));
      } else {  // [k][n], transposed on load
        LdMatrixX4Trans(fb[j], sb + TileB::OffsetOf(n + lane / 16 * 8, kk + lane % 8 + (lane / 8) % 2 * 8));
      }
    }
  }

  // Any loaders with IssueNext(T* stage) that fill a stage in TileA / TileB's layout
  // (LoaderA, LoaderB here; the implicit-GEMM conv brings its own im2col loaders).
  template <class ALoader, class BLoader>
  __device__ __forceinline__ static void Run(ALoader& load_a, BLoader& load_b, int64_t k_size, SharedStorage& smem,
                                             Accumulators& acc) {
    const int k_tiles = static_cast<int>((k_size + P::kBK - 1) / P::kBK);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int warp_m = warp % P::kWarpsM, warp_n = warp / P::kWarpsM;

    // Prologue: tiles 0 .. kStages-2 in flight, one commit group each.
#pragma unroll
    for (int s = 0; s < P::kStages - 1; ++s) {
      if (s < k_tiles) {
        load_a.IssueNext(smem.a[s]);
        load_b.IssueNext(smem.b[s]);
      }
      CpAsyncCommitGroup();
    }
    // Steady state: wait for tile t, then (after the barrier, when nobody reads tile t-1's
    // stage any more) start tile t + kStages - 1 into it, then multiply tile t.
    for (int t = 0; t < k_tiles; ++t) {
      CpAsyncWaitGroup<P::kStages - 2>();
      __syncthreads();
      const int next = t + P::kStages - 1;
      if (next < k_tiles) {
        load_a.IssueNext(smem.a[next % P::kStages]);
        load_b.IssueNext(smem.b[next % P::kStages]);
      }
      CpAsyncCommitGroup();
      const T* sa = smem.a[t % P::kStages];
      const T* sb = smem.b[t % P::kStages];
#pragma unroll
      for (int kk = 0; kk < P::kBK; kk += 16) {
        uint32_t fa[P::kMmaM][4], fb[P::kMmaN / 2][4];
        LoadA(sa, warp_m, kk, lane, fa);
        LoadB(sb, warp_n, kk, lane, fb);
#pragma unroll
        for (int mi = 0; mi < P::kMmaM; ++mi) {
#pragma unroll
          for (int ni = 0; ni < P::kMmaN; ++ni) {
            MmaM16N8K16<kBf16>(acc[mi][ni], fa[mi], fb[ni / 2][ni % 2 * 2], fb[ni / 2][ni % 2 * 2 + 1]);
          }
        }
      }
    }
    CpAsyncWaitGroup<0>();
    __syncthreads();  // shared memory is reused by the next batch index
  }
};

}  // namespace jaxgemm
