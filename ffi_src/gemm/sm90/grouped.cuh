// The grouped (ragged) Hopper GEMM: the cooperative sm90 kernel's roles (a producer thread
// streaming TMA k-tiles into a ring of stages, two consumer warpgroups multiplying with
// wgmma) over work items that the groups define, read from device memory by every block.
//   Row modes (GroupedMode::kRows, kRowsRhsT): an item is a tile of one group's rows of D;
//   a tile that runs past its group's last row still loads and multiplies those rows (the
//   next group's) but stores none of them. Rows past the groups form one more group, of
//   zero k-tiles, whose tiles store zeros.
//   Contraction mode (kContraction, the weight gradient): an item is a tile of one group's
//   (k, n) product, its k-loop over the group's rows; the rows of the last k-tile past the
//   group are zeroed in shared memory before they are multiplied. Items differ in length
//   with the groups, so they come longest group first, and each block takes one per wave
//   in snake order (block b takes the b-th of even waves, the b-th from the end of odd
//   ones): the blocks' sums of k-tiles even out.
// Stores: a consumer's 64 rows that lie inside the item's rows go through shared memory, a
// box of 64 rows x 128 bytes at a time, each stored by TMA (which clips at n), while the
// next item's k-loop starts; rows cut by the item's end go from the accumulators straight to
// global memory, masked by row and column. The row modes' optional epilogue (bias per group,
// activation, residual, aux: GroupedProblem) is applied on the way (Sm90GroupedEpilogue).
//   Gated mode (kRowsGated, a gated linear unit): an item is 128 columns of D, its tile's
//   halves the gate's and the up weights' products of them (two tensor maps), combined by
//   Sm90GroupedGluEpilogue.
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/activation.h"
#include "common/device_numeric.cuh"
#include "common/ptx_sm90.cuh"
#include "gemm/sm90/grouped.h"
#include "gemm/sm90/grouped_items.h"
#include "gemm/sm90/epilogue.cuh"
#include "gemm/sm90/mainloop.cuh"
#include "gemm/sm90/policy.cuh"

namespace jaxgemm {

// Everything a block needs; the tensor maps are A's and B's as the k-loop reads them
// (row modes: A = lhs (m, k), B = rhs (g, k, n) or (g, n, k); contraction: A = lhs (m, k)
// read MN-major, B = rhs (m, n)).
struct Sm90GroupedArgs {
  CUtensorMap a, b;
  CUtensorMap b_up;  // kRowsGated: the up weights (b: the gate's)
  CUtensorMap d;  // D as (rows, n): row modes (m, n); contraction (groups x k, n)
  bool tma_store;  // d is valid (D's rows are 16-byte multiples)
  // 1, as a kernel parameter: the boxes' words are then products, not the accumulators'
  // own registers, which the float boxes' register pairs would otherwise move in a
  // divergent path, and ptxas would serialize every wgmma (C7520).
  float one;
  const int32_t* group_sizes;
  void* out;
  int32_t m, n;          // rows of lhs; columns of D
  int32_t k;             // row modes: the contraction; contraction mode: D's rows per group
  int32_t groups;
  bool b_per_group;      // B's map has a group dim (row modes with more than one group)
  // The epilogue (row modes, 16-bit outputs: GroupedProblem's; Sm90GroupedEpilogue).
  bool epilogue;
  Activation activation;
  const float* bias;
  const void* residual;
  void* aux;
  const float* bias_up;  // kRowsGated (Sm90GroupedGluEpilogue)
  void* aux_up;
};

// The groups' tables, in shared memory, and the items they define (grouped_items.h): items
// of kItemCols columns of D (kRowsGated: half the tile, whose two halves multiply the gate's
// and the up weights' same columns).
template <class P, bool kContraction, int kItemCols = P::kBN>
struct Sm90GroupTable {
  using Items = GroupedItemTable<P::kBM, kItemCols, P::kBK, kContraction>;
  int32_t* row_end;
  int32_t* item_end;

#if defined(JG_SM90_ENABLED)
  // Called by every thread of the block: fills the tables (warp 0 scans 32 groups a step).
  __device__ __forceinline__ void Build(const Sm90GroupedArgs& args, int32_t* sizes) {
    const Items shape(row_end, item_end, args.groups, args.m, args.n, args.k);
    for (int g = threadIdx.x; g < args.groups; g += blockDim.x) sizes[g] = max(args.group_sizes[g], 0);
    __syncthreads();
    if (threadIdx.x < 32) {
      const int lane = threadIdx.x;
      int64_t rows_before = 0;
      int32_t end_before = 0, items_before = 0;
      for (int base = 0; base <= args.groups; base += 32) {
        const int g = base + lane;
        int64_t rows = g < args.groups ? sizes[g] : 0;
#pragma unroll
        for (int d = 1; d < 32; d *= 2) {
          const int64_t up = __shfl_up_sync(0xffffffffu, rows, d);
          if (lane >= d) rows += up;
        }
        rows += rows_before;
        const int32_t end = g >= args.groups ? args.m : static_cast<int32_t>(rows < args.m ? rows : int64_t{args.m});
        int32_t begin = __shfl_up_sync(0xffffffffu, end, 1);
        if (lane == 0) begin = end_before;
        int32_t items = 0;
        if (!kContraction && g <= args.groups) items = shape.GroupItems(end - begin);
#pragma unroll
        for (int d = 1; d < 32; d *= 2) {
          const int32_t up = __shfl_up_sync(0xffffffffu, items, d);
          if (lane >= d) items += up;
        }
        items += items_before;
        if (g <= args.groups) {
          row_end[g] = end;
          if (!kContraction) item_end[g] = items;
        }
        rows_before = __shfl_sync(0xffffffffu, rows, 31);
        end_before = __shfl_sync(0xffffffffu, end, 31);
        items_before = __shfl_sync(0xffffffffu, items, 31);
      }
    }
    __syncthreads();
    if constexpr (kContraction) Order(args, sizes);
  }

  // Contraction: item_end[r] = the group of rank r, by rows (clipped) longest first, ties
  // by index. Each thread ranks its groups against all (groups^2 / 384 compares: ~3000 at
  // 1024 groups, a few microseconds once per block).
  __device__ __forceinline__ void Order(const Sm90GroupedArgs& args, int32_t* rows) {
    for (int g = threadIdx.x; g < args.groups; g += blockDim.x) rows[g] = row_end[g] - (g == 0 ? 0 : row_end[g - 1]);
    __syncthreads();
    for (int g = threadIdx.x; g < args.groups; g += blockDim.x) {
      int rank = 0;
      for (int h = 0; h < args.groups; ++h) rank += rows[h] > rows[g] || (rows[h] == rows[g] && h < g);
      item_end[rank] = g;
    }
    __syncthreads();
  }

  __device__ __forceinline__ Items View(const Sm90GroupedArgs& args) const {
    return Items(row_end, item_end, args.groups, args.m, args.n, args.k);
  }

  // This block's j-th item (the contraction's waves in snake order).
  __device__ __forceinline__ int32_t Walk(int32_t j) const {
    return Items::Walk(j, blockIdx.x, gridDim.x, kContraction);
  }
#endif
};

#if defined(JG_SM90_ENABLED)

// The producer thread: every item's k-tiles into the ring.
template <class P, bool kTransA, bool kTransB, bool kGated, class Table>
__device__ __forceinline__ void Sm90GroupedProduce(const Sm90GroupedArgs& args, const Table& table,
                                                   unsigned char* tiles_a, unsigned char* tiles_b, uint64_t* full,
                                                   uint64_t* empty) {
  Sm90ProducerRing<P> ring(full, empty);
  const auto view = table.View(args);
  const int32_t items = view.Items();
  for (int32_t j = 0, t = table.Walk(0); t < items; t = table.Walk(++j)) {
    const GroupedWork w = view.Get(t);
    for (int kt = 0; kt < w.k_tiles; ++kt) {
      uint64_t* const bar = ring.Acquire(P::kStageBytes);  // out-of-bounds parts count, as zeros
      const int k0 = w.k_begin + kt * P::kBK;
      unsigned char* sa = tiles_a + ring.stage * P::kTileABytes;
      unsigned char* sb = tiles_b + ring.stage * P::kTileBBytes;
      if constexpr (!kTransA) {  // lhs rows: one box of kBM rows
        TmaLoad2d(sa, &args.a, bar, k0, w.row0);
      } else {  // lhs read (k, m): 64-wide blocks of D's rows
#pragma unroll
        for (int j = 0; j < P::kBM / 64; ++j) TmaLoad2d(sa + j * P::kMnBlockTileBytes, &args.a, bar, w.row0 + 64 * j, k0);
      }
      auto load_b = [&](const CUtensorMap* map, void* dst, int c0, int c1) {
        if (args.b_per_group) {
          TmaLoad3d(dst, map, bar, c0, c1, w.group);
        } else {
          TmaLoad2d(dst, map, bar, c0, c1);
        }
      };
      if constexpr (kTransB) {  // rhs (g, n, k): a box of kBN rows
        load_b(&args.b, sb, k0, w.n0);
      } else {  // (k, n) rows: 64-wide n blocks; kGated: the gate's, then the up weights' same ones
        constexpr int kHalf = P::kBN / 128;
#pragma unroll
        for (int j = 0; j < P::kBN / 64; ++j) {
          const bool up = kGated && j >= kHalf;
          load_b(up ? &args.b_up : &args.b, sb + j * P::kMnBlockBytes, w.n0 + 64 * (up ? j - kHalf : j), k0);
        }
      }
      ring.Advance();
    }
  }
}

// Rows [valid, kBK) of this consumer's 64-wide block of an MN-major A stage to zero (rows
// are whole 128-byte lines, which the swizzle only permutes within), made visible to
// wgmma before any of the warpgroup's threads multiplies.
template <class P>
__device__ __forceinline__ void Sm90ZeroRowsPast(unsigned char* block, int valid, int wg) {
  const int tid = threadIdx.x % 128;
  for (int i = valid * 8 + tid; i < P::kBK * 8; i += 128) {
    reinterpret_cast<uint4*>(block)[i] = make_uint4(0, 0, 0, 0);
  }
  FenceProxyAsyncShared();
  NamedBarrierSync(1 + wg, 128);
}

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
__device__ __forceinline__ void Sm90GroupedStoreBox(const Sm90GroupedArgs& args, const Sm90BoxWriter<TOut>& writer,
                                                    const uint32_t (&words)[16], int32_t row, int32_t col,
                                                    unsigned char* box, int wg) {
  const int tid = threadIdx.x % 128;
  if (tid == 0) BulkWaitGroupRead<0>();
  NamedBarrierSync(1 + wg, 128);
  writer.Write(SharedAddress(box), words);
  FenceProxyAsyncShared();
  NamedBarrierSync(1 + wg, 128);
  if (tid == 0) {
    TmaStore2d(&args.d, box, col, row);
    BulkCommitGroup();
  }
}

// A consumer's 64 rows of a tile, box after box (Sm90PackBox's words), at (col0, row).
template <class P, class TOut>
__device__ __forceinline__ void Sm90GroupedStoreBoxes(const Sm90GroupedArgs& args,
                                                      const float (&acc)[1][P::kBN / 2], bool zeros, int32_t row,
                                                      int32_t col0, unsigned char* box, int wg) {
  const Sm90BoxWriter<TOut> writer(Sm90BoxWriter<TOut>::FragmentRow(0), Sm90BoxWriter<TOut>::FragmentRow(1));
#pragma unroll
  for (int c = 0; c < P::kBN / kSm90BoxCols<TOut>; ++c) {
    uint32_t words[16];
    Sm90PackBox<P, TOut>(acc, c, args.one, words);
    if (zeros) {  // an item of no k-tiles (its accumulators hold the last item's sums)
#pragma unroll
      for (int i = 0; i < 16; ++i) words[i] = 0;
    }
    Sm90GroupedStoreBox<TOut>(args, writer, words, row, col0 + kSm90BoxCols<TOut> * c, box, wg);
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

// Two adjacent 16-bit values of a row (0 past n) as one word: one load where `pairs`.
template <class TOut>
__device__ __forceinline__ uint32_t LoadPairWord(const TOut* row, int32_t col, int32_t n, bool pairs) {
  if (pairs && col + 1 < n) return __ldg(reinterpret_cast<const unsigned int*>(row + col));
  const float2 x = LoadBiasPair(row, col, n, false);
  return PackPair<TOut>(x.x, x.y);
}

// The row modes' epilogue (GroupedProblem's, 16-bit outputs) on a consumer's 64 rows of an
// item: z = round(product) + bias[group], out = act(z) + residual, aux = round(z); rows of
// no group (the item past the groups, whose accumulators hold stale sums) out = residual,
// aux = 0. One 64-column block per iteration of a runtime loop, so that the activation's
// code exists once; Sm90TakeBlock brings the block's 32 values out of the accumulators with
// compile-time indices and ActivateAll applies the dense epilogue's activations (hardware
// tanh / exp for 16-bit outputs), as the dense kernel's fused epilogue does. The bias comes
// from the item's stage (Sm90GroupedStageBias); the residual's words are loaded four column
// pairs at a time before the first is used (two round trips a block; all sixteen at once
// spilled). A block of 64 rows that all lie in the item goes out through the box (one box
// is 64 columns); other rows, and aux, go straight to global memory, masked by row and
// column.
template <class P, class TOut>
__device__ __forceinline__ void Sm90GroupedEpilogue(const Sm90GroupedArgs& args, const float (&acc)[1][P::kBN / 2],
                                                    const GroupedWork& w, int first_row, unsigned char* box, int wg) {
  static_assert(sizeof(TOut) == 2 && kSm90BoxCols<TOut> == 64, "the epilogue's blocks are its boxes");
  const int lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32;
  const bool in_group = w.group < args.groups;
  const bool boxed = args.tma_store && w.row0 + first_row + 64 <= w.row_end;
  const bool pairs = args.n % 2 == 0;
  const bool with_bias = args.bias != nullptr && in_group;
  const uint32_t stage = Sm90GroupedBiasStage<P>(box, wg);
  if (with_bias) Sm90GroupedStageBias<P, 1>(stage, {args.bias + int64_t{w.group} * args.n}, w.n0, args.n, wg);
  const auto* residual = static_cast<const TOut*>(args.residual);
  auto* out = static_cast<TOut*>(args.out);
  auto* aux = static_cast<TOut*>(args.aux);
  const Sm90BoxWriter<TOut> writer(Sm90BoxWriter<TOut>::FragmentRow(0), Sm90BoxWriter<TOut>::FragmentRow(1));
  int32_t rows[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) rows[h] = w.row0 + first_row + 16 * warp + lane / 4 + 8 * h;
  // v[h][2 u + x]: row rows[h], column col(u) + x of the block.
  auto col = [&](int b, int u) { return w.n0 + 64 * b + 8 * u + 2 * (lane % 4); };
  auto live = [&](int b, int u, int h) { return rows[h] < w.row_end && col(b, u) < args.n; };
#pragma unroll 1
  for (int b = 0; b < P::kBN / 64; ++b) {
    float v[2][16];
    Sm90TakeBlock<P>(acc, b, v);
#pragma unroll
    for (int u = 0; u < 8; ++u) {  // v = z (0 on rows of no group), stored as aux
      const float2 add = with_bias ? StagedPair(stage, 32 * b + 4 * u + lane % 4) : make_float2(0.f, 0.f);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        v[h][2 * u] = in_group ? ToFloat(FromFloat<TOut>(v[h][2 * u])) + add.x : 0.f;
        v[h][2 * u + 1] = in_group ? ToFloat(FromFloat<TOut>(v[h][2 * u + 1])) + add.y : 0.f;
        // (written out, not live(): ptxas then spilled the row kernels)
        if (aux != nullptr && rows[h] < w.row_end && col(b, u) < args.n) {
          Sm90StorePair<TOut>(aux + int64_t{rows[h]} * args.n + col(b, u), v[h][2 * u], v[h][2 * u + 1], pairs,
                              col(b, u) + 1 < args.n);
        }
      }
    }
    if (in_group) ActivateAll<true>(args.activation, v);
    uint32_t words[16];  // out's, where four column pairs' residual words came first
#pragma unroll
    for (int q = 0; q < 2; ++q) {
#pragma unroll
      for (int u = 4 * q; u < 4 * q + 4; ++u)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          words[2 * u + h] = residual != nullptr && live(b, u, h)
                                 ? LoadPairWord(residual + int64_t{rows[h]} * args.n, col(b, u), args.n, pairs)
                                 : 0u;
        }
#pragma unroll
      for (int u = 4 * q; u < 4 * q + 4; ++u)  // out = v + residual
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float2 y = make_float2(v[h][2 * u], v[h][2 * u + 1]);
          if (residual != nullptr) {
            TOut r[2];
            memcpy(r, &words[2 * u + h], 4);
            y = make_float2(y.x + ToFloat(r[0]), y.y + ToFloat(r[1]));
          }
          if (!boxed && live(b, u, h)) {
            Sm90StorePair<TOut>(out + int64_t{rows[h]} * args.n + col(b, u), y.x, y.y, pairs, col(b, u) + 1 < args.n);
          }
          words[2 * u + h] = PackPair<TOut>(y.x, y.y);
        }
    }
    if (boxed) Sm90GroupedStoreBox<TOut>(args, writer, words, w.row0 + first_row, w.n0 + 64 * b, box, wg);
  }
}

// v = the 16 values of 32-column chunk c of this thread's fragments (one m64 block):
// v[h][2 u + x] is row 16 warp + lane / 4 + 8 h, column 32 c + 8 u + 2 (lane % 4) + x. As
// Sm90TakeBlock (epilogue.cuh), for a runtime c: an if-else chain of compile-time indices
// ending in an unconditional else, the copies volatile moves that stay in their branches.
template <class P, int kC = 0>
__device__ __forceinline__ void Sm90TakeChunk(const float (&acc)[1][P::kBN / 2], int c, float (&v)[2][8]) {
  auto take = [&] {
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int x = 0; x < 2; ++x) {
          asm volatile("mov.b32 %0, %1;" : "=f"(v[h][2 * u + x]) : "f"(acc[0][4 * (4 * kC + u) + 2 * h + x]));
        }
  };
  if constexpr (kC == P::kBN / 32 - 1) {
    take();
  } else if (c == kC) {
    take();
  } else {
    Sm90TakeChunk<P, kC + 1>(acc, c, v);
  }
}

// kRowsGated's epilogue on a consumer's 64 rows of an item: the tile's first half of columns
// holds the gate's product and the second half the up weights' product of the same 128
// columns of D (a thread holds both: fragment columns j and j + kBN / 16). Per 64 columns
// of D (a runtime loop, as Sm90GroupedEpilogue), in two chunks of 32 so that the gate's and
// the up values fit beside the accumulators: z = round(product) + bias for each, out =
// act(z_gate) * z_up; rows of no group 0. Aux and aux_up (the two z) go first, in a pass of
// their own.
template <class P, class TOut>
__device__ __forceinline__ void Sm90GroupedGluEpilogue(const Sm90GroupedArgs& args,
                                                       const float (&acc)[1][P::kBN / 2], const GroupedWork& w,
                                                       int first_row, unsigned char* box, int wg) {
  static_assert(sizeof(TOut) == 2 && kSm90BoxCols<TOut> == 64, "the epilogue's blocks are its boxes");
  const uint32_t stage = Sm90GroupedBiasStage<P>(box, wg);
  constexpr int kHalfChunks = P::kBN / 64;  // 32-column chunks per half of the tile
  const int lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32;
  const bool in_group = w.group < args.groups;
  const bool boxed = args.tma_store && w.row0 + first_row + 64 <= w.row_end;
  const bool pairs = args.n % 2 == 0;
  const int64_t bias_row = int64_t{w.group} * args.n;
  const bool with_bias = (args.bias != nullptr || args.bias_up != nullptr) && in_group;
  if (with_bias) {
    const float* gate = args.bias != nullptr ? args.bias + bias_row : nullptr;
    const float* up = args.bias_up != nullptr ? args.bias_up + bias_row : nullptr;
    Sm90GroupedStageBias<P, 2>(stage, {gate, up}, w.n0, args.n, wg);
  }
  auto* out = static_cast<TOut*>(args.out);
  const Sm90BoxWriter<TOut> writer(Sm90BoxWriter<TOut>::FragmentRow(0), Sm90BoxWriter<TOut>::FragmentRow(1));
  int32_t rows[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) rows[h] = w.row0 + first_row + 16 * warp + lane / 4 + 8 * h;
  // Column of value pair u of chunk c (of D's columns, from the item's first).
  auto col = [&](int c, int u) { return w.n0 + 32 * c + 8 * u + 2 * (lane % 4); };
  auto live = [&](int c, int u, int h) { return rows[h] < w.row_end && col(c, u) < args.n; };
  // v = round(v) + the stage's bias of `part` (0: the gate's, 1: the up weights'; 0 on rows
  // of no group), stored to `to` (an aux) where given.
  auto add_bias = [&](float (&v)[2][8], int c, int part, void* to) {
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int32_t j = col(c, u);
      const float2 add = with_bias ? StagedPair(stage, (P::kBN / 2 * part + j - w.n0) / 2) : make_float2(0.f, 0.f);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        v[h][2 * u] = in_group ? ToFloat(FromFloat<TOut>(v[h][2 * u])) + add.x : 0.f;
        v[h][2 * u + 1] = in_group ? ToFloat(FromFloat<TOut>(v[h][2 * u + 1])) + add.y : 0.f;
        if (to != nullptr && live(c, u, h)) {
          Sm90StorePair<TOut>(static_cast<TOut*>(to) + int64_t{rows[h]} * args.n + j, v[h][2 * u], v[h][2 * u + 1],
                              pairs, j + 1 < args.n);
        }
      }
    }
  };
  if (args.aux != nullptr) {  // first the two z, one chunk at a time (beside y's, they spilled)
#pragma unroll 1
    for (int c = 0; c < 2 * kHalfChunks; ++c) {
      float v[2][8];
      Sm90TakeChunk<P>(acc, c, v);
      const bool up = c >= kHalfChunks;
      add_bias(v, up ? c - kHalfChunks : c, up, up ? args.aux_up : args.aux);
    }
  }
#pragma unroll 1
  for (int b = 0; b < kHalfChunks / 2; ++b) {  // 64 columns of D: one box
    uint32_t words[16];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int c = 2 * b + half;
      float gate[2][8], up[2][8];
      Sm90TakeChunk<P>(acc, c, gate);
      Sm90TakeChunk<P>(acc, c + kHalfChunks, up);
      add_bias(gate, c, 0, nullptr);
      add_bias(up, c, 1, nullptr);
      if (in_group) ActivateAll<true>(args.activation, gate);
#pragma unroll
      for (int u = 0; u < 4; ++u) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float y0 = gate[h][2 * u] * up[h][2 * u], y1 = gate[h][2 * u + 1] * up[h][2 * u + 1];
          const int32_t j = col(c, u);
          if (!boxed && live(c, u, h)) {
            Sm90StorePair<TOut>(out + int64_t{rows[h]} * args.n + j, y0, y1, pairs, j + 1 < args.n);
          }
          words[2 * (4 * half + u) + h] = PackPair<TOut>(y0, y1);
        }
      }
    }
    if (boxed) Sm90GroupedStoreBox<TOut>(args, writer, words, w.row0 + first_row, w.n0 + 64 * b, box, wg);
  }
}

// Consumer warpgroup wg: rows [64 wg, 64 wg + 64) of every item's tile.
template <class P, class TIn, class TOut, bool kTransA, bool kTransB, bool kContraction, bool kGated, class Table>
__device__ __forceinline__ void Sm90GroupedConsume(const Sm90GroupedArgs& args, const Table& table, int wg,
                                                   unsigned char* tiles_a, unsigned char* tiles_b, uint64_t* full,
                                                   uint64_t* empty, unsigned char* box) {
  // The descriptors of Sm90ConsumerMma (mainloop.cuh): K-major steps 32 B, MN-major two 8-row groups.
  constexpr uint32_t kStepA = kTransA ? 2048 : 32, kStepB = kTransB ? 32 : 2048;
  constexpr uint32_t kLeadA = kTransA ? P::kMnBlockBytes : 16, kLeadB = kTransB ? 16 : P::kMnBlockBytes;
  const int first_row = 64 * wg, lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32;
  unsigned char* own_a = tiles_a + first_row * P::kRowBytes;
  const uint32_t desc_a0 = uint32_t(SmemDescriptorSw128(SharedAddress(own_a), kLeadA, 1024));
  const uint32_t desc_b0 = uint32_t(SmemDescriptorSw128(SharedAddress(tiles_b), kLeadB, 1024));
  constexpr uint32_t kDescHi = uint32_t(SmemDescriptorSw128(0, 0, 1024) >> 32);
  auto descriptor = [](uint32_t lo) { return (uint64_t(kDescHi) << 32) | lo; };
  int stage = 0;
  uint32_t phase = 0;
  float acc[1][P::kBN / 2];  // (Sm90PackBox's shape: one m64 block)
  const auto view = table.View(args);
  const int32_t items = view.Items();
  for (int32_t j = 0, t = table.Walk(0); t < items; t = table.Walk(++j)) {
    const GroupedWork w = view.Get(t);
    int previous = -1;
    for (int kt = 0; kt < w.k_tiles; ++kt) {
      MbarrierWait(&full[stage], phase);
      if constexpr (kContraction) {
        const int valid = w.k_end - (w.k_begin + kt * P::kBK);
        if (valid < P::kBK) Sm90ZeroRowsPast<P>(own_a + stage * P::kTileABytes, valid, wg);
      }
      const uint32_t desc_a = desc_a0 + stage * (P::kTileABytes / 16);
      const uint32_t desc_b = desc_b0 + stage * (P::kTileBBytes / 16);
      WgmmaFence();
#pragma unroll
      for (int kk = 0; kk < P::kKSteps; ++kk) {
        Wgmma<TIn, P::kBN, kTransA, !kTransB>(acc[0], descriptor(desc_a + kk * kStepA / 16),
                                              descriptor(desc_b + kk * kStepB / 16), (kt | kk) != 0);
      }
      WgmmaCommitGroup();
      WgmmaWaitGroup<1>();  // the previous k-tile's wgmmas are done: its stage is free
      if (previous >= 0 && lane == 0) MbarrierArrive(&empty[previous]);
      previous = stage;
      if (++stage == P::kStages) {
        stage = 0;
        phase ^= 1;
      }
    }
    WgmmaWaitGroup<0>();
    if (previous >= 0 && lane == 0) MbarrierArrive(&empty[previous]);

    if constexpr (kGated) {
      Sm90GroupedGluEpilogue<P, TOut>(args, acc, w, first_row, box, wg);
      continue;
    } else if constexpr (!kContraction && sizeof(TOut) == 2) {
      if (args.epilogue) {
        Sm90GroupedEpilogue<P, TOut>(args, acc, w, first_row, box, wg);
        continue;
      }
    }
    if (args.tma_store && w.row0 + first_row + 64 <= w.row_end) {
      const int32_t d_row = (kContraction ? w.group * args.k : 0) + w.row0 + first_row;
      Sm90GroupedStoreBoxes<P, TOut>(args, acc, w.k_tiles == 0, d_row, w.n0, box, wg);
      continue;
    }
    // acc[4 j + 2 h + e]: row 16 warp + lane / 4 + 8 h, column 8 j + 2 (lane % 4) + e.
    TOut* out = static_cast<TOut*>(args.out);
    if constexpr (kContraction) out += int64_t{w.group} * args.k * args.n;
    const bool pairs = args.n % 2 == 0;
    const bool live = w.k_tiles > 0;  // else zeros (acc holds the last item's sums; it is never written here)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int32_t row = w.row0 + first_row + 16 * warp + lane / 4 + 8 * h;
      if (row >= w.row_end) continue;
      TOut* out_row = out + int64_t{row} * args.n;
#pragma unroll
      for (int j = 0; j < P::kBN / 8; ++j) {
        const int32_t col = w.n0 + 8 * j + 2 * (lane % 4);
        if (col < args.n) {
          Sm90StorePair<TOut>(out_row + col, live ? acc[0][4 * j + 2 * h] : 0.f,
                              live ? acc[0][4 * j + 2 * h + 1] : 0.f, pairs, col + 1 < args.n);
        }
      }
    }
  }
  if (threadIdx.x % 128 == 0) BulkWaitGroupRead<0>();  // the box outlives its last store's read
}

#endif  // JG_SM90_ENABLED

template <class P>
struct Sm90GroupedLayout {
  static constexpr int kTableBytes = 2 * (kMaxGroupedGroups + 1) * 4 + kMaxGroupedGroups * 4;
  static constexpr int kBarrierBytes = 2 * P::kStages * 8;
  static constexpr int kBoxBytes = P::kConsumers * P::kOutBoxBytes;  // one output box per consumer
  static constexpr int kBiasStageBytes = P::kConsumers * P::kBN * 4;  // an item's bias per consumer
  static constexpr int kSmemBytes =
      P::kStages * P::kStageBytes + kBoxBytes + kBiasStageBytes + kBarrierBytes + kTableBytes + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "over the shared memory of one block");
};

template <class P, class TIn, class TOut, bool kTransA, bool kTransB, bool kContraction, bool kGated>
__global__ void __launch_bounds__(P::kThreads, 1) Sm90GroupedKernel(const __grid_constant__ Sm90GroupedArgs args) {
#if defined(JG_SM90_ENABLED)
  static_assert(!P::kPingpong && P::kConsumers == 2 && !P::kSwapped && P::kClusterM == 1,
                "grouped: the cooperative two-consumer schedule, one block");
  extern __shared__ unsigned char smem_raw[];
  unsigned char* tiles_a = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  unsigned char* tiles_b = tiles_a + P::kStages * P::kTileABytes;
  unsigned char* boxes = tiles_b + P::kStages * P::kTileBBytes;  // 1 KB aligned, as the swizzle needs
  using Layout = Sm90GroupedLayout<P>;
  // The boxes, then the consumers' bias stages (Sm90GroupedBiasStage), then the barriers.
  uint64_t* full = reinterpret_cast<uint64_t*>(boxes + Layout::kBoxBytes + Layout::kBiasStageBytes);
  uint64_t* empty = full + P::kStages;
  int32_t* row_end = reinterpret_cast<int32_t*>(empty + P::kStages);
  int32_t* item_end = row_end + kMaxGroupedGroups + 1;
  int32_t* sizes = item_end + kMaxGroupedGroups + 1;

  if (threadIdx.x == 0) {
    PrefetchTensorMap(&args.a);
    PrefetchTensorMap(&args.b);
    if (args.tma_store) PrefetchTensorMap(&args.d);
    for (int s = 0; s < P::kStages; ++s) {
      MbarrierInit(&full[s], 1);
      MbarrierInit(&empty[s], 4 * P::kConsumers);  // one arrival per consumer warp
    }
    FenceMbarrierInit();
  }
  Sm90GroupTable<P, kContraction, kGated ? P::kBN / 2 : P::kBN> table{row_end, item_end};
  table.Build(args, sizes);  // (its __syncthreads also publishes the barriers)

  if (threadIdx.x < 128) {
    SetMaxRegistersDecrease<P::kProducerRegisters>();
    if (threadIdx.x == 0) Sm90GroupedProduce<P, kTransA, kTransB, kGated>(args, table, tiles_a, tiles_b, full, empty);
  } else {
    SetMaxRegistersIncrease<P::kConsumerRegisters>();
    const int wg = threadIdx.x / 128 - 1;
    Sm90GroupedConsume<P, TIn, TOut, kTransA, kTransB, kContraction, kGated>(args, table, wg, tiles_a, tiles_b, full,
                                                                              empty, boxes + wg * P::kOutBoxBytes);
  }
#endif
}

}  // namespace jaxgemm
