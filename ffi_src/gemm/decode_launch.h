// Host-side entry to the decode kernel (gemm/decode_kernel.cuh): products of at most 16
// rows of 16-bit inputs (a language model's decoding step: a few tokens against a weight
// matrix), which only stream B. Instantiated in gemm/instances/decode_*.cu. Runs only when
// asked for (GemmConfig.kernel = "decode"): so far slower than the sm90 few-row schedules.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "gemm/problem.h"

namespace jaxgemm {

// Rows one decode block multiplies (one m16 mma tile): the kernel takes M <= this.
constexpr int64_t kDecodeMaxRows = 16;
// Warps per block, as kDecodeWarpsN column strips of 32 by kDecodeWarpsK slices of K.
constexpr int kDecodeWarpsN = 4;
constexpr int kDecodeWarpsK = 2;
constexpr int kDecodeThreads = 32 * kDecodeWarpsN * kDecodeWarpsK;
constexpr int64_t kDecodeBlockN = 32 * kDecodeWarpsN;
constexpr int64_t kDecodeChunkK = 32;  // K per stage of a warp's ring
constexpr int kDecodeStages = 4;       // a warp's ring: 3 chunks in flight while one is multiplied
// Blocks of the kernel resident on one SM (its launch bounds).
constexpr int kDecodeBlocksPerSm = 2;
// Most blocks sharing one column strip's K in a cluster (the portable cluster size).
constexpr int kDecodeMaxCluster = 8;

// Whether the decode kernel takes the problem: 16-bit inputs, at most 16 rows, A stored
// (m, k), 16-byte row starts (cp.async).
inline bool DecodeSupports(const GemmProblem& p) {
  return p.in_type != ElementType::kF32 && p.m <= kDecodeMaxRows && !p.trans_a && p.lda % 8 == 0 &&
         p.ldb % 8 == 0 && reinterpret_cast<uintptr_t>(p.a) % 16 == 0 && reinterpret_cast<uintptr_t>(p.b) % 16 == 0 &&
         p.k < INT32_MAX - 64;
}

// How a launch covers the problem: the grid's column strips times `cluster` blocks that
// split each strip's K and add their partial sums through distributed shared memory.
struct DecodePlan {
  int64_t column_blocks = 0;
  int cluster = 1;
};

// The largest cluster (1, 2, 4 or 8) that keeps every block of the grid resident at once,
// and gives each warp at least two chunks of K.
inline DecodePlan PlanDecode(const GemmProblem& p, int sm_count) {
  DecodePlan plan;
  plan.column_blocks = (p.n + kDecodeBlockN - 1) / kDecodeBlockN;
  const int64_t blocks = plan.column_blocks * p.batch.count * p.split_k;
  const int64_t k = p.split_k > 1 ? p.KChunk() : p.k;
  const int64_t chunks = (k + kDecodeChunkK - 1) / kDecodeChunkK;
  while (plan.cluster < kDecodeMaxCluster && blocks * plan.cluster * 2 <= int64_t{kDecodeBlocksPerSm} * sm_count &&
         chunks >= int64_t{4} * plan.cluster * kDecodeWarpsK) {
    plan.cluster *= 2;
  }
  return plan;
}

template <class TIn, class TOut>
cudaError_t LaunchDecodeGemm(const GemmProblem& p, int sm_count, cudaStream_t stream);

}  // namespace jaxgemm
