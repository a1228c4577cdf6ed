// The decode GEMM kernel: D = epilogue(alpha * op(A) op(B)) for at most 16 rows of 16-bit
// inputs. Such a product only streams B (16 multiply-adds per loaded element), so the kernel
// is built for bytes in flight and a short start, not for reuse:
//   - every warp streams its own column strip of 32 over its own slice of K through a
//     private ring of kDecodeStages shared-memory stages, filled by 16-byte cp.async (no
//     registers held by loads in flight, no block-wide barriers in the loop; edges zero-filled
//     by the copies' source size), read by ldmatrix (.trans for B stored (k, n)) into
//     mma.sync m16n8k16;
//   - a block is kDecodeWarpsN strips by kDecodeWarpsK slices of K, and a cluster of up to 8
//     blocks shares the strips' K; the partial sums meet in shared memory (the cluster's
//     blocks read each other's through distributed shared memory) and are added in a fixed
//     order: deterministic, in one kernel, with no workspace. Each block of the cluster then
//     applies the epilogue to a slice of the tile.
// A is read K-major only ((m, k) rows), and both operands with 16-byte aligned rows
// (DecodeSupports). Runs only when asked for: it is slower than the sm90 kernel's few-row
// schedules (16 x 4096^2: 19.6 us against 11.1; per-warp 16-byte copies stream B at a
// fraction of TMA's rate, and few blocks apply the epilogue; docs/kernels.md, section 5.7).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <type_traits>

#include "common/ptx.cuh"
#include "common/ptx_sm90.cuh"
#include "gemm/decode_launch.h"
#include "gemm/epilogue.cuh"

namespace jaxgemm {
namespace decode {

// One stage of a warp's ring: B's 32 x 32 chunk (32 rows of 64 bytes: n rows of k when B is
// K-major, k rows of n otherwise) and A's 16 rows of 32 k.
constexpr int kRowBytes = 64;
constexpr int kBStageBytes = 32 * kRowBytes;
constexpr int kAStageBytes = 16 * kRowBytes;
constexpr int kStageBytes = kBStageBytes + kAStageBytes;
constexpr int kWarpRingBytes = kDecodeStages * kStageBytes;

// Byte offset of 16-byte chunk `c` (0..3) of row `r` in a 64-byte-row tile: eight
// consecutive rows read at one chunk column land on eight distinct bank groups.
__device__ __forceinline__ int SwizzledOffset(int r, int c) { return r * kRowBytes + ((c ^ ((r >> 1) & 3)) << 4); }

#if defined(JG_SM90_ENABLED)

__device__ __forceinline__ int ClampBytes(int64_t elements_left) {
  return elements_left <= 0 ? 0 : (elements_left >= 8 ? 16 : static_cast<int>(2 * elements_left));
}

// Reads a float2 at the same shared-memory offset in cluster block `rank`.
__device__ __forceinline__ float2 LoadClusterFloat2(const float* local, uint32_t rank) {
  float2 v;
  asm volatile(
      "{\n"
      ".reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %2, %3;\n"
      "ld.shared::cluster.v2.f32 {%0, %1}, [remote];\n"
      "}\n"
      : "=f"(v.x), "=f"(v.y)
      : "r"(SharedAddress(local)), "r"(rank)
      : "memory");
  return v;
}

// One warp's copies of a chunk: 4 of B's 128 16-byte pieces and 2 of A's 64 per lane, lane
// l taking pieces l + 32 i (row p / 4, chunk p % 4: a row's four pieces from neighbouring
// lanes, one 64-byte run).
template <class TIn, bool kTransB>
struct ChunkCopier {
  const TIn* a;  // A at (row 0, k 0)
  const TIn* b;  // K-major: B at (column n_w, k 0); N-major: B at (k 0, column n_w)
  int64_t lda, ldb, m, k_size, n_left;  // n_left: columns from n_w on
  int lane;

  __device__ __forceinline__ void Issue(uint32_t stage, int64_t k) const {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int p = lane + 32 * i, row = p / 4, c = p % 4;
      const TIn* src;
      int bytes;
      if constexpr (kTransB) {  // row: column n_w + row; chunk c: k + 8 c ..
        src = b + row * ldb + k + 8 * c;
        bytes = row < n_left ? ClampBytes(k_size - k - 8 * c) : 0;
      } else {  // row: k + row; chunk c: columns n_w + 8 c ..
        src = b + (k + row) * ldb + 8 * c;
        bytes = k + row < k_size ? ClampBytes(n_left - 8 * c) : 0;
      }
      CpAsync16(stage + SwizzledOffset(row, c), bytes ? src : a, bytes);  // (0 bytes: nothing read)
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int p = lane + 32 * i, row = p / 4, c = p % 4;
      const int bytes = row < m ? ClampBytes(k_size - k - 8 * c) : 0;
      CpAsync16(stage + kBStageBytes + SwizzledOffset(row, c), bytes ? a + row * lda + k + 8 * c : a, bytes);
    }
  }
};

// The chunk's 2 k16 steps x 4 n8 tiles of mma, fragments by ldmatrix.
template <bool kBf16, bool kTransB>
__device__ __forceinline__ void MultiplyChunk(uint32_t stage, int lane, float (&acc)[4][4]) {
  const int r8 = lane % 8, quad = lane / 8;
#pragma unroll
  for (int step = 0; step < 2; ++step) {
    // A: matrices (rows 0-7 | 8-15) x (k 16 step + 0-7 | 8-15), in a0..a3 order.
    uint32_t a[4];
    LdMatrixX4(a, stage + kBStageBytes + SwizzledOffset(r8 + 8 * (quad % 2), 2 * step + quad / 2));
#pragma unroll
    for (int pair = 0; pair < 2; ++pair) {
      uint32_t b[4];  // b0, b1 of n8 tile 2 pair, then of tile 2 pair + 1
      if constexpr (kTransB) {
        // Rows are columns: tile j's rows 8 j .. 8 j + 7, k chunks 2 step and 2 step + 1.
        const int j = 2 * pair + quad / 2;
        LdMatrixX4(b, stage + SwizzledOffset(8 * j + r8, 2 * step + quad % 2));
      } else {
        // Rows are k: rows 16 step + 8 (quad % 2) + r8, the column chunk of tile j, transposed.
        const int j = 2 * pair + quad / 2;
        LdMatrixX4Trans(b, stage + SwizzledOffset(16 * step + 8 * (quad % 2) + r8, j));
      }
      MmaM16N8K16<kBf16>(acc[2 * pair], a, b[0], b[1]);
      MmaM16N8K16<kBf16>(acc[2 * pair + 1], a, b[2], b[3]);
    }
  }
}

// The sum of element pair (row, col) of the tile over the warps' K slices of every block of
// the cluster (in that order): all loads first, one round trip.
template <int kBN>
__device__ __forceinline__ float2 SumPartials(const float (&partial)[kDecodeWarpsK][kDecodeMaxRows][kBN], int row,
                                              int col, int cluster) {
  float2 x[kDecodeMaxCluster][kDecodeWarpsK];
#pragma unroll
  for (int r = 0; r < kDecodeMaxCluster; ++r) {
#pragma unroll
    for (int w = 0; w < kDecodeWarpsK; ++w) {
      if (r < cluster) {
        x[r][w] = cluster > 1 ? LoadClusterFloat2(&partial[w][row][col], r)
                              : *reinterpret_cast<const float2*>(&partial[w][row][col]);
      }
    }
  }
  float2 v = make_float2(0.f, 0.f);
#pragma unroll
  for (int r = 0; r < kDecodeMaxCluster; ++r) {
#pragma unroll
    for (int w = 0; w < kDecodeWarpsK; ++w) {
      if (r < cluster) {
        v.x += x[r][w].x;
        v.y += x[r][w].y;
      }
    }
  }
  return v;
}

#endif  // JG_SM90_ENABLED

}  // namespace decode

template <class TIn, class TOut, bool kTransB>
__global__ void __launch_bounds__(kDecodeThreads, kDecodeBlocksPerSm)
    DecodeGemmKernel(const GemmProblem p, int cluster) {
#if defined(JG_SM90_ENABLED)
  using namespace decode;
  constexpr int kBN = static_cast<int>(kDecodeBlockN);
  extern __shared__ __align__(128) unsigned char smem[];
  // After the loop the rings hold the warps' partial sums instead.
  auto& partial = *reinterpret_cast<float(*)[kDecodeWarpsK][kDecodeMaxRows][kBN]>(smem);
  static_assert(sizeof(float) * kDecodeWarpsK * kDecodeMaxRows * kBN <= kDecodeThreads / 32 * kWarpRingBytes);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_n = warp % kDecodeWarpsN, warp_k = warp / kDecodeWarpsN;
  const int g = lane / 4, t = lane % 4;
  const uint32_t rank = cluster > 1 ? ClusterRank() : 0;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x / cluster) * kBN;
  const int64_t n_w = n0 + 32 * warp_n;
  const uint32_t ring = SharedAddress(smem) + warp * kWarpRingBytes;
  const bool vector_store =
      p.ldd % 2 == 0 && IsAligned(p.d, 2 * sizeof(TOut)) && IsAligned(p.epilogue.aux, 2 * sizeof(TOut));
  // The block's threads, and with a cluster every block's (shared memory ordered across it).
  auto sync_blocks = [cluster] {
    if (cluster > 1) {
      ClusterSync();
    } else {
      __syncthreads();
    }
  };

  const int64_t slabs = p.batch.count * p.split_k;
  for (int64_t z = blockIdx.y; z < slabs; z += gridDim.y) {
    const int64_t split = z % p.split_k, batch = z / p.split_k;
    const TIn* a = static_cast<const TIn*>(p.a) + p.batch.Offset(batch, kOperandA) + p.ChunkOffsetA(split);
    const TIn* b = static_cast<const TIn*>(p.b) + p.batch.Offset(batch, kOperandB) + p.ChunkOffsetB(split);
    ChunkCopier<TIn, kTransB> copier;
    copier.a = a;
    copier.b = b + (kTransB ? n_w * p.ldb : n_w);
    copier.lda = p.lda;
    copier.ldb = p.ldb;
    copier.m = p.m;
    copier.k_size = p.split_k > 1 ? p.ChunkK(split) : p.k;
    copier.n_left = p.n - n_w;
    copier.lane = lane;

    // This warp's share of the slab's chunks: part rank * kDecodeWarpsK + warp_k of the
    // cluster's cluster * kDecodeWarpsK.
    const int64_t chunks = (copier.k_size + kDecodeChunkK - 1) / kDecodeChunkK;
    const int64_t parts = int64_t{cluster} * kDecodeWarpsK, part = int64_t{rank} * kDecodeWarpsK + warp_k;
    const int64_t c_begin = chunks * part / parts, c_end = chunks * (part + 1) / parts;

    float acc[4][4] = {};
    // The ring: kDecodeStages - 1 chunks in flight while one is multiplied. A group is
    // committed every round (empty past the end), so wait_group's count stays exact.
#pragma unroll
    for (int s = 0; s < kDecodeStages - 1; ++s) {
      if (c_begin + s < c_end) copier.Issue(ring + s * kStageBytes, (c_begin + s) * kDecodeChunkK);
      CpAsyncCommitGroup();
    }
    int slot = 0;
    for (int64_t c = c_begin; c < c_end; ++c) {
      CpAsyncWaitGroup<kDecodeStages - 2>();
      __syncwarp();  // every lane's copies of chunk c landed; every lane is done with chunk c - 1
      const int refill = slot == 0 ? kDecodeStages - 1 : slot - 1;
      if (c + kDecodeStages - 1 < c_end) copier.Issue(ring + refill * kStageBytes, (c + kDecodeStages - 1) * kDecodeChunkK);
      CpAsyncCommitGroup();
      MultiplyChunk<std::is_same_v<TIn, __nv_bfloat16>, kTransB>(ring + slot * kStageBytes, lane, acc);
      slot = slot == kDecodeStages - 1 ? 0 : slot + 1;
    }
    CpAsyncWaitGroup<0>();
    __syncthreads();  // the rings become `partial`

    // mma tile j's accumulator columns 2 t, 2 t + 1 are strip columns 8 j + 2 t (+1).
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int col = 32 * warp_n + 8 * j + 2 * t;
      *reinterpret_cast<float2*>(&partial[warp_k][g][col]) = make_float2(acc[j][0], acc[j][1]);
      *reinterpret_cast<float2*>(&partial[warp_k][g + 8][col]) = make_float2(acc[j][2], acc[j][3]);
    }
    sync_blocks();

    // Block `rank` finishes its slice of the tile's column pairs: the sum over the cluster's
    // blocks and each block's K slices, in that order, then the epilogue.
    typename GemmEpilogue<TOut>::Offsets off = GemmEpilogue<TOut>::ForBatch(p, batch);
    off.out = z * p.m * p.n;
    constexpr int kPairs = kDecodeMaxRows * kBN / 2;
    const int per_block = kPairs / cluster;
    for (int e = rank * per_block + threadIdx.x; e < static_cast<int>(rank + 1) * per_block; e += kDecodeThreads) {
      const int row = e / (kBN / 2), col = 2 * (e % (kBN / 2));
      if (row >= p.m || n0 + col >= p.n) continue;
      const float2 sum = SumPartials<kBN>(partial, row, col, cluster);
      float v[2] = {sum.x, sum.y};
      GemmEpilogue<TOut>::template Store<2>(p, off, row, n0 + col, v, vector_store);
    }
    sync_blocks();  // no block may leave (or refill its ring) while another reads its sums
  }
#endif  // JG_SM90_ENABLED
}

template <class TIn, class TOut>
cudaError_t LaunchDecodeGemm(const GemmProblem& p, int sm_count, cudaStream_t stream) {
  constexpr int kSmemBytes = kDecodeThreads / 32 * decode::kWarpRingBytes;
  auto* kernel = p.trans_b ? DecodeGemmKernel<TIn, TOut, true> : DecodeGemmKernel<TIn, TOut, false>;
  cudaError_t status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (status != cudaSuccess) return status;
  cudaLaunchConfig_t config = {};
  config.blockDim = dim3(kDecodeThreads);
  config.dynamicSmemBytes = kSmemBytes;
  config.stream = stream;
  cudaLaunchAttribute cluster[1];
  cluster[0].id = cudaLaunchAttributeClusterDimension;
  cluster[0].val.clusterDim.y = 1;
  cluster[0].val.clusterDim.z = 1;
  config.attrs = cluster;
  config.numAttrs = 1;

  // The plan's cluster, halved while the GPU cannot hold the grid's clusters at once (a
  // cluster must fit in one GPC: fewer 8-block clusters than SMs / 4 fit).
  DecodePlan plan = PlanDecode(p, sm_count);
  // JAXGEMM_DECODE_CLUSTER=c (1, 2, 4, 8): at most c blocks per cluster (a measurement override).
  if (const char* env = std::getenv("JAXGEMM_DECODE_CLUSTER")) {
    const int most = std::atoi(env);
    while (most >= 1 && plan.cluster > most) plan.cluster /= 2;
  }
  static std::atomic<int> resident_clusters[kDecodeMaxCluster + 1] = {};
  const int64_t slabs = std::min<int64_t>(p.batch.count * p.split_k, 65535);
  while (plan.cluster > 1) {
    int resident = resident_clusters[plan.cluster].load(std::memory_order_relaxed);
    if (resident == 0) {
      cluster[0].val.clusterDim.x = plan.cluster;
      config.gridDim = dim3(static_cast<unsigned>(plan.cluster * 64), 1);
      if (cudaOccupancyMaxActiveClusters(&resident, kernel, &config) != cudaSuccess || resident <= 0) {
        (void)cudaGetLastError();
        resident = 1 << 30;  // unknown: trust the plan
      }
      resident_clusters[plan.cluster].store(resident, std::memory_order_relaxed);
    }
    if (plan.column_blocks * slabs <= resident) break;
    plan.cluster /= 2;
  }
  const int64_t blocks = plan.column_blocks * plan.cluster;
  if (blocks > INT32_MAX) return cudaErrorInvalidConfiguration;
  cluster[0].val.clusterDim.x = plan.cluster;
  config.numAttrs = plan.cluster > 1 ? 1 : 0;  // (a cluster launch of single blocks starts slower)
  config.gridDim = dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(slabs));
  status = cudaLaunchKernelEx(&config, kernel, p, plan.cluster);
  return status != cudaSuccess ? status : cudaGetLastError();
}

}  // namespace jaxgemm
