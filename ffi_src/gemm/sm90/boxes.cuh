// The sm90 kernel's TMA-store boxes, for epilogues that read no C and no residual: each
// consumer writes its tile's blocks of D (and of Aux) to shared memory in the 128-byte-
// swizzled layout of a tensor map, and one thread (of the consumer, or of its store warp:
// Sm90HandedStores, Sm90StoreWarp) stores each block with TMA. A block (a box) is 64 rows
// of 128 bytes: 64 x 64 16-bit or 64 x 32 float values. D = alpha * acc, any output type:
// Sm90StoreTile, or Sm90PackBox + Sm90WriteBoxWords (handed stores); the fused steps (bias,
// activation, Aux) are in epilogue.cuh. MakeSm90Store decides on the host whether a
// problem can take the boxes and encodes the maps.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "common/activation.h"
#include "common/device_numeric.cuh"
#include "common/ptx_sm90.cuh"
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
  // fp8 products' scales (float32; null: absent), each one stride per batch index.
  const float* row_scale;
  const float* col_scale;
  int64_t row_scale_stride, col_scale_stride;
  int64_t m, n;
  float alpha;
  Activation activation;

  // Where Sm90GemmKernel's barriers start: behind the stages, the epilogue scratch and the
  // bias stage (Sm90Policy).
  template <class P>
  static constexpr int kBarrierOffset = P::kBarrierOffset;

#if defined(JG_SM90_ENABLED)
  __device__ __forceinline__ void Prefetch() const {
    if (enabled) PrefetchTensorMap(&d);
    if (with_aux) PrefetchTensorMap(&aux);
  }
#endif
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

// Sm90WriteBox of a block's 32 values per thread (v[h][2 u + x]: the fragment layout), each
// pair rounded to TOut.
template <class TOut>
__device__ __forceinline__ void Sm90WriteBoxValues(uint32_t row_address, uint32_t unit_xor, const float (&v)[2][16]) {
  Sm90WriteBox(row_address, unit_xor, [&](int h, int u) { return PackPair<TOut>(v[h][2 * u], v[h][2 * u + 1]); });
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

#endif  // JG_SM90_ENABLED

// Whether D (and Aux) can take the TMA-store epilogue, and the tensor maps: an epilogue
// with no operand but the bias, and the scales of fp8 products (C, the residual and any
// other stay on the general epilogue, which reads every operand of the table), and for a
// float output without bias, activation or Aux (the fused path packs 16-bit pairs);
// TMA-addressable D and Aux (16-byte aligned rows; Aux is laid out like D: pitch ldd, slabs
// m * n apart).
template <class TOut>
Sm90Store MakeSm90Store(const GemmProblem& p) {
  static_assert(sizeof(TOut) == 2 || sizeof(TOut) == 4, "16-bit or float outputs");
  constexpr int64_t kRowUnit = 16 / sizeof(TOut);  // elements per 16 bytes
  Sm90Store store{};
  const EpilogueParams& e = p.epilogue;
  const int64_t slabs = p.batch.count * p.split_k;
  // (The scales alone take the plain path: Sm90TmaEpilogue scales the tile first.)
  const bool fused = e.bias() || e.aux || e.activation != Activation::kNone;
  // Operands the fused path does not read (the fp8 instances alone read the scales).
  auto fused_reads = [&](int o) {
    return o == kEpilogueBias || (IsFloat8(p.in_type) && (o == kEpilogueRowScale || o == kEpilogueColScale));
  };
  bool others = false;
  for (int o = 0; o < kEpilogueOperands; ++o) others = others || (!fused_reads(o) && e.operand[o] != nullptr);
  // A bias's (and scale's) batch offsets must be one stride times the batch index (no
  // divisions per tile).
  auto one_stride = [&](int o, int64_t* stride) {
    return e.operand[o] == nullptr || SingleBatchStride(p.batch, BatchOperandOf(o), stride);
  };
  if (others || (sizeof(TOut) == 4 && fused) || (p.transposed_d && sizeof(TOut) != 4) ||
      !one_stride(kEpilogueBias, &store.bias_stride) || !one_stride(kEpilogueRowScale, &store.row_scale_stride) ||
      !one_stride(kEpilogueColScale, &store.col_scale_stride) || p.ldd % kRowUnit != 0 ||
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
  store.bias = e.bias();
  store.row_scale = e.row_scale();
  store.col_scale = e.col_scale();
  store.m = p.m;
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

#endif  // JG_SM90_ENABLED

}  // namespace jaxgemm
