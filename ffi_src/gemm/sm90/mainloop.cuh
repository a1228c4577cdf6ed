// The mainloop's pieces: the producer's ring of shared-memory stages (Sm90ProducerRing),
// the GEMM's TMA loads of A and B into it (Sm90MatrixLoads, and with fp8 block scales
// Sm90BlockScaledLoads; convolutions bring their own loads type), the wgmma calls the
// consumers issue on a stage, tf32's A read from registers (Sm90RegisterAFragments), and
// the consumers' side: their walk around the ring (Sm90ConsumerRing) and their k-loop
// (Sm90ConsumerMma).
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/ptx_sm90.cuh"
#include "gemm/problem.h"
#include "gemm/sm90/block_scales.cuh"
#include "gemm/sm90/fp8_operands.h"
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
  // notes the first item's arrival and its first loads (Sm90Timeline); `extra` loads more
  // into each stage (Sm90ScaleLoads).
  template <class P, bool kTransA, bool kTransB, class Extra = Sm90NoExtraLoads>
  __device__ __forceinline__ void Produce(const GemmProblem& p, const Sm90Schedule<P>& schedule,
                                          unsigned char* tiles_a, unsigned char* tiles_b, uint64_t* full,
                                          uint64_t* empty, const Sm90Timeline& timeline = {},
                                          const Extra& extra = {}) const {
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
        uint64_t* const bar = ring.Acquire(a_bytes + P::kTileBBytes + Extra::template Bytes<P>());
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
        extra.template Load<P>(tiles_a, ring.stage, bar, w, k0);
        ring.Advance();
        if (first) timeline.Record(kTimelineProducerLoads);
        first = false;
      }
    }
#endif
  }
};

// The GEMM's loads with fp8 block scales (Sm90Policy::kBlockScaled): A and B as
// Sm90MatrixLoads loads them (both K-major), and each k-tile's scales beside them.
struct Sm90BlockScaledLoads {
  Sm90MatrixLoads matrix;
  Sm90ScaleLoads scales;
  static constexpr bool kMapsRows = false;

  __device__ __forceinline__ void Prefetch() const {
    matrix.Prefetch();
    scales.Prefetch();
  }

  template <class P, bool kTransA, bool kTransB>
  __device__ __forceinline__ void Produce(const GemmProblem& p, const Sm90Schedule<P>& schedule,
                                          unsigned char* tiles_a, unsigned char* tiles_b, uint64_t* full,
                                          uint64_t* empty, const Sm90Timeline& timeline = {}) const {
    static_assert(P::kBlockScaled && !kTransA && kTransB, "block scales: a block-scaled policy, K-major operands");
    matrix.Produce<P, kTransA, kTransB>(p, schedule, tiles_a, tiles_b, full, empty, timeline, scales);
  }
};

// Whether a loads type is the GEMM's (matrix operands that start anywhere in K): stream-K,
// the dynamic walk, the timeline and the per-epilogue instances take only those.
template <class Loads>
inline constexpr bool kSm90GemmLoads =
    std::is_same_v<Loads, Sm90MatrixLoads> || std::is_same_v<Loads, Sm90BlockScaledLoads>;

#if defined(JG_SM90_ENABLED)

template <class TIn, int kN, int kTransA, int kTransB>
__device__ __forceinline__ void Wgmma(float (&d)[kN / 2], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  static_assert(kN == 64 || kN == 128 || kN == 256 || (kN == 160 && sizeof(TIn) == 2) ||
                    (kN == 192 && sizeof(TIn) == 1),
                "no wgmma wrapper generated for this N");
  if constexpr (std::is_same_v<TIn, float>) {
    static_assert(!kTransA && !kTransB, "tf32 wgmma takes K-major operands only");
    if constexpr (kN == 256) WgmmaM64N256K8Tf32(d, desc_a, desc_b, scale_d);
    if constexpr (kN == 128) WgmmaM64N128K8Tf32(d, desc_a, desc_b, scale_d);
    if constexpr (kN == 64) WgmmaM64N64K8Tf32(d, desc_a, desc_b, scale_d);
  } else if constexpr (std::is_same_v<TIn, __nv_fp8_e4m3>) {
    static_assert(!kTransA && !kTransB, "fp8 wgmma takes K-major operands only");
    if constexpr (kN == 256) WgmmaM64N256K32E4m3E4m3(d, desc_a, desc_b, scale_d);
    if constexpr (kN == 192) WgmmaM64N192K32E4m3E4m3(d, desc_a, desc_b, scale_d);
    if constexpr (kN == 128) WgmmaM64N128K32E4m3E4m3(d, desc_a, desc_b, scale_d);
    if constexpr (kN == 64) WgmmaM64N64K32E4m3E4m3(d, desc_a, desc_b, scale_d);
  } else if constexpr (std::is_same_v<TIn, Fp8E5m2E4m3>) {
    static_assert(!kTransA && !kTransB, "fp8 wgmma takes K-major operands only");
    if constexpr (kN == 256) WgmmaM64N256K32E5m2E4m3(d, desc_a, desc_b, scale_d);
    if constexpr (kN == 192) WgmmaM64N192K32E5m2E4m3(d, desc_a, desc_b, scale_d);
    if constexpr (kN == 128) WgmmaM64N128K32E5m2E4m3(d, desc_a, desc_b, scale_d);
    if constexpr (kN == 64) WgmmaM64N64K32E5m2E4m3(d, desc_a, desc_b, scale_d);
  } else if constexpr (std::is_same_v<TIn, Fp8E4m3E5m2>) {
    static_assert(!kTransA && !kTransB, "fp8 wgmma takes K-major operands only");
    if constexpr (kN == 256) WgmmaM64N256K32E4m3E5m2(d, desc_a, desc_b, scale_d);
    if constexpr (kN == 192) WgmmaM64N192K32E4m3E5m2(d, desc_a, desc_b, scale_d);
    if constexpr (kN == 128) WgmmaM64N128K32E4m3E5m2(d, desc_a, desc_b, scale_d);
    if constexpr (kN == 64) WgmmaM64N64K32E4m3E5m2(d, desc_a, desc_b, scale_d);
  } else if constexpr (std::is_same_v<TIn, __nv_bfloat16>) {
    if constexpr (kN == 256) WgmmaM64N256K16Bf16<kTransA, kTransB>(d, desc_a, desc_b, scale_d);
    if constexpr (kN == 160) WgmmaM64N160K16Bf16<kTransA, kTransB>(d, desc_a, desc_b, scale_d);
    if constexpr (kN == 128) WgmmaM64N128K16Bf16<kTransA, kTransB>(d, desc_a, desc_b, scale_d);
    if constexpr (kN == 64) WgmmaM64N64K16Bf16<kTransA, kTransB>(d, desc_a, desc_b, scale_d);
  } else {
    static_assert(std::is_same_v<TIn, __half>, "wgmma inputs: bf16, f16, tf32 or fp8 (fp8_operands.h)");
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

// The tile row (of the consumer's 64) that accumulator row r holds: r, or with register A
// its permutation, which every epilogue undoes.
template <class P, bool kRegisterA>
__device__ __forceinline__ int Sm90TileRow(int r) {
  return kRegisterA ? Sm90RegisterAFragments<P>::Row(r) : r;
}

// The consumers' walk around the ring: a consumer waits on a stage's full barrier and, once
// its wgmmas have read the stage, releases it on the empty barrier of every cluster block
// (the producers of all of them write into it). Pingpong consumers skip each other's items.
template <class P>
struct Sm90ConsumerRing {
  uint64_t* full;
  uint64_t* empty;
  uint32_t phase = 0;  // (before stage, as the loop's locals were: another order changed
                       // the kernels' registers; ffi_src/gemm/NOTES.md, "ptxas
                       // lessons")
  int stage = 0;

  __device__ __forceinline__ void WaitFull() const { MbarrierWait(&full[stage], phase); }

  __device__ __forceinline__ void Release(int s) const {
    if constexpr (P::kClusterM == 1) {
      MbarrierArrive(&empty[s]);
    } else {
#pragma unroll
      for (int r = 0; r < P::kClusterM; ++r) MbarrierArriveCluster(&empty[s], r);
    }
  }

  __device__ __forceinline__ void Advance() {
    if (++stage == P::kStages) {
      stage = 0;
      phase ^= 1;
    }
  }

  // Past an item of k_tiles stages that the other consumer multiplies.
  __device__ __forceinline__ void Skip(int k_tiles) {
    const int next = stage + k_tiles;
    phase ^= (next / P::kStages) & 1;
    stage = next % P::kStages;
  }
};

// What a consumer does to an arrived stage before multiplying it: nothing (Sm90ConsumerMma).
struct Sm90StageReady {
  __device__ __forceinline__ void operator()(int, int) const {}
};

// A consumer warpgroup's k-loop: wgmma on the ring's stages into fp32 accumulators, rows
// [first_row, first_row + 64 kMmaM) of the tile (tf32 with an MN-major A: A from registers,
// Sm90RegisterAFragments; with block scales, each k-tile's products promoted into them).
template <class P, class TIn, bool kTransA, bool kTransB>
struct Sm90ConsumerMma {
  using Acc = float[P::kMmaM][P::kBN / 2];
  static constexpr bool kRegisterA = std::is_same_v<TIn, float> && kTransA;
  static_assert(!kRegisterA || P::kMmaM == 1, "register A: one m64 block per consumer");
  // Descriptor geometry: K-major tiles step 32 B per wgmma (k16, or k8 for tf32) inside the
  // swizzled row; MN-major tiles step two 8-row (1 KB) groups.
  // The leading byte offset matters only for MN-major tiles (the 64-wide block stride).
  static constexpr uint32_t kStepA = kTransA ? 2048 : 32, kStepB = kTransB ? 32 : 2048;
  static constexpr uint32_t kLeadA = kTransA ? P::kMnBlockBytes : 16, kLeadB = kTransB ? 16 : P::kMnBlockBytes;
  static constexpr uint32_t kDescHi = uint32_t(SmemDescriptorSw128(0, 0, 1024) >> 32);

  // Stage 0's descriptors at k-step 0, as low and high words. Another stage's, k-step's or
  // m64 block's descriptor adds its byte offset / 16 (the address field's unit) to the low
  // word: shared memory is below 256 KB, so the 14-bit field never carries into the rest.
  // One 32-bit add per descriptor in the k-loop instead of rebuilding it (115 -> 78
  // instructions per k-tile and warp; docs/kernels.md, section 5.1).
  uint32_t desc_a0_lo, desc_b0_lo;
  uint32_t tiles_a_address;
  Sm90RegisterAFragments<P> register_a;
  int first_row;

  __device__ __forceinline__ Sm90ConsumerMma(unsigned char* tiles_a, unsigned char* tiles_b, int first_row)
      : desc_a0_lo(uint32_t(SmemDescriptorSw128(SharedAddress(tiles_a) + first_row * P::kRowBytes, kLeadA, 1024))),
        desc_b0_lo(uint32_t(SmemDescriptorSw128(SharedAddress(tiles_b), kLeadB, 1024))),
        tiles_a_address(SharedAddress(tiles_a)),
        register_a(first_row),
        first_row(first_row) {}

  __device__ __forceinline__ static uint64_t Descriptor(uint32_t lo) { return (uint64_t(kDescHi) << 32) | lo; }

  // Blocks kBlocks and up (not multiplied), or all of them for an item of no k-tiles, hold
  // zeros; with block scales all of them (the k-tiles' products are added in).
  template <int kBlocks>
  __device__ __forceinline__ static void ZeroUnmultiplied(Acc& acc, int k_tiles) {
#pragma unroll
    for (int mi = 0; mi < P::kMmaM; ++mi) {
      if (mi >= kBlocks || k_tiles == 0 || P::kBlockScaled) {
#pragma unroll
        for (int j = 0; j < P::kBN / 2; ++j) acc[mi][j] = 0.f;
      }
    }
  }

  // The item's k-loop over its first kBlocks m64 blocks (a compile-time count: a wgmma under
  // a runtime condition makes ptxas serialize the wgmmas); with none, the stages are only
  // handed back. `queued()` runs once two k-tiles of wgmmas are queued; `ready(kt, stage)`
  // once k-tile kt has arrived, before it is multiplied (the grouped contraction zeroes its
  // rows past the group there). Returns the stage the last k-tile's wgmmas may still read
  // (-1: none): Drain waits for them and frees it.
  // With block scales, n0 is the tile's first column (where its B scales start).
  template <int kBlocks, class Queued, class Ready = Sm90StageReady>
  __device__ __forceinline__ int Multiply(Acc& acc, Sm90ConsumerRing<P>& ring, int k_tiles, int lane,
                                          Queued queued, Ready ready = {}, int64_t n0 = 0) const {
    if constexpr (P::kBlockScaled) {
      MultiplyBlockScaled<kBlocks>(acc, ring, k_tiles, lane, queued, ready, Sm90BScaleSkip<P>(n0));
      return -1;
    }
    int previous = -1;
    // Register A: two fragment sets, so that a k-tile's loads do not overwrite the set the
    // previous k-tile's wgmmas (still in flight) read. Each set needs fixed registers, so
    // the k-loop runs k-tile pairs, then an odd last k-tile after it: ptxas serializes
    // every wgmma (C7513) if any path could load a set while its group is in flight.
    [[maybe_unused]] uint32_t a_frags[kRegisterA ? 2 : 1][P::kKSteps][4];
    auto k_tile = [&](int kt, auto set) {
      ring.WaitFull();
      // (Not even a call of the empty hook: it renumbers the PTX, and ptxas picks other
      // registers.)
      if constexpr (!std::is_same_v<Ready, Sm90StageReady>) ready(kt, ring.stage);
      if constexpr (kBlocks > 0) {
        const uint32_t desc_b = desc_b0_lo + ring.stage * (P::kTileBBytes / 16);
        if constexpr (kRegisterA) {
          constexpr int kSet = decltype(set)::value;
          register_a.Load(tiles_a_address + ring.stage * P::kTileABytes, a_frags[kSet]);
          WgmmaFence();
#pragma unroll
          for (int kk = 0; kk < P::kKSteps; ++kk) {
            WgmmaTf32RegisterA<P::kBN>(acc[0], a_frags[kSet][kk], Descriptor(desc_b + kk * kStepB / 16),
                                       (kt | kk) != 0);
          }
        } else {
          const uint32_t desc_a = desc_a0_lo + ring.stage * (P::kTileABytes / 16);
          WgmmaFence();
#pragma unroll
          for (int kk = 0; kk < P::kKSteps; ++kk) {
#pragma unroll
            for (int mi = 0; mi < kBlocks; ++mi) {
              // 64 rows of A further on: 64 x 128 B rows (K-major) or the next 64-wide block.
              const uint32_t a_offset = (mi * P::kMnBlockBytes + kk * kStepA) / 16;
              Wgmma<TIn, P::kBN, kTransA, !kTransB>(acc[mi], Descriptor(desc_a + a_offset),
                                                    Descriptor(desc_b + kk * kStepB / 16), (kt | kk) != 0);
            }
          }
        }
        WgmmaCommitGroup();
        if (kt == 1) queued();
        // Keep one group in flight: the previous k-tile's group is done, its stage is free.
        WgmmaWaitGroup<1>();
        if (previous >= 0 && lane == 0) ring.Release(previous);
        previous = ring.stage;
      } else {
        if (lane == 0) ring.Release(ring.stage);
      }
      ring.Advance();
    };
    using First = std::integral_constant<int, 0>;
    if constexpr (kRegisterA) {
      int kt = 0;
      for (; kt + 1 < k_tiles; kt += 2) {
        k_tile(kt, First{});
        k_tile(kt + 1, std::integral_constant<int, 1>{});
      }
      if (kt < k_tiles) k_tile(kt, First{});
    } else {
      for (int kt = 0; kt < k_tiles; ++kt) k_tile(kt, First{});
    }
    return previous;
  }

  // The k-loop with block scales: each k-tile's wgmmas sum into `part`, which, once they are
  // done, is scaled into acc (Sm90PromoteBlock, or Sm90PromoteBlockGroups); then the stage
  // is free. The wait leaves this warpgroup's tensor work idle through its promotion, which
  // the other consumer's wgmmas fill.
  template <int kBlocks, class Queued, class Ready>
  __device__ __forceinline__ void MultiplyBlockScaled(Acc& acc, Sm90ConsumerRing<P>& ring, int k_tiles, int lane,
                                                      Queued queued, Ready ready, int b_skip) const {
    [[maybe_unused]] float part[P::kMmaM][P::kBN / 2];
    const uint32_t scales = tiles_a_address + P::kScaleOffset;
    const int row = first_row + 16 * ((threadIdx.x % 128) / 32) + lane / 4;
    for (int kt = 0; kt < k_tiles; ++kt) {
      ring.WaitFull();
      if constexpr (!std::is_same_v<Ready, Sm90StageReady>) ready(kt, ring.stage);
      if constexpr (kBlocks > 0) {
        const uint32_t desc_a = desc_a0_lo + ring.stage * (P::kTileABytes / 16);
        const uint32_t desc_b = desc_b0_lo + ring.stage * (P::kTileBBytes / 16);
        WgmmaFence();
#pragma unroll
        for (int kk = 0; kk < P::kKSteps; ++kk) {
#pragma unroll
          for (int mi = 0; mi < kBlocks; ++mi) {
            const uint32_t a_offset = (mi * P::kMnBlockBytes + kk * kStepA) / 16;
            Wgmma<TIn, P::kBN, kTransA, !kTransB>(part[mi], Descriptor(desc_a + a_offset),
                                                  Descriptor(desc_b + kk * kStepB / 16), kk != 0);
          }
        }
        WgmmaCommitGroup();
        if (kt == 0) queued();
        WgmmaWaitGroup<0>();
        const uint32_t slot = scales + ring.stage * P::kScaleStageBytes;
#pragma unroll
        for (int mi = 0; mi < kBlocks; ++mi) {
          if constexpr (P::kBScaleRows == 1) {
            Sm90PromoteBlock<P>(acc[mi], part[mi], slot, row + 64 * mi, lane);
          } else {
            Sm90PromoteBlockGroups<P>(acc[mi], part[mi], slot, row + 64 * mi, b_skip);
          }
        }
        __syncwarp();  // every lane has read the stage's scales
      }
      if (lane == 0) ring.Release(ring.stage);
      ring.Advance();
    }
  }

  // Waits for the last k-tile's wgmmas and frees their stage.
  __device__ __forceinline__ static void Drain(const Sm90ConsumerRing<P>& ring, int previous, int lane) {
    WgmmaWaitGroup<0>();
    if (previous >= 0 && lane == 0) ring.Release(previous);
  }
};

#endif  // JG_SM90_ENABLED

}  // namespace jaxgemm
