// The mainloop's pieces: the producer's ring of shared-memory stages (Sm90ProducerRing),
// the GEMM's TMA loads of A and B into it (Sm90MatrixLoads; convolutions bring their own
// loads type), the wgmma calls the consumers issue on a stage, and tf32's A read from
// registers (Sm90RegisterAFragments). The k-loop itself is the consumers' (kernel.cuh).
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/ptx_sm90.cuh"
#include "gemm/problem.h"
#include "gemm/sm90/scheduler.cuh"
#include "gemm/sm90/tensor_map.h"
#include "gemm/sm90/timeline.cuh"
#include "gemm/sm90/wgmma.cuh"

namespace jaxgemm {

#if defined(JG_SM90_ENABLED)
// The producer's walk around the ring (every Loads type's Produce): Acquire waits until the
// consumers have freed the current stage and arms its full barrier for one stage of TMA
// bytes; Advance moves to the next stage (the parity flips once per pass).
template <class P>
struct Sm90ProducerRing {
  uint64_t* full;
  uint64_t* empty;
  int stage = 0;
  uint32_t phase = 0;

  __device__ __forceinline__ Sm90ProducerRing(uint64_t* full_barriers, uint64_t* empty_barriers)
      : full(full_barriers), empty(empty_barriers) {}

  // Returns the stage's full barrier, which the stage's TMA loads complete. `bytes`: what
  // they will write (less than a stage when part of the A tile is not loaded).
  __device__ __forceinline__ uint64_t* Acquire(uint32_t bytes = P::kStageBytes) {
    MbarrierWait(&empty[stage], phase ^ 1);
    MbarrierArriveExpectTx(&full[stage], bytes);
    return &full[stage];
  }

  __device__ __forceinline__ void Advance() {
    if (++stage == P::kStages) {
      stage = 0;
      phase ^= 1;
    }
  }
};
#endif

// Whether each operand's tensor map has a batch dim (3-D) or is shared by all batches.
struct Sm90Batching {
  bool a, b;
};

// The GEMM's operand loads: one thread issues every TMA load of the ring, from tensor maps
// over the stored matrices. Other operand sources (e.g. convolution's im2col gathers)
// provide a type with the same Prefetch / Produce members to Sm90GemmKernel.
struct Sm90MatrixLoads {
  CUtensorMap a, b;
  Sm90Batching batched;
  // Rows of A's box when A is K-major: the tile's kBM, or fewer when all of A has fewer
  // rows. Fewer rows are then read and zero-filled: a box mostly out of bounds measured
  // 1.7x slower at M = 16 (128 x 64 tiles, split 2: 64 vs 38.5 us). The stage rows left
  // unwritten hold stale values; their products land in rows >= M, which are never stored.
  int a_rows;
  // Loads types with kMapsRows also say where each GEMM row goes in D (MapsRows(),
  // OutputRow(row)), for operands whose GEMM rows are not D's rows (conv dgrad phases).
  static constexpr bool kMapsRows = false;

  __device__ __forceinline__ void Prefetch() const {
#if defined(JG_SM90_ENABLED)
    PrefetchTensorMap(&a);
    PrefetchTensorMap(&b);
#endif
  }

  // Called by one thread: fills stage after stage, in the consumers' tile order. `timeline`
  // notes the first item's arrival and its first loads (Sm90Timeline).
  template <class P, bool kTransA, bool kTransB>
  __device__ __forceinline__ void Produce(const GemmProblem& p, const Sm90Schedule<P>& schedule,
                                          unsigned char* tiles_a, unsigned char* tiles_b, uint64_t* full,
                                          uint64_t* empty, const Sm90Timeline& timeline = {}) const {
#if defined(JG_SM90_ENABLED)
    Sm90ProducerRing<P> ring(full, empty);
    Sm90Work w;
    bool first = true;
    for (Sm90Cursor cursor = schedule.Start(); schedule.Next(p, cursor, &w);) {
      if (first) timeline.Record(kTimelineProducerItem);
      const int batch = static_cast<int>(w.batch);
      // MN-major A: only the kMnBlock-wide blocks that hold rows < M.
      constexpr int kBlockM = P::kMnBlock;
      const int a_blocks =
          static_cast<int>(std::clamp<int64_t>((p.m - w.m0 + kBlockM - 1) / kBlockM, 0, P::kBM / kBlockM));
      const uint32_t a_bytes = kTransA ? a_blocks * P::kMnBlockTileBytes : a_rows * P::kRowBytes;
      for (int kt = 0; kt < w.k_tiles; ++kt) {
        uint64_t* const bar = ring.Acquire(a_bytes + P::kTileBBytes);
        if (first) timeline.Record(kTimelineProducerAcquired);
        const int k0 = static_cast<int>(w.k_begin) + (kt < w.k_wrap ? kt : kt - schedule.item_k_tiles) * P::kBK;
        unsigned char* sa = tiles_a + ring.stage * P::kTileABytes;
        unsigned char* sb = tiles_b + ring.stage * P::kTileBBytes;
        auto load = [&](void* dst, const CUtensorMap* map, bool has_batch, int c0, int c1) {
          if (has_batch) {
            TmaLoad3d(dst, map, bar, c0, c1, batch);
          } else {
            TmaLoad2d(dst, map, bar, c0, c1);
          }
        };
        // To every block of the cluster (B is the same for the cluster's tiles).
        auto load_shared = [&](void* dst, const CUtensorMap* map, bool has_batch, int c0, int c1) {
          if constexpr (P::kClusterM == 1) {
            load(dst, map, has_batch, c0, c1);
          } else if (has_batch) {
            TmaLoad3dMulticast(dst, map, bar, c0, c1, batch, (1u << P::kClusterM) - 1);
          } else {
            TmaLoad2dMulticast(dst, map, bar, c0, c1, (1u << P::kClusterM) - 1);
          }
        };
        if (!kTransA) {  // [m][k] rows: one box of kBM rows
          load(sa, &a, batched.a, k0, static_cast<int>(w.m0));
        } else {  // [k][m]: kMnBlock-wide m blocks
#pragma unroll
          for (int j = 0; j < P::kBM / kBlockM; ++j) {
            if (j < a_blocks) {
              load(sa + j * P::kMnBlockTileBytes, &a, batched.a, static_cast<int>(w.m0) + kBlockM * j, k0);
            }
          }
        }
        // B: this block's share (all of it without a cluster).
        const int rank = P::kClusterM > 1 ? static_cast<int>(ClusterRank()) : 0;
        if (kTransB) {  // [n][k] rows: a box of kBN / kClusterM rows (128 B each)
          constexpr int kRows = P::kBN / P::kClusterM;
          load_shared(sb + rank * kRows * 128, &b, batched.b, k0, static_cast<int>(w.n0) + rank * kRows);
        } else {  // [k][n]: 64-wide n blocks
          constexpr int kBlocks = P::kBN / 64 / P::kClusterM;
#pragma unroll
          for (int jj = 0; jj < kBlocks; ++jj) {
            const int j = rank * kBlocks + jj;
            load_shared(sb + j * P::kMnBlockBytes, &b, batched.b, static_cast<int>(w.n0) + 64 * j, k0);
          }
        }
        ring.Advance();
        if (first) timeline.Record(kTimelineProducerLoads);
        first = false;
      }
    }
#endif
  }
};

#if defined(JG_SM90_ENABLED)

template <class TIn, int kN, int kTransA, int kTransB>
__device__ __forceinline__ void Wgmma(float (&d)[kN / 2], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  static_assert(kN == 64 || kN == 128 || kN == 256 || (kN == 160 && sizeof(TIn) == 2),
                "no wgmma wrapper generated for this N");
  if constexpr (std::is_same_v<TIn, float>) {
    static_assert(!kTransA && !kTransB, "tf32 wgmma takes K-major operands only");
    if constexpr (kN == 256) WgmmaM64N256K8Tf32(d, desc_a, desc_b, scale_d);
    if constexpr (kN == 128) WgmmaM64N128K8Tf32(d, desc_a, desc_b, scale_d);
    if constexpr (kN == 64) WgmmaM64N64K8Tf32(d, desc_a, desc_b, scale_d);
  } else if constexpr (std::is_same_v<TIn, __nv_bfloat16>) {
    if constexpr (kN == 256) WgmmaM64N256K16Bf16<kTransA, kTransB>(d, desc_a, desc_b, scale_d);
    if constexpr (kN == 160) WgmmaM64N160K16Bf16<kTransA, kTransB>(d, desc_a, desc_b, scale_d);
    if constexpr (kN == 128) WgmmaM64N128K16Bf16<kTransA, kTransB>(d, desc_a, desc_b, scale_d);
    if constexpr (kN == 64) WgmmaM64N64K16Bf16<kTransA, kTransB>(d, desc_a, desc_b, scale_d);
  } else {
    static_assert(std::is_same_v<TIn, __half>, "wgmma inputs: bf16, f16 or tf32");
    if constexpr (kN == 256) WgmmaM64N256K16F16<kTransA, kTransB>(d, desc_a, desc_b, scale_d);
    if constexpr (kN == 160) WgmmaM64N160K16F16<kTransA, kTransB>(d, desc_a, desc_b, scale_d);
    if constexpr (kN == 128) WgmmaM64N128K16F16<kTransA, kTransB>(d, desc_a, desc_b, scale_d);
    if constexpr (kN == 64) WgmmaM64N64K16F16<kTransA, kTransB>(d, desc_a, desc_b, scale_d);
  }
}

template <int kN>
__device__ __forceinline__ void WgmmaTf32RegisterA(float (&d)[kN / 2], const uint32_t (&a)[4], uint64_t desc_b,
                                                   int scale_d) {
  static_assert(kN == 64 || kN == 128 || kN == 256, "no wgmma wrapper generated for this N");
  if constexpr (kN == 256) WgmmaM64N256K8Tf32RegisterA(d, a, desc_b, scale_d);
  if constexpr (kN == 128) WgmmaM64N128K8Tf32RegisterA(d, a, desc_b, scale_d);
  if constexpr (kN == 64) WgmmaM64N64K8Tf32RegisterA(d, a, desc_b, scale_d);
}

// A tf32 A tile stored MN-major (Sm90RegisterA), which wgmma cannot read from shared memory:
// each consumer thread loads its part with 32-bit shared loads, in the order of wgmma's
// register A (per warp and k8 step, the m16n8k8 tf32 fragment: fragment rows g and g + 8
// with g = 16 warp + lane / 4, k t and t + 4 with t = lane % 4). The stage holds the tile
// in kMnBlock (32) wide m blocks of kBK k rows of 128 B, 128 B-swizzled by TMA: the 16-byte
// chunk c of row k sits at chunk c ^ (k % 8). Read in order, the four k rows t of a load
// would meet in pairs on the same banks (c ^ 0 and c ^ 1 are the same two chunks); so
// fragment row r holds tile row Row(r) instead, which gives each warp's load 32 distinct
// banks. The epilogues write accumulator row r to Row(r).
template <class P>
struct Sm90RegisterAFragments {
  // Tile row (of the consumer's 64) of fragment row r = 16 w + 8 h + i: the bits of
  // 32 (w / 2) + 16 (i / 4) + 8 h + 4 (w % 2) + i % 4, so that a warp's rows g (i < 8) sit
  // in chunks c and c + 4 of the same 32-wide block.
  __host__ __device__ static constexpr int Row(int r) {
    return 32 * (r / 32) + 16 * (r / 4 % 2) + 8 * (r / 8 % 2) + 4 * (r / 16 % 2) + r % 4;
  }

  // Bytes into a stage's A tile of this thread's four registers for k8 step 0: register 0
  // (row g, k t) at `base`; fragment row g + 8 is two chunks further (chunk bit 1: ^ 32),
  // k t + 4 four rows further (+ 512) with swizzle bit 2 flipped (^ 64). The XORs touch bits
  // 5 and 6 only, which a stage (1 KB aligned) and a k8 step (1 KB) leave zero, so the four
  // offsets are fixed and a load's address is one add: stage + step + offset.
  uint32_t offset[4];

  __device__ __forceinline__ explicit Sm90RegisterAFragments(int first_row) {
    const int lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32;
    const int m = first_row + Row(16 * warp + lane / 4), t = lane % 4;
    const uint32_t base = (m / 32) * P::kMnBlockTileBytes + t * P::kRowBytes + ((m % 32 / 4) ^ t) * 16 + (m % 4) * 4;
    offset[0] = base;
    offset[1] = base ^ 32;
    offset[2] = (base ^ 64) + 4 * P::kRowBytes;
    offset[3] = (base ^ 96) + 4 * P::kRowBytes;
  }

  // Step kk reads k rows 8 kk + (t, t + 4): the same swizzle, 8 rows (1 KB) further.
  __device__ __forceinline__ void Load(uint32_t stage_a, uint32_t (&frag)[P::kKSteps][4]) const {
    static_assert(P::kMnBlock == 32 && P::kRowBytes == 128, "32 x 32 tf32 blocks");
#pragma unroll
    for (int kk = 0; kk < P::kKSteps; ++kk)
#pragma unroll
      for (int i = 0; i < 4; ++i) frag[kk][i] = LoadShared32(stage_a + offset[i] + kk * 8 * P::kRowBytes);
  }
};

#endif  // JG_SM90_ENABLED

}  // namespace jaxgemm
