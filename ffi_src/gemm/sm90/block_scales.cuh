// The sm90 kernel's block scales (Sm90Policy::kBlockScaled, gemm/block_scales.h): the
// producer's loads of each k-tile's scales (Sm90ScaleLoads, beside the operand tiles of
// Sm90MatrixLoads) and the consumers' promotion of a k-tile's products into the fp32
// accumulators (Sm90PromoteBlock; Sm90PromoteBlockGroups where B's scales come in groups
// of 64 rows).
#pragma once
#include <cuda.h>

#include <cstdint>

#include "common/ptx_sm90.cuh"
#include "gemm/sm90/scheduler.cuh"

namespace jaxgemm {

// Extra loads of Sm90MatrixLoads::Produce: none.
struct Sm90NoExtraLoads {
  template <class P>
  __device__ __forceinline__ static constexpr uint32_t Bytes() {
    return 0;
  }
  template <class P>
  __device__ __forceinline__ void Load(unsigned char*, int, uint64_t*, const Sm90Work&, int) const {}
};

// Floats in one k-tile's box of B's scales: one per column of the tile, or one per group of
// 64 columns: eight from the group of four at or before the tile's first (a box's first
// element must lie on 16 bytes: one that did not faulted with an illegal instruction on an
// H100), which hold the tile's at most four groups wherever in those four it starts.
template <class P>
inline constexpr int kSm90BScaleBox = P::kBScaleRows == 1 ? P::kBN : 8;

// Where a tile's B scales start in the k-tile's box: 0 per column, else the tile's first
// group's place in its group of four.
template <class P>
__host__ __device__ __forceinline__ constexpr int Sm90BScaleSkip(int64_t n0) {
  return P::kBScaleRows == 1 ? 0 : static_cast<int>(n0 / P::kBScaleRows % 4);
}

// Per k-tile, one box of the row scales of A (kBM floats) and one of the column scales of B
// (kSm90BScaleBox floats) of the k-tile's block, into the stage's scale slot. Rows and
// columns past M or N read as zeros (their products are never stored).
struct Sm90ScaleLoads {
  CUtensorMap a, b;  // over (batch,) blocks x rows (groups) floats; boxes of kBM (kSm90BScaleBox) x 1
  bool batched;      // 3-D maps: one set of scales per batch index
  int block_k;       // K values per block (a multiple of the k-tile)

  __device__ __forceinline__ void Prefetch() const {
#if defined(JG_SM90_ENABLED)
    PrefetchTensorMap(&a);
    PrefetchTensorMap(&b);
#endif
  }

  template <class P>
  __device__ __forceinline__ static constexpr uint32_t Bytes() {
    return (P::kBM + kSm90BScaleBox<P>) * 4;
  }

  // `stages`: the 1 KB-aligned start of the kernel's shared memory; k0: the k-tile's first K.
  template <class P>
  __device__ __forceinline__ void Load(unsigned char* stages, int stage, uint64_t* bar, const Sm90Work& w,
                                       int k0) const {
#if defined(JG_SM90_ENABLED)
    unsigned char* slot = stages + P::kScaleOffset + stage * P::kScaleStageBytes;
    const int block = k0 / block_k, m0 = static_cast<int>(w.m0);
    const int n0 = static_cast<int>(w.n0) / P::kBScaleRows - Sm90BScaleSkip<P>(w.n0);
    if (batched) {
      const int batch = static_cast<int>(w.batch);
      TmaLoad3d(slot, &a, bar, m0, block, batch);
      TmaLoad3d(slot + P::kBM * 4, &b, bar, n0, block, batch);
    } else {
      TmaLoad2d(slot, &a, bar, m0, block);
      TmaLoad2d(slot + P::kBM * 4, &b, bar, n0, block);
    }
#endif
  }
};

#if defined(JG_SM90_ENABLED)
// acc += part * scale_a[row] * scale_b[column] for one m64 block of a consumer's tile: its
// k-tile's products `part` (wgmma's fragment: registers 4j .. 4j + 3 hold rows r, r, r + 8,
// r + 8 and columns 8j + 2 (lane % 4) + 0, 1, 0, 1, with r = 16 warp + lane / 4), `slot`
// the stage's scales (shared address) and `row` the tile row of this thread's r.
// Two float ops an accumulator: the scales of rows and columns both vary per k-tile.
template <class P>
__device__ __forceinline__ void Sm90PromoteBlock(float (&acc)[P::kBN / 2], const float (&part)[P::kBN / 2],
                                                 uint32_t slot, int row, int lane) {
  const float a0 = __uint_as_float(LoadShared32(slot + 4 * row));
  const float a1 = __uint_as_float(LoadShared32(slot + 4 * (row + 8)));
  const uint32_t columns = slot + 4 * P::kBM + 8 * (lane % 4);
#pragma unroll
  for (int j = 0; j < P::kBN / 8; ++j) {
    const uint2 b = LoadShared64(columns + 32 * j);
    const float b0 = __uint_as_float(b.x), b1 = __uint_as_float(b.y);
    acc[4 * j + 0] = fmaf(part[4 * j + 0], a0 * b0, acc[4 * j + 0]);
    acc[4 * j + 1] = fmaf(part[4 * j + 1], a0 * b1, acc[4 * j + 1]);
    acc[4 * j + 2] = fmaf(part[4 * j + 2], a1 * b0, acc[4 * j + 2]);
    acc[4 * j + 3] = fmaf(part[4 * j + 3], a1 * b1, acc[4 * j + 3]);
  }
}

// The same where B's scales come in groups of 64 rows: one scale per 64 columns of the tile
// (the slot holds them in order from `skip`, Sm90BScaleSkip), so each row's and group's
// product of scales is formed once and a value takes one FFMA (twice the promotion rate of
// per-column scales).
template <class P>
__device__ __forceinline__ void Sm90PromoteBlockGroups(float (&acc)[P::kBN / 2], const float (&part)[P::kBN / 2],
                                                       uint32_t slot, int row, int skip) {
  constexpr int kGroups = P::kBN / 64;
  const float a0 = __uint_as_float(LoadShared32(slot + 4 * row));
  const float a1 = __uint_as_float(LoadShared32(slot + 4 * (row + 8)));
  const uint32_t groups = slot + 4 * (P::kBM + skip);
  float s0[kGroups], s1[kGroups];
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    const float b = __uint_as_float(LoadShared32(groups + 4 * g));
    s0[g] = a0 * b;
    s1[g] = a1 * b;
  }
#pragma unroll
  for (int j = 0; j < P::kBN / 8; ++j) {
    const int g = j / 8;  // columns 8j .. 8j + 7: group j / 8
    acc[4 * j + 0] = fmaf(part[4 * j + 0], s0[g], acc[4 * j + 0]);
    acc[4 * j + 1] = fmaf(part[4 * j + 1], s0[g], acc[4 * j + 1]);
    acc[4 * j + 2] = fmaf(part[4 * j + 2], s1[g], acc[4 * j + 2]);
    acc[4 * j + 3] = fmaf(part[4 * j + 3], s1[g], acc[4 * j + 3]);
  }
}
#endif

}  // namespace jaxgemm
