// The sm90 kernel's TMA-store epilogue: the fused one (the epilogue's steps of
// gemm/epilogue_steps.cuh on the fragments: bias, activation, Aux; 16-bit outputs), and
// Sm90TmaEpilogue, which picks per tile between it and the plain boxes of boxes.cuh (alpha
// only) and keeps what the consumer's boxes hold between tiles (for Sm90Consume,
// sm90/kernel.cuh).
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "common/activation.h"
#include "common/device_numeric.cuh"
#include "common/ptx_sm90.cuh"
#include "gemm/epilogue_steps.cuh"
#include "gemm/problem.h"
#include "gemm/sm90/boxes.cuh"
#include "gemm/sm90/mainloop.cuh"

namespace jaxgemm {

#if defined(JG_SM90_ENABLED)

// Bias of columns col and col + 1 (0 where >= n, as in GemmEpilogue): one 32-bit load when
// `pairs` (a 4-byte aligned bias; col is even) and both columns exist.
template <class T>
__device__ __forceinline__ float2 LoadBiasPair(const T* bias, int64_t col, int64_t n, bool pairs) {
  if (pairs && col + 1 < n) {
    const unsigned int word = __ldg(reinterpret_cast<const unsigned int*>(bias + col));
    T x[2];
    memcpy(x, &word, 4);
    return make_float2(ToFloat(x[0]), ToFloat(x[1]));
  }
  return make_float2(col < n ? ToFloat(bias[col]) : 0.f, col + 1 < n ? ToFloat(bias[col + 1]) : 0.f);
}

// The fused epilogue's bias columns col and col + 1 of batch `batch`, packed as two 16-bit
// values (0 where >= n), for this tile's shared-memory stage. Loaded before the tile's
// mainloop, which hides the latency the epilogue would otherwise wait for once per block.
// The parameters are read through an opaque pointer so that the compiler cannot hoist
// them out of the tile loop (they would hold registers through the mainloop).
template <class T>
__device__ __forceinline__ uint32_t Sm90BiasWord(const Sm90Store& store, int64_t col, int64_t batch) {
  const Sm90Store* params = &store;
  asm volatile("" : "+l"(params));
  const T* bias = static_cast<const T*>(params->bias) + batch * params->bias_stride;
  const float2 b = LoadBiasPair(bias, col, params->n, IsAligned(bias, 4));
  return PackPair<T>(b.x, b.y);
}

// Brings the tile's row and column scales (float32, one 128-byte line per 32) into L1
// before the mainloop, where the fused epilogue's loads then hit: lines of the consumer's
// kRows rows from row0, then of the tile's kBN columns from col0, one per thread. Read
// through an opaque pointer, as Sm90BiasWord reads its parameters.
template <class P, int kRows>
__device__ __forceinline__ void Sm90PrefetchScales(const Sm90Store& store, int64_t row0, int64_t col0, int64_t batch,
                                                   int tid) {
  const Sm90Store* params = &store;
  asm volatile("" : "+l"(params));
  constexpr int kRowLines = kRows / 32, kColLines = P::kBN / 32;
  const bool rows = tid < kRowLines;
  const int line = rows ? tid : tid - kRowLines;
  const float* scales = rows ? params->row_scale : params->col_scale;
  const int64_t first = (rows ? row0 : col0) + 32 * line, extent = rows ? params->m : params->n;
  const int64_t stride = rows ? params->row_scale_stride : params->col_scale_stride;
  if (tid < kRowLines + kColLines && scales != nullptr && first < extent) {
    asm volatile("prefetch.global.L1 [%0];" ::"l"(scales + batch * stride + first));
  }
}

// v = the values of block b of kCols columns of a consumer's accumulators (row block
// b / (kBN / kCols), column block b % (kBN / kCols)) in this thread's fragments:
// v[h][2 u + x] is row 16 warp + lane / 4 + 8 h, column 8 u + 2 (lane % 4) + x of the block.
// b is a runtime index, the fragment indices must be compile-time: an if-else chain ending
// in an unconditional else, so v is defined on every path (otherwise it stays live around
// the tile loop, through the mainloop). The copies are volatile moves so they stay in their
// branches (speculated, each value would become one select per block).
template <class P, int kCols, int kB = 0, int kMmaM>
__device__ __forceinline__ void Sm90TakeColumns(const float (&acc)[kMmaM][P::kBN / 2], int b,
                                                float (&v)[2][kCols / 4]) {
  constexpr int kColBlocks = P::kBN / kCols, kBlocks = kMmaM * kColBlocks;
  auto take = [&] {
#pragma unroll
    for (int u = 0; u < kCols / 8; ++u)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int x = 0; x < 2; ++x) {
          asm volatile("mov.b32 %0, %1;"
                       : "=f"(v[h][2 * u + x])
                       : "f"(acc[kB / kColBlocks][4 * (kB % kColBlocks * kCols / 8 + u) + 2 * h + x]));
        }
  };
  if constexpr (kB == kBlocks - 1) {
    take();
  } else if (b == kB) {
    take();
  } else {
    Sm90TakeColumns<P, kCols, kB + 1>(acc, b, v);
  }
}

// The fused TMA-store epilogue's source (gemm/epilogue_steps.cuh) for one 64 x 64 block:
// the bias from the tile's stage (16-bit column pairs; word0 = 32 nb + lane % 4 for column
// block nb), Aux = z into box 0.
template <class TOut>
struct Sm90FusedSource : EpilogueSourceDefaults {
  static constexpr bool kSkipUnitAlpha = true;
  uint32_t stage;    // the bias stage's shared address
  uint32_t aux_row;  // this lane's row in box 0 (Sm90BoxLane)
  uint32_t unit_xor;
  int word0;
  bool with_bias, with_aux;

  __device__ __forceinline__ bool Has(int o) const { return o == kEpilogueBias && with_bias; }
  __device__ __forceinline__ float2 Bias(int u) const {
    // Columns 64 nb + 8 u + 2 (lane % 4) + {0, 1}: word 32 nb + 4 u + lane % 4.
    const uint32_t word = LoadShared32(stage + 4 * (word0 + 4 * u));
    TOut b[2];
    memcpy(b, &word, 4);
    return make_float2(ToFloat(b[0]), ToFloat(b[1]));
  }
  __device__ __forceinline__ bool HasAux() const { return with_aux; }
  __device__ __forceinline__ void StoreAux(const float (&v)[2][16]) const { Sm90WriteBoxValues<TOut>(aux_row, unit_xor, v); }
};

// The scale step's source (EpilogueScales) for one m64 block of a consumer's accumulators,
// seen as v[h][2 u + x] = acc[mi][4 u + 2 h + x]: row 8 h, column 8 u + x from this lane's
// first row and column; `rows_left` and `cols_left` of those lie inside the output (a scale
// outside reads 0: those values are never stored).
struct Sm90TileScales : EpilogueSourceDefaults {
  const float* row_scale;  // null: absent
  const float* col_scale;
  int64_t rows_left, cols_left;

  __device__ __forceinline__ bool Has(int o) const {
    return o == kEpilogueRowScale ? row_scale != nullptr : o == kEpilogueColScale && col_scale != nullptr;
  }
  template <int kOperand>
  __device__ __forceinline__ float Value(int i, int j) const {
    if constexpr (kOperand == kEpilogueRowScale) return 8 * i < rows_left ? __ldg(row_scale + 8 * i) : 0.f;
    const int c = 8 * (j / 2) + j % 2;
    return c < cols_left ? __ldg(col_scale + c) : 0.f;
  }
};

// The scale step on a consumer's whole tile, before any TMA-store epilogue (plain or
// fused): the scales alone keep the plain path's overlap of boxes with the next tile, and
// the fused blocks' loop holds no scale state next to the tile's accumulators (per block,
// the scales' loads and pointers spilled the 256-column tiles).
template <class P>
__device__ __forceinline__ void Sm90ScaleTile(const Sm90Store& s, float (&acc)[P::kMmaM][P::kBN / 2], int64_t row0,
                                              int64_t col0, int64_t batch, int tid) {
  const int lane = tid % 32;
  const int64_t col = col0 + 2 * (lane % 4);
#pragma unroll
  for (int mi = 0; mi < P::kMmaM; ++mi) {
    const int64_t row = row0 + 64 * mi + 16 * (tid / 32) + lane / 4;
    const Sm90TileScales source{{},
                                s.row_scale ? s.row_scale + batch * s.row_scale_stride + row : nullptr,
                                s.col_scale ? s.col_scale + batch * s.col_scale_stride + col : nullptr,
                                s.m - row, s.n - col};
    float v[2][P::kBN / 4];
#pragma unroll
    for (int u = 0; u < P::kBN / 8; ++u)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int x = 0; x < 2; ++x) v[h][2 * u + x] = acc[mi][4 * u + 2 * h + x];
    EpilogueScales(source, v);
#pragma unroll
    for (int u = 0; u < P::kBN / 8; ++u)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int x = 0; x < 2; ++x) acc[mi][4 * u + 2 * h + x] = v[h][2 * u + x];
  }
}

// The fused TMA-store epilogue of one consumer's tile: the epilogue's steps
// (gemm/epilogue_steps.cuh) without C and residual, on the fragments:
//   z = alpha * acc + bias,  Aux = z,  D = act(z)
// (an fp8 product's scales are already in acc: Sm90TmaEpilogue::Store scales the tile first),
// Aux and D rounded to nearest from the fp32 values. One 64 x 64 block per iteration of a
// runtime loop, so the activation code exists once (unrolled per block, every activation
// times every block overflows the instruction cache); the block's 32 values per thread come
// out of the accumulators with compile-time indices, one branch per block (Sm90TakeColumns).
// Without Aux the two boxes alternate as in Sm90StoreTile. With Aux, Aux always goes to
// box 0 (written before the activation, so z holds no registers through it) and D to
// box 1, and both leave as one bulk group: one wait and one pair of barriers per block.
// kHanded (the cooperative schedules, Sm90HandedStores): the consumer only writes the
// boxes; the store warp stores them (with Aux, both boxes on one pair of barriers, slot 0).
// (A round per box, each box waiting only for its own previous store, measured the same:
// fused / plain 1.074 against 1.075. What the fused epilogue's time is made of:
// ffi_src/gemm/NOTES.md, "Epilogues".)
// The bias: thread t < kBN / 2 brings columns 2t, 2t + 1 of the tile (`bias_word`, loaded
// before the mainloop by Sm90BiasWord) to `bias_stage`, which every block then reads.
template <class P, class TOut, bool kHanded>
__device__ __forceinline__ void Sm90StoreTileFused(const Sm90Store& store, const float (&acc)[P::kMmaM][P::kBN / 2],
                                                   int64_t row0, int64_t col0, int64_t slab, int wg,
                                                   unsigned char* boxes, uint32_t bias_word, uint32_t* bias_stage,
                                                   bool boxes_in_use) {
  using H = Sm90HandedStores<P, TOut>;
  // The parameters and the thread index are read through values the compiler cannot see
  // through, so they are loaded on each tile: hoisted out of the tile loop they would hold
  // a dozen registers through the mainloop and the general epilogue (which then spilled).
  const Sm90Store* params = &store;
  unsigned thread;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(thread), "+l"(params));
  const Sm90Store& s = *params;
  const int tid = thread % 128, lane = tid % 32;
  constexpr int kColBlocks = P::kBN / 64, kBlocks = P::kMmaM * kColBlocks;
  const bool with_bias = s.bias != nullptr;
  const bool with_aux = s.with_aux != 0;
  const uint32_t stage = SharedAddress(bias_stage);
  if (with_bias) {
    // The previous tile's blocks read the stage before their last barrier (kHanded: they
    // have no barrier after their reads, hence one here).
    if constexpr (kHanded) NamedBarrierSync(1 + wg, 128);
    if (tid < P::kBN / 2) StoreShared32(stage + 4 * tid, bias_word);
    NamedBarrierSync(1 + wg, 128);
  }
  uint32_t row_offset, unit_xor;
  Sm90BoxLane(thread, &row_offset, &unit_xor);
  Sm90FusedSource<TOut> source{{}, stage, SharedAddress(boxes) + row_offset, unit_xor, 0, with_bias, with_aux};
  const EpilogueScalars scalars{s.alpha, 0.f, s.activation};
#pragma unroll 1
  for (int c = 0; c < kBlocks; ++c) {
    float v[2][16];
    Sm90TakeColumns<P, 64>(acc, c, v);
    const int mi = c / kColBlocks, nb = c % kColBlocks;
    source.word0 = 32 * nb + lane % 4;
    EpilogueLinear<TOut>(scalars, source, v);
    // The stores that last read this block's boxes are done with them (without Aux, the
    // other box's store may still be reading).
    unsigned char* const d_box = boxes + (with_aux ? 1 : c % 2) * P::kOutBoxBytes;
    const int slot = with_aux ? 0 : c % 2;  // kHanded: the barrier pair of the block's boxes
    if constexpr (kHanded) {
      if (c >= (with_aux ? 1 : 2) || boxes_in_use) NamedBarrierSync(H::Free(wg, slot), H::kThreads);
    } else {
      if (tid == 0) {
        if (with_aux) {
          BulkWaitGroupRead<0>();
        } else {
          Sm90WaitForSlot<kBlocks>(c);
        }
      }
      NamedBarrierSync(1 + wg, 128);
    }
    EpilogueAux(source, v);  // into box 0
    EpilogueActivation<TOut>(scalars, v);
    Sm90WriteBoxValues<TOut>(SharedAddress(d_box) + row_offset, unit_xor, v);
    FenceProxyAsyncShared();
    if constexpr (kHanded) {
      NamedBarrierArrive(H::Written(wg, slot), H::kThreads);
      continue;
    }
    NamedBarrierSync(1 + wg, 128);
    if (tid == 0) {
      const int col = static_cast<int>(col0) + 64 * nb, row = static_cast<int>(row0) + 64 * mi;
      // The slab count from the parameter space (`store`): through `params`, a memory load per box.
      if (with_aux) Sm90TmaStoreBox(store, &s.aux, boxes, col, row, static_cast<int>(slab));
      Sm90TmaStoreBox(store, &s.d, d_box, col, row, static_cast<int>(slab));
      BulkCommitGroup();
    }
  }
}

// A consumer's TMA-store epilogue across its items (Sm90Consume): which of the above a tile
// takes, and what the consumer's boxes hold between tiles. Sm90HandedStores' plain
// epilogue: boxes 0 and 1 of a tile are written at once; boxes 2 and 3 (kBN = 256), which
// must wait for their slots' stores, wait in registers as rounded words and are written
// while the next tile's first wgmmas run (WritePending; or at the exit), so that the tensor
// cores do not idle through those waits. (A float tile's 8 boxes are all written at once:
// their words would not fit registers.) kWithFused: the instance holds the fused epilogue;
// kScales: with the row and column scales (fp8 inputs).
template <class P, class TOut, bool kRegisterA, bool kWithFused, bool kScales>
struct Sm90TmaEpilogue {
  using Handed = Sm90HandedStores<P, TOut>;
  static constexpr int kLateBoxes =
      sizeof(TOut) == 2 && Handed::kUsed && Handed::kBoxes > 2 ? Handed::kBoxes - 2 : 0;
  static_assert(!kRegisterA || sizeof(TOut) == 4, "tf32 products have float outputs (16-bit boxes: fragment rows)");

  bool boxes_in_use = false;  // Sm90HandedStores: this consumer's boxes hold a tile's blocks
  uint32_t late_words[kLateBoxes > 0 ? kLateBoxes : 1][16];
  bool pending = false;  // `late_words` hold boxes not yet written

  // Where this thread's values go in an output box (made where used, so that it holds no
  // registers through the mainloop).
  __device__ __forceinline__ static Sm90BoxWriter<TOut> Writer() {
    using W = Sm90BoxWriter<TOut>;
    return W(Sm90TileRow<P, kRegisterA>(W::FragmentRow(0)), Sm90TileRow<P, kRegisterA>(W::FragmentRow(1)));
  }

  __device__ __forceinline__ void WritePending(int wg, unsigned char* boxes) {
    if constexpr (kLateBoxes > 0) {
      if (pending) {
        const Sm90BoxWriter<TOut> writer = Writer();
#pragma unroll
        for (int c = 0; c < kLateBoxes; ++c) Sm90WriteBoxWords<P, TOut>(writer, late_words[c], 2 + c, wg, boxes, true);
        pending = false;
      }
    }
  }

  // The consumer's rows of a tile, from row0, col0 of D's slab. (alpha is read from `p` where
  // used: passed as a value it changed the kernels' machine code; ffi_src/gemm/NOTES.md,
  // "ptxas lessons".)
  __device__ __forceinline__ void Store(const Sm90Store& store, float (&acc)[P::kMmaM][P::kBN / 2],
                                        const GemmProblem& p, int64_t row0, int64_t col0, int64_t slab, int wg,
                                        unsigned char* boxes, uint32_t bias_word, uint32_t* bias_stage) {
    if constexpr (kScales) {  // every path (fp8 has no split-K: one slab per batch index)
      if (store.row_scale != nullptr || store.col_scale != nullptr) {
        Sm90ScaleTile<P>(store, acc, row0, col0, slab, threadIdx.x % 128);
      }
    }
    if (kWithFused && store.fused) {  // 16-bit outputs only (MakeSm90Store)
      if constexpr (sizeof(TOut) == 2) {
        Sm90StoreTileFused<P, TOut, Handed::kUsed>(store, acc, row0, col0, slab, wg, boxes, bias_word, bias_stage,
                                                    boxes_in_use);
        boxes_in_use = Handed::kUsed;
      }
    } else if constexpr (Handed::kUsed) {
      if constexpr (kRegisterA) {
        if (store.transposed) {
          Sm90WriteTransposedBoxes<P>(acc[0], p.epilogue.alpha, wg, boxes, boxes_in_use);
          boxes_in_use = true;
          return;
        }
      }
      const Sm90BoxWriter<TOut> writer = Writer();
#pragma unroll
      for (int c = 0; c < Handed::kBoxes; ++c) {
        if (c < Handed::kBoxes - kLateBoxes) {
          uint32_t box_words[16];
          Sm90PackBox<P, TOut>(acc, c, p.epilogue.alpha, box_words);
          Sm90WriteBoxWords<P, TOut>(writer, box_words, c, wg, boxes, boxes_in_use || c >= 2);
        } else if constexpr (kLateBoxes > 0) {
          Sm90PackBox<P, TOut>(acc, c, p.epilogue.alpha, late_words[c - 2]);
        }
      }
      boxes_in_use = true;
      pending = kLateBoxes > 0;
    } else {
      Sm90StoreTile<P, TOut>(store, acc, row0, col0, slab, p.epilogue.alpha, wg, boxes, Writer());
    }
  }

  // At the consumer's exit: the last boxes written, and the block's shared memory kept until
  // the TMA stores have read it. Their writes need no wait: the grid's completion makes them
  // visible to later work, and waiting for them here would add their latency to the last
  // tile's exposed epilogue.
  __device__ __forceinline__ void Finish(const Sm90Store& store, int wg, unsigned char* boxes) {
    WritePending(wg, boxes);
    if (store.enabled && threadIdx.x % 128 == 0) BulkWaitGroupRead<0>();
    if (boxes_in_use) {  // the store warp's last stores have read the boxes (with Aux: one pair)
      NamedBarrierSync(Handed::Free(wg, 0), Handed::kThreads);
      if (!(store.fused && store.with_aux)) NamedBarrierSync(Handed::Free(wg, 1), Handed::kThreads);
    }
  }
};

#endif  // JG_SM90_ENABLED

}  // namespace jaxgemm
