// The grouped (ragged) GEMM's stores and epilogues (Sm90GroupedStoreItem, for
// Sm90GemmKernel's consumers; grouped.cuh): a consumer's rows of an item through a TMA box
// or straight to global memory, and the row and gated modes' epilogues on the steps of
// gemm/epilogue_steps.cuh.
#pragma once
#include <cuda.h>

#include <cstdint>
#include <cstring>

#include "common/activation.h"
#include "common/device_numeric.cuh"
#include "common/ptx_sm90.cuh"
#include "gemm/epilogue_steps.cuh"
#include "gemm/sm90/epilogue.cuh"
#include "gemm/sm90/grouped_items.h"
#include "gemm/sm90/grouped_problem.h"
#include "gemm/sm90/grouped_schedule.cuh"

namespace jaxgemm {

// Where the grouped kernel's items go, and the row modes' epilogue: Sm90GemmKernel's store
// parameter for the grouped loads (as Sm90Store is the GEMM's).
struct Sm90GroupedStore {
  CUtensorMap d;  // D as (rows, n): row modes (m, n); contraction (groups x k, n)
  bool tma_store;  // d is valid (D's rows are 16-byte multiples)
  // 1, as a kernel parameter: the boxes' words are then products, not the accumulators'
  // own registers, which the float boxes' register pairs would otherwise move in a
  // divergent path, and ptxas would serialize every wgmma (C7520).
  float one;
  void* out;
  int32_t n, groups;
  int32_t k;  // contraction: D's rows per group
  // The epilogue (row modes, 16-bit outputs: GroupedProblem's; Sm90GroupedEpilogue).
  bool epilogue;
  Activation activation;
  const float* bias;
  const void* residual;
  void* aux;
  const float* bias_up;  // kRowsGated (Sm90GroupedGluEpilogue)
  void* aux_up;

  // Where Sm90GemmKernel's barriers start (Sm90GroupedLayout).
  template <class P>
  static constexpr int kBarrierOffset = Sm90GroupedLayout<P>::kBarrierOffset;

#if defined(JG_SM90_ENABLED)
  __device__ __forceinline__ void Prefetch() const {
    if (tma_store) PrefetchTensorMap(&d);
  }
#endif
};

#if defined(JG_SM90_ENABLED)

// Two adjacent outputs: one vector store where `vector` (an even row pitch), else one or two
// scalar ones (`second`: the pair's second column is inside D).
template <class TOut>
__device__ __forceinline__ void Sm90StorePair(TOut* dst, float x, float y, bool vector, bool second) {
  if (vector) {
    if constexpr (sizeof(TOut) == 4) {
      *reinterpret_cast<float2*>(dst) = make_float2(x, y);
    } else {
      *reinterpret_cast<uint32_t*>(dst) = PackPair<TOut>(x, y);
    }
    return;
  }
  dst[0] = FromFloat<TOut>(x);
  if (second) dst[1] = FromFloat<TOut>(y);
}

// One box of a consumer's 64 rows (Sm90BoxWriter's layout: the dense kernel's) stored by
// TMA at (col, row): thread 0 waits until the previous store has read the box (one box per
// consumer: the shared memory the stages leave holds no second one), the warpgroup writes
// it, and thread 0 stores it.
template <class TOut>
__device__ __forceinline__ void Sm90GroupedStoreBox(const Sm90GroupedStore& store, const Sm90BoxWriter<TOut>& writer,
                                                    const uint32_t (&words)[16], int32_t row, int32_t col,
                                                    unsigned char* box, int wg) {
  const int tid = threadIdx.x % 128;
  if (tid == 0) BulkWaitGroupRead<0>();
  NamedBarrierSync(1 + wg, 128);
  writer.Write(SharedAddress(box), words);
  FenceProxyAsyncShared();
  NamedBarrierSync(1 + wg, 128);
  if (tid == 0) {
    TmaStore2d(&store.d, box, col, row);
    BulkCommitGroup();
  }
}

// A consumer's 64 rows of a tile, box after box (Sm90PackBox's words), at (col0, row).
template <class P, class TOut>
__device__ __forceinline__ void Sm90GroupedStoreBoxes(const Sm90GroupedStore& store,
                                                      const float (&acc)[1][P::kBN / 2], int32_t row, int32_t col0,
                                                      unsigned char* box, int wg) {
  const Sm90BoxWriter<TOut> writer(Sm90BoxWriter<TOut>::FragmentRow(0), Sm90BoxWriter<TOut>::FragmentRow(1));
#pragma unroll
  for (int c = 0; c < P::kBN / kSm90BoxCols<TOut>; ++c) {
    uint32_t words[16];
    Sm90PackBox<P, TOut>(acc, c, store.one, words);
    Sm90GroupedStoreBox<TOut>(store, writer, words, row, col0 + kSm90BoxCols<TOut> * c, box, wg);
  }
}

// This consumer's bias stage (a shared-memory address): after the consumers' boxes, one
// stage each (Sm90GroupedLayout). Found from the box where it is used: one more pointer
// held through the k-loop spilled.
template <class P>
__device__ __forceinline__ uint32_t Sm90GroupedBiasStage(unsigned char* box, int wg) {
  return SharedAddress(box) + (P::kConsumers - wg) * P::kOutBoxBytes + wg * P::kBN * 4;
}

// Stage values 2 j and 2 j + 1.
__device__ __forceinline__ float2 StagedPair(uint32_t stage, int j) {
  const uint2 word = LoadShared64(stage + 8 * j);
  return make_float2(__uint_as_float(word.x), __uint_as_float(word.y));
}

// An item's bias columns into this consumer's stage (P::kBN floats), one coalesced load
// per thread and two values: stage[i] = parts[i / kWidth][col0 + i % kWidth] with kWidth =
// kBN / kParts (kRowsGated: the gate's then the up weights' bias of the item's columns); 0
// past n or where a part is absent. Loaded where each value pair was used, every pair had
// waited for its own L2 round trip: 32 a tile, +32 % on the 8-expert forward with a bias.
template <class P, int kParts>
__device__ __forceinline__ void Sm90GroupedStageBias(uint32_t stage, const float* const (&parts)[kParts], int32_t col0,
                                                     int32_t n, int wg) {
  constexpr int kWidth = P::kBN / kParts;
  const int tid = threadIdx.x % 128;
  float value[P::kBN / 128];
#pragma unroll
  for (int r = 0; r < P::kBN / 128; ++r) {
    const int i = tid + 128 * r;
    const float* part = parts[i / kWidth];
    const int32_t col = col0 + i % kWidth;
    value[r] = part != nullptr && col < n ? __ldg(part + col) : 0.f;
  }
  NamedBarrierSync(1 + wg, 128);  // the previous item's blocks have read the stage
#pragma unroll
  for (int r = 0; r < P::kBN / 128; ++r) StoreShared32(stage + 4 * (tid + 128 * r), __float_as_uint(value[r]));
  NamedBarrierSync(1 + wg, 128);
}

// The grouped epilogues' source (gemm/epilogue_steps.cuh) for a block of a consumer's
// values, v[h][2 u + x] at row rows[h] and column col0 + 8 u + x: the product rounded to
// TOut before its bias (as the CPU reference), the bias from the item's stage (pair u at
// stage pair bias0 + 4 u), aux and the residual in global memory, masked by row (row_end)
// and column (n).
template <class TOut>
struct Sm90GroupedSource : EpilogueSourceDefaults {
  static constexpr bool kRoundProduct = true;
  uint32_t stage;
  int bias0;
  bool with_bias;
  TOut* aux;
  const TOut* residual;
  int32_t rows[2];
  int32_t col0, row_end, n;
  bool pairs;  // even n: pairs are 4-byte aligned

  __device__ __forceinline__ int32_t Col(int u) const { return col0 + 8 * u; }
  // Value j of the pairs: column Col(j / 2) + j % 2 (the pair's first: Inside(h, 2 u)).
  __device__ __forceinline__ bool Inside(int h, int j) const { return rows[h] < row_end && Col(j / 2) + j % 2 < n; }
  __device__ __forceinline__ bool Has(int o) const {
    return o == kEpilogueBias ? with_bias : o == kEpilogueResidual && residual != nullptr;
  }
  template <int kOperand>  // (the residual)
  __device__ __forceinline__ float Value(int h, int j) const {
    return ToFloat(residual[int64_t{rows[h]} * n + Col(j / 2) + j % 2]);
  }
  __device__ __forceinline__ float2 Bias(int u) const { return StagedPair(stage, bias0 + 4 * u); }
  __device__ __forceinline__ bool HasAux() const { return aux != nullptr; }
  template <int kWidth>
  __device__ __forceinline__ void StoreAux(const float (&v)[2][kWidth]) const {
#pragma unroll
    for (int u = 0; u < kWidth / 2; ++u)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (Inside(h, 2 * u)) {
          Sm90StorePair<TOut>(aux + int64_t{rows[h]} * n + Col(u), v[h][2 * u], v[h][2 * u + 1], pairs, Col(u) + 1 < n);
        }
      }
  }

  // y's pairs (v) to global memory where live and `direct`, and packed into words for a box.
  template <int kWidth>
  __device__ __forceinline__ void StoreOut(TOut* out, const float (&v)[2][kWidth], bool direct,
                                           uint32_t* words) const {
#pragma unroll
    for (int u = 0; u < kWidth / 2; ++u)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (direct && Inside(h, 2 * u)) {
          Sm90StorePair<TOut>(out + int64_t{rows[h]} * n + Col(u), v[h][2 * u], v[h][2 * u + 1], pairs, Col(u) + 1 < n);
        }
        words[2 * u + h] = PackPair<TOut>(v[h][2 * u], v[h][2 * u + 1]);
      }
  }
};

// A grouped source for this thread's rows of a consumer's 64 rows of item w.
template <class TOut>
__device__ __forceinline__ Sm90GroupedSource<TOut> Sm90GroupedRows(const Sm90GroupedStore& store, const GroupedWork& w,
                                                                   int first_row, uint32_t stage, bool with_bias) {
  const int lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32;
  Sm90GroupedSource<TOut> s{{}, stage, 0, with_bias, nullptr, nullptr, {}, 0, w.row_end, store.n, store.n % 2 == 0};
#pragma unroll
  for (int h = 0; h < 2; ++h) s.rows[h] = w.row0 + first_row + 16 * warp + lane / 4 + 8 * h;
  return s;
}

// The row modes' epilogue (GroupedProblem's, 16-bit outputs) on a consumer's 64 rows of an
// item: the steps of gemm/epilogue_steps.cuh with z = round(product) + bias[group],
// out = act(z) + residual, aux = z; rows of no group (the item past the groups, whose
// accumulators hold zeros) out = residual, aux = 0. One 64-column block per iteration
// of a runtime loop, so that the activation's code exists once (Sm90TakeColumns brings the
// block's 32 values out of the accumulators with compile-time indices). The bias comes
// from the item's stage (Sm90GroupedStageBias). A block of 64 rows that all lie in the item
// goes out through the box (one box is 64 columns); other rows, and aux, go straight to
// global memory, masked by row and column.
template <class P, class TOut>
__device__ __forceinline__ void Sm90GroupedEpilogue(const Sm90GroupedStore& store, const float (&acc)[1][P::kBN / 2],
                                                    const GroupedWork& w, int first_row, unsigned char* box, int wg) {
  static_assert(sizeof(TOut) == 2 && kSm90BoxCols<TOut> == 64, "the epilogue's blocks are its boxes");
  const int lane = threadIdx.x % 32;
  const bool in_group = w.group < store.groups;
  const bool boxed = store.tma_store && w.row0 + first_row + 64 <= w.row_end;
  const bool with_bias = store.bias != nullptr && in_group;
  const uint32_t stage = Sm90GroupedBiasStage<P>(box, wg);
  if (with_bias) Sm90GroupedStageBias<P, 1>(stage, {store.bias + int64_t{w.group} * store.n}, w.n0, store.n, wg);
  const EpilogueScalars scalars{1.f, 0.f, store.activation};
  Sm90GroupedSource<TOut> source = Sm90GroupedRows<TOut>(store, w, first_row, stage, with_bias);
  source.aux = static_cast<TOut*>(store.aux);
  source.residual = static_cast<const TOut*>(store.residual);
  const Sm90BoxWriter<TOut> writer(Sm90BoxWriter<TOut>::FragmentRow(0), Sm90BoxWriter<TOut>::FragmentRow(1));
#pragma unroll 1
  for (int b = 0; b < P::kBN / 64; ++b) {
    float v[2][16];
    Sm90TakeColumns<P, 64>(acc, b, v);
    source.bias0 = 32 * b + lane % 4;
    source.col0 = w.n0 + 64 * b + 2 * (lane % 4);
    ApplyEpilogue<TOut>(scalars, source, v, in_group);
    uint32_t words[16];
    source.StoreOut(static_cast<TOut*>(store.out), v, !boxed, words);
    if (boxed) Sm90GroupedStoreBox<TOut>(store, writer, words, w.row0 + first_row, w.n0 + 64 * b, box, wg);
  }
}

// kRowsGated's epilogue on a consumer's 64 rows of an item: the tile's first half of columns
// holds the gate's product and the second half the up weights' product of the same 128
// columns of D (a thread holds both: fragment columns j and j + kBN / 16). Per 64 columns
// of D (a runtime loop, as Sm90GroupedEpilogue), in two chunks of 32 so that the gate's and
// the up values fit beside the accumulators: the steps (gemm/epilogue_steps.cuh) give
// z = round(product) + bias for each and out = act(z_gate) * z_up; rows of no group 0.
// Aux and aux_up (the two z) go first, in a pass of their own (beside y's, they spilled).
template <class P, class TOut>
__device__ __forceinline__ void Sm90GroupedGluEpilogue(const Sm90GroupedStore& store,
                                                       const float (&acc)[1][P::kBN / 2], const GroupedWork& w,
                                                       int first_row, unsigned char* box, int wg) {
  static_assert(sizeof(TOut) == 2 && kSm90BoxCols<TOut> == 64, "the epilogue's blocks are its boxes");
  const uint32_t stage = Sm90GroupedBiasStage<P>(box, wg);
  constexpr int kHalfChunks = P::kBN / 64;  // 32-column chunks per half of the tile
  const int lane = threadIdx.x % 32;
  const bool in_group = w.group < store.groups;
  const bool boxed = store.tma_store && w.row0 + first_row + 64 <= w.row_end;
  const int64_t bias_row = int64_t{w.group} * store.n;
  const bool with_bias = (store.bias != nullptr || store.bias_up != nullptr) && in_group;
  if (with_bias) {
    const float* gate = store.bias != nullptr ? store.bias + bias_row : nullptr;
    const float* up = store.bias_up != nullptr ? store.bias_up + bias_row : nullptr;
    Sm90GroupedStageBias<P, 2>(stage, {gate, up}, w.n0, store.n, wg);
  }
  const EpilogueScalars scalars{1.f, 0.f, store.activation};
  Sm90GroupedSource<TOut> source = Sm90GroupedRows<TOut>(store, w, first_row, stage, with_bias);
  // Chunk c (of the 32 columns of D from w.n0 + 32 c) of `part` (0: the gate's, 1: the up
  // weights' product and bias).
  auto aim = [&](int c, int part) {
    source.bias0 = P::kBN / 4 * part + 16 * c + lane % 4;
    source.col0 = w.n0 + 32 * c + 2 * (lane % 4);
  };
  if (store.aux != nullptr) {  // first the two z, one chunk at a time
#pragma unroll 1
    for (int c = 0; c < 2 * kHalfChunks; ++c) {
      float v[2][8];
      Sm90TakeColumns<P, 32>(acc, c, v);
      const bool up = c >= kHalfChunks;
      aim(up ? c - kHalfChunks : c, up);
      source.aux = static_cast<TOut*>(up ? store.aux_up : store.aux);
      EpilogueLinear<TOut>(scalars, source, v, in_group);
      EpilogueAux(source, v);
    }
    source.aux = nullptr;
  }
  const Sm90BoxWriter<TOut> writer(Sm90BoxWriter<TOut>::FragmentRow(0), Sm90BoxWriter<TOut>::FragmentRow(1));
#pragma unroll 1
  for (int b = 0; b < kHalfChunks / 2; ++b) {  // 64 columns of D: one box
    uint32_t words[16];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int c = 2 * b + half;
      float gate[2][8], up[2][8];
      Sm90TakeColumns<P, 32>(acc, c, gate);
      Sm90TakeColumns<P, 32>(acc, c + kHalfChunks, up);
      aim(c, 0);
      EpilogueLinear<TOut>(scalars, source, gate, in_group);
      aim(c, 1);
      EpilogueLinear<TOut>(scalars, source, up, in_group);
      EpilogueActivation<TOut>(scalars, gate, in_group);
      EpilogueGate(gate, up);
      source.StoreOut(static_cast<TOut*>(store.out), gate, !boxed, words + 8 * half);
    }
    if (boxed) Sm90GroupedStoreBox<TOut>(store, writer, words, w.row0 + first_row, w.n0 + 64 * b, box, wg);
  }
}

// A consumer's 64 rows of item w once multiplied (acc: zeros for an item of no k-tiles):
// the gated or the row modes' epilogue; else through the box when all 64 rows lie inside
// the item, or straight to global memory, masked by row and column.
template <class P, class TOut, GroupedMode kMode>
__device__ __forceinline__ void Sm90GroupedStoreItem(const Sm90GroupedStore& store, const float (&acc)[1][P::kBN / 2],
                                                     const GroupedWork& w, int first_row, unsigned char* box, int wg) {
  constexpr bool kContraction = kMode == GroupedMode::kContraction;
  if constexpr (kMode == GroupedMode::kRowsGated) {
    Sm90GroupedGluEpilogue<P, TOut>(store, acc, w, first_row, box, wg);
    return;
  } else if constexpr (!kContraction && sizeof(TOut) == 2) {
    if (store.epilogue) {
      Sm90GroupedEpilogue<P, TOut>(store, acc, w, first_row, box, wg);
      return;
    }
  }
  if (store.tma_store && w.row0 + first_row + 64 <= w.row_end) {
    const int32_t d_row = (kContraction ? w.group * store.k : 0) + w.row0 + first_row;
    Sm90GroupedStoreBoxes<P, TOut>(store, acc, d_row, w.n0, box, wg);
    return;
  }
  // acc[4 j + 2 h + e]: row 16 warp + lane / 4 + 8 h, column 8 j + 2 (lane % 4) + e.
  const int lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32;
  TOut* out = static_cast<TOut*>(store.out);
  if constexpr (kContraction) out += int64_t{w.group} * store.k * store.n;
  const bool pairs = store.n % 2 == 0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int32_t row = w.row0 + first_row + 16 * warp + lane / 4 + 8 * h;
    if (row >= w.row_end) continue;
    TOut* out_row = out + int64_t{row} * store.n;
#pragma unroll
    for (int j = 0; j < P::kBN / 8; ++j) {
      const int32_t col = w.n0 + 8 * j + 2 * (lane % 4);
      if (col < store.n) {
        Sm90StorePair<TOut>(out_row + col, acc[0][4 * j + 2 * h], acc[0][4 * j + 2 * h + 1], pairs, col + 1 < store.n);
      }
    }
  }
}

#endif  // JG_SM90_ENABLED

}  // namespace jaxgemm
