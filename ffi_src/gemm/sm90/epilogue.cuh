// The sm90 kernel's TMA-store epilogues, for epilogues that read no C and no residual: each
// consumer writes its tile's blocks of D (and of Aux) to shared memory in the 128-byte-
// swizzled layout of a tensor map, and one thread (of the consumer, or of its store warp:
// Sm90HandedStores) stores each block with TMA. A block (a box) is 64 rows of 128 bytes:
// 64 x 64 16-bit or 64 x 32 float values. D = alpha * acc, any output type: Sm90StoreTile, or
// Sm90PackBox + Sm90WriteBoxWords (handed stores); bias, activation, Aux (16-bit outputs):
// Sm90StoreTileFused. A consumer picks one per tile through Sm90TmaEpilogue (Sm90Consume,
// sm90/kernel.cuh); MakeSm90Store decides on the host whether a problem can take them and
// encodes the maps.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <utility>

#include "common/activation.h"
#include "common/device_numeric.cuh"
#include "common/ptx_sm90.cuh"
#include "gemm/epilogue.cuh"
#include "gemm/problem.h"
#include "gemm/sm90/launch.h"
#include "gemm/sm90/mainloop.cuh"
#include "gemm/sm90/scheduler.cuh"
#include "gemm/sm90/tensor_map.h"
#include "gemm/sm90/timeline.cuh"

namespace jaxgemm {

// Columns of an output box: 128 bytes of TOut.
template <class TOut>
inline constexpr int kSm90BoxCols = 128 / static_cast<int>(sizeof(TOut));

// A launch's TMA-store parameters (MakeSm90Store). `enabled`: the problem takes a TMA-store
// epilogue instead of the general one; `fused`: alpha, bias, activation and Aux are applied
// to the fragments (Sm90StoreTileFused), otherwise D is alpha * acc (Sm90StoreTile).
// `slabs` > 1: 3-D maps (batches, splits).
struct Sm90Store {
  CUtensorMap d, aux;  // aux: used when with_aux
  int enabled, slabs;
  int fused, with_aux;
  int transposed;  // D holds the product transposed (GemmProblem::transposed_d; plain only)
  // The fused path's parameters (copies of GemmProblem's: see Sm90StoreTileFused).
  const void* bias;
  int64_t bias_stride;  // elements between the bias vectors of consecutive batch indices
  int64_t n;
  float alpha;
  Activation activation;
};

#if defined(JG_SM90_ENABLED)

// One 64 x 64 block of a consumer's tile into a box in the 128 B-swizzled layout of the
// output tensor map (16-byte unit u of row r at u ^ (r % 8)). A warp writes its 16 rows with
// four stmatrix.x4, each two units wide (matrix q: rows 8 (q % 2) ..., unit u + q / 2), so
// the 8 rows of a matrix land in distinct banks. word(h, u): this thread's two rounded
// values in unit u of row 16 warp + lane / 4 + 8 h (columns 8 u + 2 (lane % 4), + 1: the
// accumulator fragment layout). `row_address`: the box's address plus this lane's row,
// 16 warp + 8 (q % 2) + lane % 8; `unit_xor`: (q / 2 ^ lane % 8) * 16, so that unit
// u + q / 2 of that row is at byte (16 u) ^ unit_xor for even u.
template <class Word>
__device__ __forceinline__ void Sm90WriteBox(uint32_t row_address, uint32_t unit_xor, Word word) {
#pragma unroll
  for (int u = 0; u < 8; u += 2) {
    StoreMatrixX4(row_address + ((u * 16) ^ unit_xor), word(0, u), word(1, u), word(0, u + 1), word(1, u + 1));
  }
}

// A TMA store of a box at (col, row) of `map`, in slab `slab` when the maps are 3-D.
__device__ __forceinline__ void Sm90TmaStoreBox(const Sm90Store& store, const CUtensorMap* map, const void* box,
                                                int col, int row, int slab) {
  if (store.slabs > 1) {
    TmaStore3d(map, box, col, row, slab);
  } else {
    TmaStore2d(map, box, col, row);
  }
}

// Thread `thread`'s row offset in a box and unit XOR for Sm90WriteBox.
__device__ __forceinline__ void Sm90BoxLane(unsigned thread, uint32_t* row_offset, uint32_t* unit_xor) {
  const int lane = thread % 32, warp = (thread % 128) / 32, q = lane / 8;
  *row_offset = (warp * 16 + 8 * (q % 2) + lane % 8) * 128;
  *unit_xor = ((q / 2) ^ (lane % 8)) * 16;
}

// Box c of a consumer's tile (row block c / (kBN / kSm90BoxCols), column block the rest),
// scaled by alpha, as this thread's 16 words. 16-bit: word 2 u + h holds the two rounded
// values of unit u (fragment column group 8 nb + u; see Sm90WriteBox). float: word
// 4 u + 2 h + x is column 8 u + 2 (lane % 4) + x of row 16 warp + lane / 4 + 8 h, i.e.
// accumulator 16 nb + (4 u + 2 h + x) of the fragments. The accumulators themselves stay
// unwritten: scaling them in place under a condition (alpha != 1) made ptxas serialize
// every wgmma of the float-output kernels (C7520, a compiler-inserted warpgroup arrive on a
// divergent path; tests/test_sm90_codegen.py).
template <class P, class TOut>
__device__ __forceinline__ void Sm90PackBox(const float (&acc)[P::kMmaM][P::kBN / 2], int c, float alpha,
                                            uint32_t (&words)[16]) {
  constexpr int kColBlocks = P::kBN / kSm90BoxCols<TOut>;
  const int mi = c / kColBlocks, nb = c % kColBlocks;
  if constexpr (sizeof(TOut) == 2) {
#pragma unroll
    for (int u = 0; u < 8; ++u)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int j = 4 * (8 * nb + u) + 2 * h;
        words[2 * u + h] = PackPair<TOut>(alpha * acc[mi][j], alpha * acc[mi][j + 1]);
      }
  } else {
#pragma unroll
    for (int i = 0; i < 16; ++i) words[i] = __float_as_uint(alpha * acc[mi][16 * nb + i]);
  }
}

// Where this thread writes Sm90PackBox's words in a box. 16-bit: stmatrix (Sm90WriteBox).
// float: the two adjacent columns of each word pair are 8 bytes of unit 2 u + (lane % 4) / 2;
// a warp's 8 rows then take 2 units each, every bank twice, the two wavefronts that 256
// bytes need. `row0` / `row1`: the tile rows of the h = 0 / h = 1 words, FragmentRow(h) or,
// for tf32 with register A, its permutation (Sm90RegisterAFragments); 16-bit boxes take the
// fragment rows (stmatrix's lanes) and ignore them.
template <class TOut>
struct Sm90BoxWriter {
  uint32_t base[2], unit_xor[2];  // 16-bit: Sm90BoxLane's, in [0]; float: per row

  __device__ __forceinline__ static int FragmentRow(int h) {
    return (threadIdx.x % 128) / 32 * 16 + threadIdx.x % 32 / 4 + 8 * h;
  }
  __device__ __forceinline__ Sm90BoxWriter(int row0, int row1) {
    if constexpr (sizeof(TOut) == 2) {
      Sm90BoxLane(threadIdx.x, &base[0], &unit_xor[0]);
    } else {
      const int lane = threadIdx.x % 32, rows[2] = {row0, row1};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        base[h] = rows[h] * 128 + 8 * (lane % 2);
        unit_xor[h] = ((lane % 4 / 2) ^ (rows[h] % 8)) * 16;  // unit 2 u + b at (32 u) ^ (16 (b ^ row % 8))
      }
    }
  }

  __device__ __forceinline__ void Write(uint32_t box, const uint32_t (&words)[16]) const {
    if constexpr (sizeof(TOut) == 2) {
      Sm90WriteBox(box + base[0], unit_xor[0], [&](int h, int u) { return words[2 * u + h]; });
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          StoreShared64(box + base[h] + ((32 * u) ^ unit_xor[h]), words[4 * u + 2 * h], words[4 * u + 2 * h + 1]);
        }
    }
  }
};

// Thread 0 of a consumer, before it writes box slot c % 2 for block c of a tile of kBlocks
// blocks: waits until the store that last read that slot is done with it. The slots
// alternate within a tile; with an odd count, block 0 takes the slot the previous tile's
// last block used, whose store is then the latest one (64 x 64 tiles: one block each).
template <int kBlocks>
__device__ __forceinline__ void Sm90WaitForSlot(int c) {
  if (kBlocks % 2 == 1 && c == 0) {
    BulkWaitGroupRead<0>();
  } else {
    BulkWaitGroupRead<1>();
  }
}

// The TMA-store epilogue of one consumer's tile, all in the consumer: each block goes to
// one of two 8 KB boxes, then thread 0 stores the box. The two boxes alternate, so writing
// one overlaps the other's store. For the schedules that do not hand their stores to a
// producer warp (Sm90WriteBoxWords): pingpong, whose consumers' epilogues overlap the
// other's mainloop, and 64 x 64 tiles (one 16-bit block per tile).
template <class P, class TOut>
__device__ __forceinline__ void Sm90StoreTile(const Sm90Store& store, const float (&acc)[P::kMmaM][P::kBN / 2],
                                              int64_t row0, int64_t col0, int64_t slab, float alpha, int wg,
                                              unsigned char* boxes, const Sm90BoxWriter<TOut>& writer) {
  const int tid = threadIdx.x % 128;
  constexpr int kColBlocks = P::kBN / kSm90BoxCols<TOut>, kBlocks = P::kMmaM * kColBlocks;
#pragma unroll
  for (int c = 0; c < kBlocks; ++c) {
    unsigned char* box = boxes + (c % 2) * P::kOutBoxBytes;
    uint32_t words[16];
    Sm90PackBox<P, TOut>(acc, c, alpha, words);
    if (tid == 0) Sm90WaitForSlot<kBlocks>(c);
    NamedBarrierSync(1 + wg, 128);
    writer.Write(SharedAddress(box), words);
    FenceProxyAsyncShared();
    NamedBarrierSync(1 + wg, 128);
    if (tid == 0) {
      Sm90TmaStoreBox(store, &store.d, box, static_cast<int>(col0) + kSm90BoxCols<TOut> * (c % kColBlocks),
                      static_cast<int>(row0) + 64 * (c / kColBlocks), static_cast<int>(slab));
      BulkCommitGroup();
    }
  }
}

// The TMA-store epilogues (plain, and fused: Sm90StoreTileFused) of the cooperative
// schedules, whose consumers finish a tile together, so that whatever their epilogue waits
// for leaves the tensor cores idle: the consumer only writes its boxes; warp 1 + wg of the
// producer warpgroup (Sm90StoreWarp, in sm90/kernel.cuh) issues the TMA stores and waits
// for their reads. Per consumer and box b, two named barriers of 128 + 32 threads:
// "written" (the consumer arrives, the store warp waits) and "free" (the store warp arrives
// once the box's store has read it; the consumer waits before writing the box again). One
// barrier per box and direction, so an arrival never runs a phase ahead of the matching
// wait. Needs an even number of blocks per tile (the boxes' roles repeat every tile).
template <class P, class TOut>
struct Sm90HandedStores {
  static constexpr int kBoxes = P::kMmaM * (P::kBN / kSm90BoxCols<TOut>);  // per consumer and tile
  static constexpr bool kUsed = !P::kPingpong && !P::kSwapped && kBoxes % 2 == 0;
  static constexpr int kThreads = 128 + 32;
  // Named barrier ids 4-15 (1-3 are the consumers' own, 1 + wg; 0 is __syncthreads).
  __device__ __forceinline__ static int Written(int wg, int box) { return 4 + 4 * wg + box; }
  __device__ __forceinline__ static int Free(int wg, int box) { return 6 + 4 * wg + box; }
};

// The consumer's side of Sm90HandedStores for box c: once the store warp has freed slot
// c % 2 (`wait_free`: an earlier box's store may still read it), `write(slot address)` fills
// it, and the box is handed to the store warp.
template <class P, class TOut, class Write>
__device__ __forceinline__ void Sm90HandBox(int c, int wg, unsigned char* boxes, bool wait_free, Write write) {
  using H = Sm90HandedStores<P, TOut>;
  const int slot = c % 2;
  if (wait_free) NamedBarrierSync(H::Free(wg, slot), H::kThreads);
  write(SharedAddress(boxes + slot * P::kOutBoxBytes));
  FenceProxyAsyncShared();
  NamedBarrierArrive(H::Written(wg, slot), H::kThreads);
}

// Sm90HandBox for box c (block c of the consumer's tile, in row-major block order) packed
// into 16 registers (Sm90PackBox). Packed words free the accumulators at once: Sm90Consume
// writes a 16-bit tile's boxes 2 and 3, which wait for the stores of boxes 0 and 1, while
// the next tile's wgmmas run.
template <class P, class TOut>
__device__ __forceinline__ void Sm90WriteBoxWords(const Sm90BoxWriter<TOut>& writer, const uint32_t (&words)[16],
                                                  int c, int wg, unsigned char* boxes, bool wait_free) {
  Sm90HandBox<P, TOut>(c, wg, boxes, wait_free, [&](uint32_t box) { writer.Write(box, words); });
}

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

// v = the 32 values of 64 x 64 block b (row block b / (kBN / 64), column block
// b % (kBN / 64)) in this thread's fragments: v[h][2 u + x] is row 16 warp + lane / 4 + 8 h,
// column 8 u + 2 (lane % 4) + x of the block. b is a runtime index, the fragment indices
// must be compile-time: an if-else chain ending in an unconditional else, so v is defined on
// every path (otherwise it stays live around the tile loop, through the mainloop). The
// copies are volatile moves so they stay in their branches (speculated, each value would
// become one select per block).
template <class P, int kB = 0>
__device__ __forceinline__ void Sm90TakeBlock(const float (&acc)[P::kMmaM][P::kBN / 2], int b, float (&v)[2][16]) {
  constexpr int kColBlocks = P::kBN / 64, kBlocks = P::kMmaM * kColBlocks;
  auto take = [&] {
#pragma unroll
    for (int u = 0; u < 8; ++u)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int x = 0; x < 2; ++x) {
          asm volatile("mov.b32 %0, %1;"
                       : "=f"(v[h][2 * u + x])
                       : "f"(acc[kB / kColBlocks][4 * (kB % kColBlocks * 8 + u) + 2 * h + x]));
        }
  };
  if constexpr (kB == kBlocks - 1) {
    take();
  } else if (b == kB) {
    take();
  } else {
    Sm90TakeBlock<P, kB + 1>(acc, b, v);
  }
}

// The fused TMA-store epilogue of one consumer's tile: the general epilogue's arithmetic
// without C and residual (GemmEpilogue::StoreRows), on the fragments:
//   z = alpha * acc + bias (the product rounded before the add),  Aux = z,  D = act(z),
// Aux and D rounded to nearest from the fp32 values, act with the 16-bit outputs' hardware
// tanh / exp as there. One 64 x 64 block per iteration of a runtime loop, so the activation
// code exists once (unrolled per block, every activation times every block overflows the
// instruction cache); the block's 32 values per thread come out of the accumulators with
// compile-time indices, one branch per block.
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
  const float alpha = s.alpha;
  const Activation activation = s.activation;
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
#pragma unroll 1
  for (int c = 0; c < kBlocks; ++c) {
    float v[2][16];
    Sm90TakeBlock<P>(acc, c, v);
    const int mi = c / kColBlocks, nb = c % kColBlocks;
    if (alpha != 1.f) {  // skipped in the common case: 1 x acc is acc
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int j = 0; j < 16; ++j) v[h][j] = __fmul_rn(v[h][j], alpha);
    }
    if (with_bias) {
      // Columns 64 nb + 8 u + 2 (lane % 4) + {0, 1}: word 32 nb + 4 u + lane % 4.
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        TOut b[2];
        const uint32_t word = LoadShared32(stage + 4 * (32 * nb + 4 * u + lane % 4));
        memcpy(b, &word, 4);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          v[h][2 * u] += ToFloat(b[0]);
          v[h][2 * u + 1] += ToFloat(b[1]);
        }
      }
    }
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
    auto write_box = [&](unsigned char* box) {
      Sm90WriteBox(SharedAddress(box) + row_offset, unit_xor,
                   [&](int h, int u) { return PackPair<TOut>(v[h][2 * u], v[h][2 * u + 1]); });
    };
    if (with_aux) write_box(boxes);
    ActivateAll<true>(activation, v);
    write_box(d_box);
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

#endif  // JG_SM90_ENABLED

// Whether D (and Aux) can take the TMA-store epilogue, and the tensor maps: an epilogue
// without C or residual (those stay on the general epilogue), and for a float output without
// bias, activation or Aux (the fused path packs 16-bit pairs); TMA-addressable D and Aux
// (16-byte aligned rows; Aux is laid out like D: pitch ldd, slabs m * n apart).
template <class TOut>
Sm90Store MakeSm90Store(const GemmProblem& p) {
  static_assert(sizeof(TOut) == 2 || sizeof(TOut) == 4, "16-bit or float outputs");
  constexpr int64_t kRowUnit = 16 / sizeof(TOut);  // elements per 16 bytes
  Sm90Store store{};
  const EpilogueParams& e = p.epilogue;
  const int64_t slabs = p.batch.count * p.split_k;
  const bool fused = e.bias || e.aux || e.activation != Activation::kNone;
  // A bias's batch offsets must be one stride times the batch index (no divisions per tile).
  if (e.c || e.residual || (sizeof(TOut) == 4 && fused) || (p.transposed_d && sizeof(TOut) != 4) ||
      (e.bias && !SingleBatchStride(p.batch, kOperandBias, &store.bias_stride)) || p.ldd % kRowUnit != 0 ||
      reinterpret_cast<uintptr_t>(p.d) % 16 != 0 || reinterpret_cast<uintptr_t>(e.aux) % 16 != 0 ||
      (slabs > 1 && (p.m * p.n) % kRowUnit != 0) || p.m >= INT32_MAX || p.n >= INT32_MAX || slabs >= INT32_MAX) {
    return store;
  }
  // A transposed D's columns are the kernel's rows: a box is 32 of those by 64 columns of
  // the product (Sm90WriteTransposedBoxes).
  TmaMatrix d{p.d, p.out_type, p.n, p.m, p.ldd};
  if (p.transposed_d) std::swap(d.cols, d.rows);
  if (slabs > 1) d.batch = slabs, d.batch_stride = p.m * p.n;
  if (EncodeTmaMap(&store.d, d, kSm90BoxCols<TOut>, 64) != cudaSuccess) return store;  // the general epilogue then
  if (e.aux) {
    TmaMatrix aux = d;
    aux.base = e.aux;
    if (EncodeTmaMap(&store.aux, aux, kSm90BoxCols<TOut>, 64) != cudaSuccess) return store;
    store.with_aux = 1;
  }
  store.fused = fused;
  store.transposed = p.transposed_d;
  store.bias = e.bias;
  store.n = p.n;
  store.alpha = e.alpha;
  store.activation = e.activation;
  store.enabled = 1;
  store.slabs = static_cast<int>(slabs);
  return store;
}

#if defined(JG_SM90_ENABLED)

// The handed TMA-store epilogue of a product computed transposed (Sm90Transposed: tf32,
// register A, float32 D): the consumer's 64 x kBN block of D^T goes to D in boxes of 64 of
// D's rows (the block's columns) by 32 of its columns (the block's rows), 128 B-swizzled.
// Box c holds block rows 32 (c % 2) ... and columns 64 (c / 2) ...; with register A, warps
// 0 and 1 hold block rows 0-31 (Sm90RegisterAFragments::Row) and warps 2 and 3 rows 32-63,
// so box c is written by warps 2 (c % 2) and + 1 alone, one 4-byte store per value (a
// thread's two adjacent columns are two rows of D). Box c is handed over in slot c % 2
// (Sm90HandBox); the store warp places it (Sm90StoreWarp).
template <class P>
__device__ __forceinline__ void Sm90WriteTransposedBoxes(const float (&acc)[P::kBN / 2], float alpha, int wg,
                                                         unsigned char* boxes, bool boxes_in_use) {
  using H = Sm90HandedStores<P, float>;
  static_assert(H::kBoxes == P::kBN / 32, "two boxes per 64 columns");
  const int lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32, q = lane % 4;
  // Byte of this thread's value (h, e) in a box, for column group 0: D row 2 q + e of the
  // box (block column 8 j + 2 q + e adds 8 j rows, 1 KB), D column `m` (its block row).
  uint32_t offset[2][2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int m = Sm90RegisterAFragments<P>::Row(16 * warp + lane / 4 + 8 * h) % 32;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int row = 2 * q + e;
      offset[h][e] = row * 128 + ((m / 4) ^ row) * 16 + (m % 4) * 4;
    }
  }
#pragma unroll
  for (int c = 0; c < H::kBoxes; ++c) {
    Sm90HandBox<P, float>(c, wg, boxes, boxes_in_use || c >= 2, [&](uint32_t box) {
      if (warp / 2 == c % 2) {
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float v = alpha * acc[4 * (8 * (c / 2) + j) + 2 * h + e];
              StoreShared32(box + j * 1024 + offset[h][e], __float_as_uint(v));
            }
      }
    });
  }
}

// The store warp of consumer `wg` (Sm90HandedStores): walks the block's items as the
// consumers do and, for each box the consumer has written, issues its TMA store and frees
// the box once the store has read it.
template <class P, class TOut>
__device__ __forceinline__ void Sm90StoreWarp(const GemmProblem& p, const Sm90Schedule<P>& schedule,
                                              const Sm90Store& store, int wg, unsigned char* boxes,
                                              const Sm90Timeline& timeline) {
  using H = Sm90HandedStores<P, TOut>;
  constexpr int kColBlocks = P::kBN / kSm90BoxCols<TOut>;
  const bool leader = threadIdx.x % 32 == 0;
  const bool with_aux = store.fused && store.with_aux;  // Aux in box 0, D in box 1, one barrier pair
  bool first = wg == 0 && leader;  // records the timeline's box events on its first whole item
  Sm90Work w;
  for (Sm90Cursor cursor = schedule.Start(); schedule.Next(p, cursor, &w);) {
    if (w.fixup == kSm90StorePartial) continue;  // the consumer leaves these sums in the workspace
    const int row0 = static_cast<int>(w.m0) + 64 * wg, col0 = static_cast<int>(w.n0);
    for (int c = 0; c < H::kBoxes; ++c) {
      const int slot = with_aux ? 0 : c % 2;
      NamedBarrierSync(H::Written(wg, slot), H::kThreads);
      if (first && c < kTimelineBoxes) timeline.Record(kTimelineBoxWritten + c);
      if (leader) {
        // A transposed D's box c: the tile's rows 32 (c % 2) ..., columns 64 (c / 2) ...
        // (Sm90WriteTransposedBoxes), at D's (column, row) = (tile row, tile column).
        const int col = store.transposed ? row0 + 32 * (c % 2) : col0 + kSm90BoxCols<TOut> * (c % kColBlocks);
        const int row = store.transposed ? col0 + 64 * (c / 2) : row0 + 64 * (c / kColBlocks);
        auto tma_store = [&](const CUtensorMap* map, unsigned char* smem) {
          Sm90TmaStoreBox(store, map, smem, col, row, static_cast<int>(w.slab));
        };
        if (with_aux) tma_store(&store.aux, boxes);
        tma_store(&store.d, boxes + (with_aux ? 1 : slot) * P::kOutBoxBytes);
        BulkCommitGroup();
        BulkWaitGroupRead<0>();
        if (first && c < kTimelineBoxes) timeline.Record(kTimelineBoxRead + c);
      }
      __syncwarp();
      NamedBarrierArrive(H::Free(wg, slot), H::kThreads);
    }
    first = false;
  }
}

// A consumer's TMA-store epilogue across its items (Sm90Consume): which of the above a tile
// takes, and what the consumer's boxes hold between tiles. Sm90HandedStores' plain
// epilogue: boxes 0 and 1 of a tile are written at once; boxes 2 and 3 (kBN = 256), which
// must wait for their slots' stores, wait in registers as rounded words and are written
// while the next tile's first wgmmas run (WritePending; or at the exit), so that the tensor
// cores do not idle through those waits. (A float tile's 8 boxes are all written at once:
// their words would not fit registers.) kWithFused: the instance holds the fused epilogue.
template <class P, class TOut, bool kRegisterA, bool kWithFused>
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
  // "Sm90Consume as a loop of phases".)
  __device__ __forceinline__ void Store(const Sm90Store& store, const float (&acc)[P::kMmaM][P::kBN / 2],
                                        const GemmProblem& p, int64_t row0, int64_t col0, int64_t slab, int wg,
                                        unsigned char* boxes, uint32_t bias_word, uint32_t* bias_stage) {
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
