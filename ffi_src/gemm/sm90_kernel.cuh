// The sm90 (Hopper) GEMM kernel for 16-bit inputs, and for float32 inputs as tf32 (wgmma
// cannot transpose 32-bit types: B must be K-major, and an MN-major A is loaded into
// registers, Sm90RegisterAFragments): a persistent, warp-specialized kernel.
// Warpgroup 0 is the producer: one thread streams A and B k-tiles with TMA into a ring of
// shared-memory stages (full/empty mbarriers). Warpgroups 1 and 2 are consumers: they
// multiply with wgmma (operands straight from the 128-byte-swizzled stages, fp32
// accumulators in registers) and apply the shared epilogue, either both on every tile
// (cooperative) or on alternate tiles (pingpong; see Sm90Policy). The ring runs across
// output tiles, so the producer loads ahead during epilogues. Stored layouts are used as
// they are: a transposed operand is MN-major in shared memory and wgmma reads it with its
// transpose bit. Roles: Sm90MatrixLoads::Produce (TMA), Sm90Consume (mainloop, then epilogue:
// the TMA-store ones of sm90_store.cuh, or the general one through shared memory), and on
// the cooperative schedules Sm90StoreWarp (warps 1 and 2 of the producer warpgroup issue the
// consumers' TMA stores, see Sm90HandedStores).
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "common/ptx_sm90.cuh"
#include "gemm/epilogue.cuh"
#include "gemm/problem.h"
#include "gemm/sm90_launch.h"
#include "gemm/sm90_store.cuh"
#include "gemm/sm90_stream_k.h"
#include "gemm/sm90_tensor_map.h"
#include "gemm/sm90_timeline.cuh"
#include "gemm/sm90_wgmma.cuh"
#include "gemm/tile_scheduler.cuh"

namespace jaxgemm {

// kPingpong = false ("cooperative"): both consumers work on every tile, 64 rows each.
// kPingpong = true: each consumer owns every other tile of the block (all 128 rows, two
// m64 wgmmas per k-step); the ring hands them stages in tile order, so one consumer's
// epilogue overlaps the other's mainloop. Accumulators: 64 rows x kBN / 128 threads per
// m64 block, so pingpong needs kBN <= 128 to stay at 128 registers. kBN = 64 (pingpong
// 128 x 64) is for GEMMs with n <= 64 (convs with 64 output channels): m64n64 wgmmas, whose
// MN-major B tile is one swizzle atom wide, so its leading byte offset goes unused.
// kClusterM = 2 (cooperative only): two blocks of a cluster take vertically adjacent tiles
// and share the B tile: each loads half of it and multicasts it to both, so the L2 serves
// a third fewer bytes per tile (less L2 traffic, less power, higher sustained clocks).
// kElementBytes = 4: float32 operands multiplied as tf32. A k-tile is still one 128-byte
// swizzle row per tile row (32 elements instead of 64), and each wgmma still consumes 32
// bytes of it (k8 instead of k16), so the shared-memory layout and descriptors are the
// 16-bit ones.
// kConsumerWarpgroups = 1: 64-row tiles for products of at most 64 rows, which stream B:
// an 8 KB A stage leaves room for more stages, i.e. more of B in flight per block.
// kConsumerWarpgroups = 3 (cooperative, kBN = 128, no cluster): 192-row blocks, for
// products of 129-192 rows (and twice that), which 128-row tiles cover with two row blocks,
// one half empty: every B tile then feeds a single block (NOTES.md, session 33). 512 threads
// enter with 128 registers each, and ptxas holds every instruction to that entry budget:
// an m64n128 wgmma's 64 accumulators fit it, an m64n256's 128 did not (session 11).
// kSwapped (cooperative, two consumers, 16-bit, no cluster): the kernel multiplies the
// product transposed, D^T = op(B)^T op(A)^T (Sm90Swapped), so that D's few rows are the
// columns of its tiles, whose width (kBN = 160) needs no multiple of 64; the general
// epilogue writes each tile of D^T transposed into D (every epilogue; no TMA stores).
// For 257-320 rows: two column blocks of 160 instead of three 128-row blocks, one at most
// half full (NOTES.md, session 34).
// The epilogues an instance of the kernel holds: kPlain, D = alpha * acc through TMA stores
// (Sm90StoreTile, or the handed boxes); kTmaStores, those and the fused bias / activation /
// Aux TMA-store epilogue (Sm90StoreTileFused); kAll, also the general epilogue through
// shared memory (C, residual, float32 outputs with a fused epilogue, the convolutions'
// mapped rows, the swapped tiles' D^T; MakeSm90Store says which problems need it).
enum class Sm90Epilogues { kPlain, kTmaStores, kAll };

template <int kTileN, bool kPingpongTiles = false, int kClusterBlocksM = 1, int kElementBytes = 2,
          int kConsumerWarpgroups = 2, bool kSwappedOperands = false>
struct Sm90Policy {
  static constexpr int kRowBytes = 128;  // one k-tile row: one 128 B swizzle row
  static constexpr int kConsumers = kConsumerWarpgroups;
  static constexpr bool kPingpong = kPingpongTiles;
  static constexpr bool kSwapped = kSwappedOperands;
  static_assert(!kSwapped || (kConsumers == 2 && !kPingpong && kClusterBlocksM == 1 && kElementBytes == 2),
                "swapped tiles: cooperative, two consumers, one block, 16-bit inputs");
  static_assert(kSwapped || kTileN % 64 == 0, "tiles of D: whole 64-column output boxes");
  static_assert(kConsumers == 2 || (kConsumers == 1 && !kPingpong) ||
                    (kConsumers == 3 && !kPingpong && kClusterBlocksM == 1 && kTileN <= 128),
                "1 consumer: cooperative schedule; 3 consumers: cooperative, one block, at most 128 columns");
  static constexpr int kBM = 64 * kConsumers, kBN = kTileN, kBK = kRowBytes / kElementBytes;
  static constexpr int kKSteps = kRowBytes / 32;  // wgmmas per k-tile, 32 bytes of K each
  static constexpr int kClusterM = kClusterBlocksM;
  static_assert(kClusterM == 1 || (kClusterM == 2 && !kPingpong), "clusters: cooperative schedule, 2 blocks");
  static constexpr int kMmaM = kPingpong ? 2 : 1;          // m64 blocks per consumer and tile
  static_assert(kMmaM * kBN <= 256, "accumulators would exceed 128 registers per thread");
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kTileABytes = kBM * kRowBytes, kTileBBytes = kBN * kRowBytes;
  static constexpr int kStageBytes = kTileABytes + kTileBBytes;
  // 4 for 128x256, 6 for 128x128, 8 for 128x64, 8 for 64x128, 12 for 64x64, 4 for 192x128.
  static constexpr int kStages = (192 * 1024) / kStageBytes;
  // full[kStages], empty[kStages], order[2] (pingpong: whose turn to run its mainloop).
  static constexpr int kBarrierBytes = (2 * kStages + 2) * 8;
  // Epilogue scratch per consumer, used one of two ways:
  // - the general epilogue: 64 rows x kEpilogueCols fp32, rows padded to 40 floats so the
  //   fragment writes (8 rows x 4 column pairs per warp) hit distinct banks;
  // - the TMA-store epilogue: two output boxes of 64 rows x 128 B (8 KB each, 128 B swizzled:
  //   64 x 64 16-bit or 64 x 32 float values).
  static constexpr int kEpilogueCols = 32, kEpiloguePitch = 40;
  static constexpr int kOutBoxBytes = 64 * 64 * 2;
  static constexpr int kEpilogueRegionBytes = std::max(64 * kEpiloguePitch * 4, 2 * kOutBoxBytes);
  static constexpr int kEpilogueBytes = kConsumers * kEpilogueRegionBytes;
  // Per consumer, the tile's bias for the fused TMA-store epilogue: kBN 16-bit values.
  static constexpr int kBiasStageBytes = kConsumers * kBN * 2;
  // + 1 KB so the stages can start on a 1 KB boundary (the 128 B swizzle's period).
  static constexpr int kSmemBytes = kStages * kStageBytes + kEpilogueBytes + kBiasStageBytes + kBarrierBytes + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "over the shared memory of one block");
  // 2 x 232 + 40 (3 x 152 + 40) registers x 128 threads fill the 64 K register file. ptxas
  // compiles the consumers' code for the raised budget (the SASS uses up to R229), but each
  // single instruction must fit the entry budget of 65536 / kThreads = 168 (128 with three
  // consumers; NOTES.md, session 10). One consumer needs no setmaxnreg: 256 threads enter
  // with the most registers a thread can have.
  static constexpr bool kMovesRegisters = kConsumers > 1;
  static constexpr int kProducerRegisters = 40;
  static constexpr int kConsumerRegisters = kConsumers == 3 ? 152 : 232;
  static_assert(!kMovesRegisters || (kProducerRegisters + kConsumers * kConsumerRegisters) * 128 <= 65536,
                "over the register file");
  // Bytes between 64-element blocks of an MN-major operand (one TMA box of 64 x 64; 16-bit
  // only). For K-major A it is also the offset between the tile's 64-row blocks.
  static constexpr int kMnBlockBytes = 64 * kRowBytes;
  // An MN-major A tile is loaded in blocks of kMnBlock (m) x kBK (k): one 128 B swizzle row
  // per k (64 x 64 for 16-bit types, the blocks above; 32 x 32 for tf32).
  static constexpr int kMnBlock = kRowBytes / kElementBytes;
  static constexpr int kMnBlockTileBytes = kBK * kRowBytes;
};

// Which operand tiles a thread block works on, in the order every role walks them.
struct Sm90Work {
  int64_t m0, n0, batch, k_begin;
  int64_t slab;  // batch * split_k + split: D's slab
  int k_tiles;
  int fixup;     // Sm90Fixup
  int partners;  // kSm90AddPartial: how many later workers' partial sums to add
  // After k_wrap k-tiles from k_begin, the item's first k-tile follows (a stream-K piece,
  // Sm90StreamKPiece); k_tiles for every other item.
  int k_wrap;
};

// Stream-K's workspace: one fp32 tile of partial sums per block, and one flag per block and
// consumer that says the slot is written. Unused (null) when the schedule has no stream-K
// items. The flags are zeroed before each launch.
struct Sm90StreamK {
  float* partials;
  uint32_t* flags;
  int64_t items;  // the last `items` work items are shared out in equal k ranges
};

// A position in a block's walk (Sm90Schedule::Start / Next).
struct Sm90Cursor {
  int32_t item;  // the next whole item, while < the first stream-K item
  // Then the stream-K range's first, next and end k-tile, counted over those items.
  int32_t begin, iter, end;
};

// Work items are cluster tiles: kClusterM vertically adjacent output tiles, one per block
// of the cluster (a cluster is one block without clusters). A "worker" is a block, or a
// cluster (Step() of them). Each worker walks whole items First(), First() + Step(), ...
// below `sk_first`. Stream-K (when sk_first < total): the remaining items, between one and
// two workers' worth (or all of them, fewer than the workers), are cut into k-tile ranges
// of equal length, one per worker, so that no worker idles through a last, partly filled
// wave (sm90_stream_k.h). Built on the host
// (For), so that a work item's mapping is multiplies and shifts (FastDivmod): with 64-bit
// divisions, every role spent ~1 us of the kernel's start on the first item's (the
// producer's first TMA load came 1.7 us after the block's start).
template <class P>
struct Sm90Schedule {
  int32_t total;         // work items (< 2^31: Items() is checked before launch)
  int32_t sk_first;      // the first stream-K item (total: none)
  int32_t item_k_tiles;  // k-tiles of a whole item (stream-K needs split_k == 1)
  // Whether consumers multiply m64 blocks at or past row M too (see Sm90Consume).
  bool multiply_empty;
  int64_t sk_k_tiles;    // k-tiles of the stream-K items together (< 2^31)
  int64_t k_chunk;       // split-K: K of each chunk (p.KChunk())
  FastDivmod per_slab;   // cluster tiles per slab: item -> (slab, cluster tile)
  FastDivmod split_k;    // slab -> (batch, split)
  FastDivmod item_k;     // stream-K: k-tile -> (item, k-tile in it)
  FastGroupedRaster raster;

  // Work-item rows per raster group: GroupedRaster's 8 for square items, more for wide
  // ones, so that the items resident at once cover about as many rows of A as columns of B
  // (128 x 256 blocks: 16 rows of 8 columns, 2048 x 2048 of the output).
  static constexpr int32_t kRasterRows =
      std::max<int32_t>(1, static_cast<int32_t>(GroupedRaster::kGroupM) * P::kBN / (P::kBM * P::kClusterM));

  // Work-item rows (cluster tiles) and columns of one slab.
  __host__ __device__ static int64_t GroupsM(const GemmProblem& p) {
    return ((p.m + P::kBM - 1) / P::kBM + P::kClusterM - 1) / P::kClusterM;
  }
  __host__ __device__ static int64_t TilesN(const GemmProblem& p) { return (p.n + P::kBN - 1) / P::kBN; }

  __host__ __device__ static int64_t Items(const GemmProblem& p) {
    return GroupsM(p) * TilesN(p) * p.batch.count * p.split_k;
  }

  // For a problem with Items(p) < 2^31 and, with stream-K, stream_k_items * item_k_tiles < 2^31.
  // `keep_in_step`: the loads allow multiplying a last row block's empty m64 blocks (below).
  static Sm90Schedule For(const GemmProblem& p, int64_t stream_k_items, bool keep_in_step) {
    Sm90Schedule s;
    const int64_t groups_m = GroupsM(p), tiles_n = TilesN(p);
    s.total = static_cast<int32_t>(Items(p));
    s.sk_first = static_cast<int32_t>(s.total - stream_k_items);
    s.item_k_tiles = static_cast<int32_t>((p.k + P::kBK - 1) / P::kBK);
    // With more than one row of work items, a last row block that skipped its empty m64
    // blocks would run ahead of the full blocks over the same B tiles and stop sharing them
    // in L2 (NOTES.md, session 33: 960 x 8192^2 on 128 x 128 tiles 611 -> 740 TFLOP/s,
    // 448 x 8192 x 4096 531 -> 667, 320 x 8192^2 on 192 x 128 491 -> 572, multiplying them).
    // A cluster's blocks free their stages together, so they stay in step anyway and keep
    // skipping.
    s.multiply_empty = keep_in_step && P::kClusterM == 1 && groups_m > 1;
    s.sk_k_tiles = stream_k_items * s.item_k_tiles;
    s.k_chunk = p.KChunk();
    s.per_slab = FastDivmod(static_cast<int32_t>(groups_m * tiles_n));
    s.split_k = FastDivmod(static_cast<int32_t>(p.split_k));
    s.item_k = FastDivmod(s.item_k_tiles);
    s.raster = FastGroupedRaster(static_cast<int32_t>(groups_m), static_cast<int32_t>(tiles_n), kRasterRows);
    return s;
  }

  __device__ __forceinline__ static int32_t First() { return blockIdx.x / P::kClusterM; }
  __device__ __forceinline__ static int32_t Step() { return gridDim.x / P::kClusterM; }

  // Worker First()'s walk: its stream-K range is worked out once, here.
  __device__ __forceinline__ Sm90Cursor Start() const {
    Sm90Cursor c{First(), 0, 0, 0};
    if (sk_first < total) {
      c.begin = c.iter = Sm90StreamKBegin(sk_k_tiles, First(), Step());
      c.end = Sm90StreamKBegin(sk_k_tiles, First() + 1, Step());
    }
    return c;
  }

  // The next work item of this block into *w; false when the walk is over.
  __device__ __forceinline__ bool Next(const GemmProblem& p, Sm90Cursor& c, Sm90Work* w) const {
    if (c.item < sk_first) {
      *w = Get(p, c.item);
      c.item += Step();
      return true;
    }
    if (c.iter >= c.end) return false;
    const Sm90StreamKPiece piece = Sm90StreamKPieceAt(sk_k_tiles, Step(), First(), c.begin, c.iter, c.end, item_k);
    *w = Get(p, sk_first + piece.item);
    w->k_begin = int64_t{piece.first_k} * P::kBK;
    w->k_tiles = piece.k_tiles;
    w->k_wrap = item_k_tiles - piece.first_k;
    w->fixup = piece.fixup;
    w->partners = piece.partners;
    c.iter += piece.k_tiles;
    return true;
  }

  // Item t: slab z = batch * split_k + split, then the cluster tile in grouped raster
  // order, then this block's tile in it. With an odd tile count the last cluster's second
  // tile lies below M: it reads zeros and stores nothing, but still loads its half of B.
  __device__ __forceinline__ Sm90Work Get(const GemmProblem& p, int32_t t) const {
    int32_t z, tile, tm, tn, batch, split;
    per_slab.DivMod(t, &z, &tile);
    raster.Tile(tile, &tm, &tn);
#if defined(JG_SM90_ENABLED)
    if constexpr (P::kClusterM > 1) tm = tm * P::kClusterM + static_cast<int32_t>(ClusterRank());
#endif
    split_k.DivMod(z, &batch, &split);
    const bool split_up = split_k.divisor > 1;
    const int64_t k_size = split_up ? p.ChunkK(split, k_chunk) : p.k;
    const int k_tiles = static_cast<int>((k_size + P::kBK - 1) / P::kBK);
    return {int64_t{tm} * P::kBM, int64_t{tn} * P::kBN, batch, split_up ? split * k_chunk : 0, z, k_tiles,
            kSm90Whole, 0, k_tiles};
  }
};

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

// Stream-K's workspace slot of block `block`: the tile's fp32 sums in fragment order, so
// that both sides move them with coalesced 16-byte accesses and no shuffles: float4 q of
// m64 block `part` (0 or 1: tile rows 64 part ...) of thread tid is at
// (part * kBN / 8 + q) * 128 + tid. The flag of consumer wg (pingpong: one per block).
template <class P>
__device__ __forceinline__ float4* Sm90PartialSlot(const Sm90StreamK& sk, int64_t block) {
  return reinterpret_cast<float4*>(sk.partials) + block * (P::kBM * P::kBN / 4);
}
template <class P>
__device__ __forceinline__ uint32_t* Sm90PartialFlag(const Sm90StreamK& sk, int64_t block, int wg) {
  return sk.flags + block * P::kConsumers + (P::kPingpong ? 0 : wg);
}

// A piece that starts a range inside its item (kSm90StorePartial: a tail or a middle): this
// consumer's sums go to this block's slot, then its flag is raised. `first_block`: the
// consumer's first m64 block of the tile.
template <class P>
__device__ __forceinline__ void Sm90StorePartial(const Sm90StreamK& sk, const float (&acc)[P::kMmaM][P::kBN / 2],
                                                 int first_block, int wg) {
  const int tid = threadIdx.x % 128;
  float4* slot = Sm90PartialSlot<P>(sk, blockIdx.x);
#pragma unroll
  for (int mi = 0; mi < P::kMmaM; ++mi)
#pragma unroll
    for (int q = 0; q < P::kBN / 8; ++q) {
      __stcg(&slot[((first_block + mi) * (P::kBN / 8) + q) * 128 + tid],
             make_float4(acc[mi][4 * q], acc[mi][4 * q + 1], acc[mi][4 * q + 2], acc[mi][4 * q + 3]));
    }
  NamedBarrierSync(1 + wg, 128);  // every thread's stores precede the signal
  if (tid == 0) SignalGpu(Sm90PartialFlag<P>(sk, blockIdx.x, wg));
}

// The head of an item (kSm90AddPartial): waits for the partial sums of the `partners`
// workers after this one (in their blocks of the same cluster rank) and adds them, in
// worker order (deterministic). Their pieces opened their ranges and this head closes this
// worker's: the waits are normally short (a middle piece ends with its range, as the head
// does). (The spin needs the partners resident: the grid is one block per SM at most, so
// all of its blocks are, unless other work holds SMs meanwhile.)
template <class P>
__device__ __forceinline__ void Sm90AddPartial(const Sm90StreamK& sk, float (&acc)[P::kMmaM][P::kBN / 2],
                                               int first_block, int wg, int partners) {
  const int tid = threadIdx.x % 128;
  for (int j = 1; j <= partners; ++j) {
    const int64_t partner = blockIdx.x + int64_t{j} * P::kClusterM;
    if (tid == 0) {
      const uint32_t* flag = Sm90PartialFlag<P>(sk, partner, wg);
      while (LoadAcquireGpu(flag) == 0) __nanosleep(64);
    }
    NamedBarrierSync(1 + wg, 128);
    const float4* slot = Sm90PartialSlot<P>(sk, partner);
#pragma unroll
    for (int mi = 0; mi < P::kMmaM; ++mi)
#pragma unroll
      for (int q = 0; q < P::kBN / 8; ++q) {
        const float4 v = __ldcg(&slot[((first_block + mi) * (P::kBN / 8) + q) * 128 + tid]);
        acc[mi][4 * q] += v.x;
        acc[mi][4 * q + 1] += v.y;
        acc[mi][4 * q + 2] += v.z;
        acc[mi][4 * q + 3] += v.w;
      }
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

// Consumer warpgroup `wg` (0 .. kConsumers - 1): rows [64 wg, 64 wg + 64) of each tile
// (cooperative), or all rows of tiles wg, wg + 2, ... of the block's sequence (pingpong).
// kEpilogues: which of the epilogues this instance holds (Sm90Epilogues).
template <class P, class TIn, class TOut, bool kTransA, bool kTransB, class Loads, Sm90Epilogues kEpilogues>
__device__ __forceinline__ void Sm90Consume(const GemmProblem& p, const Sm90Schedule<P>& schedule, int wg,
                                            unsigned char* tiles_a, unsigned char* tiles_b, uint64_t* full,
                                            uint64_t* empty, uint64_t* order, float* scratch,
                                            const Sm90Store& store, const Sm90StreamK& stream_k,
                                            const Loads& loads, const Sm90Timeline& timeline) {
  // Descriptor geometry: K-major tiles step 32 B per wgmma (k16, or k8 for tf32) inside the
  // swizzled row; MN-major tiles step two 8-row (1 KB) groups.
  // The leading byte offset matters only for MN-major tiles (the 64-wide block stride).
  constexpr uint32_t kStepA = kTransA ? 2048 : 32, kStepB = kTransB ? 32 : 2048;
  constexpr uint32_t kLeadA = kTransA ? P::kMnBlockBytes : 16, kLeadB = kTransB ? 16 : P::kMnBlockBytes;
  // The launcher takes a TMA-store instance only for problems whose store is enabled.
  constexpr bool kTmaStoresOnly = kEpilogues != Sm90Epilogues::kAll;
  constexpr bool kWithFused = kEpilogues != Sm90Epilogues::kPlain;
  const int lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32;
  const bool vector_store = p.ldd % 4 == 0 && IsAligned(p.d, 4 * sizeof(TOut)) &&
                            IsAligned(p.epilogue.aux, 4 * sizeof(TOut));
  uint32_t* bias_stage =
      reinterpret_cast<uint32_t*>(reinterpret_cast<unsigned char*>(scratch) + P::kEpilogueBytes) + wg * (P::kBN / 2);
  scratch += wg * P::kEpilogueRegionBytes / 4;
  const int tid = threadIdx.x % 128;
  // Row block mi of this consumer starts at tile row (kPingpong ? 64 mi : 64 wg).
  const int first_row = P::kPingpong ? 0 : 64 * wg;
  const uint32_t smem_a = SharedAddress(tiles_a) + first_row * P::kRowBytes;
  const uint32_t smem_b = SharedAddress(tiles_b);
  // Stage 0's descriptors at k-step 0, as low and high words. Another stage's, k-step's or
  // m64 block's descriptor adds its byte offset / 16 (the address field's unit) to the low
  // word: shared memory is below 256 KB, so the 14-bit field never carries into the rest.
  // One 32-bit add per descriptor in the k-loop instead of rebuilding it (NOTES.md,
  // session 25).
  const uint32_t desc_a0_lo = uint32_t(SmemDescriptorSw128(smem_a, kLeadA, 1024));
  const uint32_t desc_b0_lo = uint32_t(SmemDescriptorSw128(smem_b, kLeadB, 1024));
  constexpr uint32_t kDescHi = uint32_t(SmemDescriptorSw128(0, 0, 1024) >> 32);
  auto descriptor = [](uint32_t lo) { return (uint64_t(kDescHi) << 32) | lo; };
  // tf32 with an MN-major A: A from registers (Sm90RegisterAFragments).
  constexpr bool kRegisterA = std::is_same_v<TIn, float> && kTransA;
  static_assert(!kRegisterA || P::kMmaM == 1, "register A: one m64 block per consumer");
  const uint32_t tiles_a_address = SharedAddress(tiles_a);
  const Sm90RegisterAFragments<P> register_a(first_row);
  // The tile row (of the consumer's 64) that accumulator row r holds: r, or with register A
  // its permutation, which every epilogue undoes.
  auto tile_row = [](int r) { return kRegisterA ? Sm90RegisterAFragments<P>::Row(r) : r; };
  // A consumed stage is free once every cluster block's consumers are done with it (the
  // producers of all of them write into it).
  auto Release = [](uint64_t* empty_barrier) {
    if constexpr (P::kClusterM == 1) {
      MbarrierArrive(empty_barrier);
    } else {
#pragma unroll
      for (int r = 0; r < P::kClusterM; ++r) MbarrierArriveCluster(empty_barrier, r);
    }
  };
  int stage = 0;
  uint32_t phase = 0;
  float acc[P::kMmaM][P::kBN / 2];
  uint32_t order_phase = 0;
  int64_t i = -1;  // position in the block's tile sequence
  bool boxes_in_use = false;  // Sm90HandedStores: this consumer's boxes hold a tile's blocks
  // Sm90HandedStores' plain epilogue: boxes 0 and 1 of a tile are written at once; boxes
  // 2 and 3 (kBN = 256), which must wait for their slots' stores, wait in registers as
  // rounded words and are written while the next tile's first wgmmas run (or at the exit),
  // so that the tensor cores do not idle through those waits.
  // (A float tile's 8 boxes are all written at once: their words would not fit registers.)
  using Handed = Sm90HandedStores<P, TOut>;
  constexpr int kLateBoxes = sizeof(TOut) == 2 && Handed::kUsed && Handed::kBoxes > 2 ? Handed::kBoxes - 2 : 0;
  uint32_t late_words[kLateBoxes > 0 ? kLateBoxes : 1][16];
  bool pending = false;  // `late_words` hold boxes not yet written
  // Where this thread's values go in an output box (made where used, so that it holds no
  // registers through the mainloop).
  static_assert(!kRegisterA || sizeof(TOut) == 4, "tf32 products have float outputs (16-bit boxes: fragment rows)");
  auto box_writer = [&] {
    using W = Sm90BoxWriter<TOut>;
    return W(tile_row(W::FragmentRow(0)), tile_row(W::FragmentRow(1)));
  };
  auto write_pending = [&] {
    if constexpr (kLateBoxes > 0) {
      if (pending) {
        const Sm90BoxWriter<TOut> writer = box_writer();
#pragma unroll
        for (int c = 0; c < kLateBoxes; ++c) {
          Sm90WriteBoxWords<P, TOut>(writer, late_words[c], 2 + c, wg, reinterpret_cast<unsigned char*>(scratch), true);
        }
        pending = false;
      }
    }
  };
  // Consumer 0 records the timeline's events (Sm90Timeline) on its first two items.
  int own = 0;  // items this consumer has taken
  auto note = [&](int event, int second_event = -1) {
    if (wg == 0 && tid == 0) {
      if (own == 1) timeline.Record(event);
      if (own == 2 && second_event >= 0) timeline.Record(second_event);
    }
  };
  Sm90Work w;
  for (Sm90Cursor cursor = schedule.Start(); schedule.Next(p, cursor, &w);) {
    const int64_t slab = w.slab;
    ++i;
    if (P::kPingpong && i % 2 != wg) {  // the other consumer's tile: skip its stages
      const int next = stage + w.k_tiles;
      phase ^= (next / P::kStages) & 1;
      stage = next % P::kStages;
      continue;
    }
    // Pingpong: start this tile's mainloop only after the other consumer finished its
    // previous one. Besides alternating the tensor cores, this keeps each consumer within
    // one ring pass of the producer, which parity waits on the full barriers require.
    if (P::kPingpong && i > 0) {
      MbarrierWaitLong(&order[wg], order_phase);
      order_phase ^= 1;
    }
    ++own;
    note(kTimelineConsumerItem);
    uint32_t bias_word = 0;
    if constexpr (sizeof(TOut) == 2) {
      if (kWithFused && store.fused && store.bias && tid < P::kBN / 2) {
        bias_word = Sm90BiasWord<TOut>(store, w.n0 + 2 * tid, w.batch);
      }
    }
    // The mainloop over the tile's first kBlocks m64 blocks (a compile-time count: a wgmma
    // under a runtime condition makes ptxas serialize the wgmmas); the others hold zeros.
    // With none, the consumer only hands the stages back.
    auto mainloop = [&](auto blocks) {
      constexpr int kBlocks = decltype(blocks)::value;
#pragma unroll
      for (int mi = 0; mi < P::kMmaM; ++mi) {
        if (mi >= kBlocks || w.k_tiles == 0) {
#pragma unroll
          for (int j = 0; j < P::kBN / 2; ++j) acc[mi][j] = 0.f;
        }
      }
      int previous = -1;
      // Register A: two fragment sets, so that a k-tile's loads do not overwrite the set the
      // previous k-tile's wgmmas (still in flight) read. Each set needs fixed registers, so
      // the k-loop runs k-tile pairs, then an odd last k-tile after it: ptxas serializes
      // every wgmma (C7513) if any path could load a set while its group is in flight.
      [[maybe_unused]] uint32_t a_frags[kRegisterA ? 2 : 1][P::kKSteps][4];
      auto k_tile = [&](int kt, auto set) {
        MbarrierWait(&full[stage], phase);
        if constexpr (kBlocks > 0) {
          const uint32_t desc_b = desc_b0_lo + stage * (P::kTileBBytes / 16);
          if constexpr (kRegisterA) {
            constexpr int kSet = decltype(set)::value;
            register_a.Load(tiles_a_address + stage * P::kTileABytes, a_frags[kSet]);
            WgmmaFence();
#pragma unroll
            for (int kk = 0; kk < P::kKSteps; ++kk) {
              WgmmaTf32RegisterA<P::kBN>(acc[0], a_frags[kSet][kk], descriptor(desc_b + kk * kStepB / 16),
                                         (kt | kk) != 0);
            }
          } else {
            const uint32_t desc_a = desc_a0_lo + stage * (P::kTileABytes / 16);
            WgmmaFence();
#pragma unroll
            for (int kk = 0; kk < P::kKSteps; ++kk) {
#pragma unroll
              for (int mi = 0; mi < kBlocks; ++mi) {
                // 64 rows of A further on: 64 x 128 B rows (K-major) or the next 64-wide block.
                const uint32_t a_offset = (mi * P::kMnBlockBytes + kk * kStepA) / 16;
                Wgmma<TIn, P::kBN, kTransA, !kTransB>(acc[mi], descriptor(desc_a + a_offset),
                                                      descriptor(desc_b + kk * kStepB / 16), (kt | kk) != 0);
              }
            }
          }
          WgmmaCommitGroup();
          if (kt == 1) write_pending();  // two k-tiles of wgmmas queued meanwhile
          // Keep one group in flight: the previous k-tile's group is done, its stage is free.
          WgmmaWaitGroup<1>();
          if (previous >= 0 && lane == 0) Release(&empty[previous]);
          previous = stage;
        } else {
          if (lane == 0) Release(&empty[stage]);
        }
        if (++stage == P::kStages) {
          stage = 0;
          phase ^= 1;
        }
      };
      // The timeline's first-wait events here, not in the k-loop (the loop would carry their
      // predicated code); the loop's own wait for this stage then passes at once.
      if (w.k_tiles > 0) {
        note(kTimelineConsumerWaits);
        MbarrierWait(&full[stage], phase);
        note(kTimelineFirstData);
      }
      using First = std::integral_constant<int, 0>;
      if constexpr (kRegisterA) {
        int kt = 0;
        for (; kt + 1 < w.k_tiles; kt += 2) {
          k_tile(kt, First{});
          k_tile(kt + 1, std::integral_constant<int, 1>{});
        }
        if (kt < w.k_tiles) k_tile(kt, First{});
      } else {
        for (int kt = 0; kt < w.k_tiles; ++kt) k_tile(kt, First{});
      }
      write_pending();  // items of fewer than two k-tiles, or no wgmmas
      if (P::kPingpong && threadIdx.x % 128 == 0) MbarrierArrive(&order[1 - wg]);
      WgmmaWaitGroup<0>();
      if (previous >= 0 && lane == 0) Release(&empty[previous]);
    };
    // m64 blocks of the tile at or past row M are not multiplied (their A rows are not
    // loaded, nothing of them is stored): with few rows, half or more of the tensor work.
    // (Unless the schedule multiplies them all: their stage rows hold zeros or stale values,
    // whose products land in rows that are never stored.)
    const int64_t rows_left = schedule.multiply_empty ? 64 * P::kMmaM : p.m - (w.m0 + first_row);
    if (rows_left > 64 * (P::kMmaM - 1)) {
      mainloop(std::integral_constant<int, P::kMmaM>{});
    } else if (P::kMmaM == 2 && rows_left > 0) {
      mainloop(std::integral_constant<int, 1>{});
    } else {
      mainloop(std::integral_constant<int, 0>{});
    }
    note(kTimelineMainloopDone, kTimelineMainloop2Done);
    if (w.fixup == kSm90StorePartial) {
      Sm90StorePartial<P>(stream_k, acc, first_row / 64, wg);
      note(kTimelineEpilogueIssued, kTimelineEpilogue2Issued);
      continue;
    }
    if (w.fixup == kSm90AddPartial) Sm90AddPartial<P>(stream_k, acc, first_row / 64, wg, w.partners);

    if constexpr (!P::kSwapped) {  // (swapped tiles: the general epilogue, transposed)
      if (kTmaStoresOnly || store.enabled) {
        if (kWithFused && store.fused) {  // 16-bit outputs only (MakeSm90Store)
          if constexpr (sizeof(TOut) == 2) {
            Sm90StoreTileFused<P, TOut, Handed::kUsed>(store, acc, w.m0 + first_row, w.n0, slab, wg,
                                                        reinterpret_cast<unsigned char*>(scratch), bias_word, bias_stage,
                                                        boxes_in_use);
            boxes_in_use = Handed::kUsed;
          }
        } else if constexpr (Handed::kUsed) {
          if constexpr (kRegisterA) {
            if (store.transposed) {
              Sm90WriteTransposedBoxes<P>(acc[0], p.epilogue.alpha, wg, reinterpret_cast<unsigned char*>(scratch),
                                          boxes_in_use);
              boxes_in_use = true;
              note(kTimelineEpilogueIssued, kTimelineEpilogue2Issued);
              continue;
            }
          }
          const Sm90BoxWriter<TOut> writer = box_writer();
#pragma unroll
          for (int c = 0; c < Handed::kBoxes; ++c) {
            if (c < Handed::kBoxes - kLateBoxes) {
              uint32_t box_words[16];
              Sm90PackBox<P, TOut>(acc, c, p.epilogue.alpha, box_words);
              Sm90WriteBoxWords<P, TOut>(writer, box_words, c, wg, reinterpret_cast<unsigned char*>(scratch),
                                         boxes_in_use || c >= 2);
            } else if constexpr (kLateBoxes > 0) {
              Sm90PackBox<P, TOut>(acc, c, p.epilogue.alpha, late_words[c - 2]);
            }
          }
          boxes_in_use = true;
          pending = kLateBoxes > 0;
        } else {
          Sm90StoreTile<P, TOut>(store, acc, w.m0 + first_row, w.n0, slab, p.epilogue.alpha, wg,
                                 reinterpret_cast<unsigned char*>(scratch), box_writer());
        }
        note(kTimelineEpilogueIssued, kTimelineEpilogue2Issued);
        continue;
      }
    }

    // Epilogue through shared memory, kEpilogueCols columns of one 64-row block at a time:
    // the fragments go to this warpgroup's scratch, then each thread applies the epilogue
    // to 4-column row pieces, so stores are coalesced vectors and the long epilogue code is
    // one loop body (unrolled per fragment it overflows the instruction cache).
    // Fragment layout (per warp, like mma.sync's m16n8): acc[mi][4 j + 2 h + e] is row
    // 16 warp + lane / 4 + 8 h, column 8 j + 2 (lane % 4) + e of the 64-row block.
    typename GemmEpilogue<TOut>::Offsets off = GemmEpilogue<TOut>::ForBatch(p, w.batch);
    off.out = slab * p.m * p.n;
    constexpr int kChunks = P::kBN / P::kEpilogueCols;
    constexpr int kPieces = 64 * P::kEpilogueCols / 4 / 128;  // 4-column pieces per thread
    constexpr int kPiecesPerRow = P::kEpilogueCols / 4;
    constexpr int kSwappedPitch = 68;  // floats per scratch row of a swapped tile's chunk
    static_assert(!P::kSwapped || (P::kEpilogueCols == 32 && kPieces == 4 &&
                                   P::kEpilogueCols * kSwappedPitch * 4 <= P::kEpilogueRegionBytes),
                  "a swapped chunk: 32 rows of D by 64 columns, four pieces per thread");
    static_assert(!P::kSwapped || !Loads::kMapsRows, "swapped tiles: GEMMs only");
    // A runtime loop keeps one copy of the store code; the fragment writes pick the
    // chunk's registers with compile-time indices (one guarded block per chunk).
#pragma unroll 1
    for (int c = 0; c < P::kMmaM * kChunks; ++c) {
      NamedBarrierSync(1 + wg, 128);  // the previous chunk's (or tile's) reads are done
#pragma unroll
      for (int mi = 0; mi < P::kMmaM; ++mi) {
#pragma unroll
        for (int cc = 0; cc < kChunks; ++cc) {
          if (mi * kChunks + cc != c) continue;
#pragma unroll
          for (int jj = 0; jj < P::kEpilogueCols / 8; ++jj) {
            const int j = cc * P::kEpilogueCols / 8 + jj;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int r = tile_row(warp * 16 + lane / 4 + 8 * h);
              if constexpr (P::kSwapped) {
                // Transposed: a scratch row per chunk column (a row of D); a warp's 32
                // values of one store land in 32 banks (2 (lane % 4) rows of 68 floats).
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                  scratch[(8 * jj + 2 * (lane % 4) + e) * kSwappedPitch + r] = acc[mi][4 * j + 2 * h + e];
                }
              } else {
                *reinterpret_cast<float2*>(&scratch[r * P::kEpiloguePitch + 8 * jj + 2 * (lane % 4)]) =
                    make_float2(acc[mi][4 * j + 2 * h], acc[mi][4 * j + 2 * h + 1]);
              }
            }
          }
        }
      }
      NamedBarrierSync(1 + wg, 128);
      const int64_t block_row = w.m0 + first_row + 64 * (c / kChunks);
      const int64_t chunk_col = w.n0 + (c % kChunks) * P::kEpilogueCols;
      // The chunk by rows of D: the tile's rows block_row ... (64) by its columns chunk_col ...
      // (32), or, swapped, D's rows chunk_col ... (32) by its columns block_row ... (64) (p is
      // then the swapped problem: D has p.n rows and p.m columns), so that each thread's
      // pieces lie along rows of D either way.
      constexpr int kRowPieces = P::kSwapped ? 16 : kPiecesPerRow;  // 4-column pieces per row
      constexpr int kPitch = P::kSwapped ? kSwappedPitch : P::kEpiloguePitch;
      const int64_t row0 = P::kSwapped ? chunk_col : block_row, col0 = P::kSwapped ? block_row : chunk_col;
      const int64_t rows_of_d = P::kSwapped ? p.n : p.m, cols_of_d = P::kSwapped ? p.m : p.n;
      if (col0 + tid % kRowPieces * 4 >= cols_of_d) continue;
      // All of this thread's pieces at once (same columns, rows 128 / kRowPieces apart).
      int64_t rows[kPieces];
      bool live[kPieces];
      float v[kPieces][4];
#pragma unroll
      for (int piece = 0; piece < kPieces; ++piece) {
        const int r = piece * (128 / kRowPieces) + tid / kRowPieces;
        rows[piece] = row0 + r;
        live[piece] = rows[piece] < rows_of_d;
        if constexpr (Loads::kMapsRows) {
          if (live[piece]) rows[piece] = loads.OutputRow(rows[piece]);
        }
        const float4 v4 = *reinterpret_cast<const float4*>(&scratch[r * kPitch + tid % kRowPieces * 4]);
        v[piece][0] = v4.x, v[piece][1] = v4.y, v[piece][2] = v4.z, v[piece][3] = v4.w;
      }
      GemmEpilogue<TOut>::StoreRows(p, off, rows, live, col0 + tid % kRowPieces * 4, v, vector_store);
    }
    note(kTimelineEpilogueIssued, kTimelineEpilogue2Issued);
  }
  write_pending();
  // The block's shared memory must outlive the TMA stores that read it. Their writes need
  // no wait: the grid's completion makes them visible to later work, and waiting for them
  // here would add their latency to the last tile's exposed epilogue.
  if (store.enabled && tid == 0) BulkWaitGroupRead<0>();
  if (boxes_in_use) {  // the store warp's last stores have read the boxes (with Aux: one pair)
    NamedBarrierSync(Handed::Free(wg, 0), Handed::kThreads);
    if (!(store.fused && store.with_aux)) NamedBarrierSync(Handed::Free(wg, 1), Handed::kThreads);
  }
  if (tid == 0 && wg < 2) timeline.Record(wg == 0 ? kTimelineConsumer0Exit : kTimelineConsumer1Exit);
}

#endif  // JG_SM90_ENABLED

// Whether a GEMM schedule gets an instance of the kernel per epilogue set (Sm90Epilogues),
// of which the launcher takes the smallest that holds the problem's. Code a launch never
// runs still costs: with all the epilogues the 16-bit 128 x 256 instances spill 130-140
// bytes and are ~130 KB; the plain ones are ~50 KB, the fused ones ~85 KB, neither spills,
// and they run plain products 1-2% and fused ones 2-3% faster (NOTES.md, session 38).
// (tf32's float outputs have no fused set.) Convolutions and the swapped tiles keep one
// instance with all of them.
template <class P, class Loads>
inline constexpr bool kSm90EpilogueInstances = !P::kSwapped && std::is_same_v<Loads, Sm90MatrixLoads>;

// The kernel: `loads` fills the ring (warpgroup 0), Sm90Consume multiplies and stores.
template <class P, class TIn, class TOut, bool kTransA, bool kTransB, class Loads, Sm90Epilogues kEpilogues>
__global__ void __launch_bounds__(P::kThreads, 1)
    Sm90GemmKernel(const __grid_constant__ Loads loads, const GemmProblem p, const Sm90Schedule<P> schedule,
                   const __grid_constant__ Sm90Store store, const Sm90StreamK stream_k, const Sm90Timeline timeline) {
#if defined(JG_SM90_ENABLED)
  extern __shared__ unsigned char smem_raw[];
  unsigned char* tiles_a = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  unsigned char* tiles_b = tiles_a + P::kStages * P::kTileABytes;
  float* scratch = reinterpret_cast<float*>(tiles_b + P::kStages * P::kTileBBytes);
  uint64_t* full =
      reinterpret_cast<uint64_t*>(reinterpret_cast<unsigned char*>(scratch) + P::kEpilogueBytes + P::kBiasStageBytes);
  uint64_t* empty = full + P::kStages;
  uint64_t* order = empty + P::kStages;
  const int warpgroup = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    timeline.Record(kTimelineEntry);
    loads.Prefetch();
    if (store.enabled) PrefetchTensorMap(&store.d);
    if (store.with_aux) PrefetchTensorMap(&store.aux);
    for (int s = 0; s < P::kStages; ++s) {
      MbarrierInit(&full[s], 1);                    // the producer's expect_tx arrival
      // One arrival per warp of the consumers that read a stage.
      MbarrierInit(&empty[s], (P::kPingpong ? 4 : 4 * P::kConsumers) * P::kClusterM);
    }
    MbarrierInit(&order[0], 1);
    MbarrierInit(&order[1], 1);
    FenceMbarrierInit();
  }
  // The peers' barriers must be initialized before anything is multicast to them.
  if constexpr (P::kClusterM > 1) {
    ClusterSync();
  } else {
    __syncthreads();
  }
  if (threadIdx.x == 0) timeline.Record(kTimelineStarted);

  if (warpgroup == 0) {
    if constexpr (P::kMovesRegisters) SetMaxRegistersDecrease<P::kProducerRegisters>();
    if (threadIdx.x == 0) {
      timeline.Record(kTimelineProducerRegisters);
      if constexpr (std::is_same_v<Loads, Sm90MatrixLoads>) {
        loads.template Produce<P, kTransA, kTransB>(p, schedule, tiles_a, tiles_b, full, empty, timeline);
      } else {
        loads.template Produce<P, kTransA, kTransB>(p, schedule, tiles_a, tiles_b, full, empty);
      }
    }
    // Warps 1 .. kConsumers: the consumers' store warps (Sm90HandedStores).
    if constexpr (Sm90HandedStores<P, TOut>::kUsed) {
      const int warp = threadIdx.x / 32;
      if (warp >= 1 && warp <= P::kConsumers && store.enabled) {
        Sm90StoreWarp<P, TOut>(p, schedule, store, warp - 1,
                         reinterpret_cast<unsigned char*>(scratch) + (warp - 1) * P::kEpilogueRegionBytes,
                         timeline);
      }
    }
  } else {
    if constexpr (P::kMovesRegisters) SetMaxRegistersIncrease<P::kConsumerRegisters>();
    if (threadIdx.x == 128) timeline.Record(kTimelineConsumerRegisters);
    Sm90Consume<P, TIn, TOut, kTransA, kTransB, Loads, kEpilogues>(p, schedule, warpgroup - 1, tiles_a, tiles_b,
                                                                   full, empty, order, scratch, store, stream_k,
                                                                   loads, timeline);
  }
  // A block leaves only when its peers no longer arrive on its barriers.
  if constexpr (P::kClusterM > 1) ClusterSync();
#endif
}

// Launches Sm90GemmKernel persistently: one block per SM (one cluster per kClusterM SMs),
// at most one per work item; stream-K (PlanSm90StreamK) when `workspace` holds its slots.
template <class P, class TIn, class TOut, bool kTransA, bool kTransB, class Loads>
cudaError_t LaunchSm90Kernel(const Loads& loads, const GemmProblem& p, int sm_count, cudaStream_t stream,
                             Sm90Workspace workspace = {}) {
  Sm90Store store = P::kSwapped ? Sm90Store{} : MakeSm90Store<TOut>(p);  // (swapped: the general epilogue)
  if constexpr (Loads::kMapsRows) {
    if (loads.MapsRows()) store = Sm90Store{};  // D's rows are not a TMA box: the general epilogue
  }
  auto* kernel = Sm90GemmKernel<P, TIn, TOut, kTransA, kTransB, Loads, Sm90Epilogues::kAll>;
  if constexpr (kSm90EpilogueInstances<P, Loads>) {
    if (store.enabled && !store.fused) {  // (with tf32's D written transposed, too)
      kernel = Sm90GemmKernel<P, TIn, TOut, kTransA, kTransB, Loads, Sm90Epilogues::kPlain>;
    } else if (store.enabled) {
      // (MakeSm90Store fuses 16-bit outputs only: no such instance for float ones)
      if constexpr (sizeof(TOut) == 2) {
        kernel = Sm90GemmKernel<P, TIn, TOut, kTransA, kTransB, Loads, Sm90Epilogues::kTmaStores>;
      }
    }
  }
  cudaError_t status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, P::kSmemBytes);
  if (status != cudaSuccess) return status;
  // A transposed D is written by the swapped tiles' general epilogue, or by the handed TMA
  // stores (the cooperative schedules) of register A (Sm90WriteTransposedBoxes).
  const bool transposed_boxes = store.enabled && !P::kPingpong && std::is_same_v<TIn, float> && kTransA;
  if (p.transposed_d != P::kSwapped && !(p.transposed_d && transposed_boxes)) return cudaErrorInvalidValue;
  const int64_t items = Sm90Schedule<P>::Items(p);
  if (items >= (int64_t{1} << 31)) return cudaErrorInvalidValue;  // the schedule's indices are 32-bit
  // Workers of the persistent grid: blocks, or clusters. A cluster's blocks must share a
  // GPC, so fewer clusters than SMs / kClusterM may fit at once (on the H200, 66 of 2
  // blocks, but only 30 of 4); the grid must not exceed that: its walk, and stream-K's
  // waits on partners, assume every worker runs. Asked once per kernel.
  int64_t workers = std::max(sm_count / P::kClusterM, 1);
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute cluster[1];
  if constexpr (P::kClusterM > 1) {
    config.blockDim = dim3(P::kThreads);
    config.dynamicSmemBytes = P::kSmemBytes;
    config.stream = stream;
    cluster[0].id = cudaLaunchAttributeClusterDimension;
    cluster[0].val.clusterDim.x = P::kClusterM;
    cluster[0].val.clusterDim.y = 1;
    cluster[0].val.clusterDim.z = 1;
    config.attrs = cluster;
    config.numAttrs = 1;
    static std::atomic<int> resident{0};
    if (resident.load(std::memory_order_relaxed) == 0) {
      int count = 0;
      config.gridDim = dim3(static_cast<unsigned>(P::kClusterM * workers));
      if (cudaOccupancyMaxActiveClusters(&count, kernel, &config) != cudaSuccess || count <= 0) count = -1;  // unknown
      (void)cudaGetLastError();
      resident.store(count, std::memory_order_relaxed);
      if (std::getenv("JAXGEMM_VERBOSE")) {
        std::fprintf(stderr, "jaxgemm: sm90 %d-block clusters: %d resident, at most %d launched\n", P::kClusterM,
                     count, static_cast<int>(workers));
      }
    }
    const int fit = resident.load(std::memory_order_relaxed);
    if (fit > 0) workers = std::min<int64_t>(workers, fit);
  }
  // Stream-K needs loads that start an item at any k-tile (the matrix loads; the conv fprop
  // loads walk their filter taps from the first), and the grid the plan was made for (with
  // a single shared wave, more workers than items).
  Sm90StreamK stream_k{};
  const Sm90StreamKPlan plan = PlanSm90StreamK(p, {P::kBM, P::kBN, P::kClusterM, P::kSwapped}, sm_count);
  const int64_t k_tiles = (p.k + P::kBK - 1) / P::kBK;
  if (std::is_same_v<Loads, Sm90MatrixLoads> && plan.items > 0 && plan.workers == workers && workspace.data &&
      workspace.bytes >= plan.bytes && plan.items * k_tiles < (int64_t{1} << 31)) {
    stream_k.partials = static_cast<float*>(workspace.data);
    stream_k.flags = reinterpret_cast<uint32_t*>(static_cast<unsigned char*>(workspace.data) + plan.flags_offset);
    stream_k.items = plan.items;
    status = cudaMemsetAsync(stream_k.flags, 0, plan.bytes - plan.flags_offset, stream);
    if (status != cudaSuccess) return status;
  }
  if (stream_k.items == 0) workers = std::min(workers, items);
  // (Keeping row blocks in step was measured on GEMMs only: the convolutions' loads skip.)
  const Sm90Schedule<P> schedule =
      Sm90Schedule<P>::For(p, stream_k.items, std::is_same_v<Loads, Sm90MatrixLoads>);
  const int64_t blocks = workers * P::kClusterM;
  const Sm90Timeline timeline = BeginSm90Timeline(blocks, stream);
  if constexpr (P::kClusterM == 1) {
    kernel<<<static_cast<unsigned>(blocks), P::kThreads, P::kSmemBytes, stream>>>(loads, p, schedule, store,
                                                                                 stream_k, timeline);
    status = cudaGetLastError();
  } else {
    config.gridDim = dim3(static_cast<unsigned>(blocks));
    status = cudaLaunchKernelEx(&config, kernel, loads, p, schedule, store, stream_k, timeline);
    if (status == cudaSuccess) status = cudaGetLastError();
  }
  if (status == cudaSuccess && timeline.stamps) {
    char what[160];
    std::snprintf(what, sizeof(what), "sm90 %dx%d%s%s, %lld x %lld x %lld, %lld items", P::kBM, P::kBN,
                  P::kClusterM > 1 ? " cluster 2" : "", P::kPingpong ? " pingpong" : "",
                  static_cast<long long>(p.m), static_cast<long long>(p.n), static_cast<long long>(p.k),
                  static_cast<long long>(items));
    ReportSm90Timeline(timeline, blocks, what, stream);
  }
  return status;
}

template <class TIn, class TOut>
cudaError_t LaunchSm90Gemm(const GemmProblem& given, int tile_m, int tile_n, int sm_count, cudaStream_t stream,
                           Sm90Workspace workspace) {
  // The swapped schedule multiplies D^T: A stored (m, k) becomes its K-major B.
  const bool swapped = Sm90SwappedTile(tile_m, tile_n);
  if (swapped && (sizeof(TIn) != 2 || given.trans_a || given.transposed_d)) return cudaErrorInvalidValue;
  const GemmProblem p = swapped ? Sm90Swapped(given) : given;
  int64_t stride_a = 0, stride_b = 0;
  if (!SingleBatchStride(p.batch, kOperandA, &stride_a) || !SingleBatchStride(p.batch, kOperandB, &stride_b)) {
    return cudaErrorInvalidValue;
  }
  const Sm90Batching batched{stride_a != 0 && p.batch.count > 1, stride_b != 0 && p.batch.count > 1};
  // Stored A is m x k (k x m when transposed), stored B k x n (n x k when transposed).
  TmaMatrix a{p.a, p.in_type, p.trans_a ? p.m : p.k, p.trans_a ? p.k : p.m, p.lda};
  TmaMatrix b{p.b, p.in_type, p.trans_b ? p.k : p.n, p.trans_b ? p.n : p.k, p.ldb};
  if (batched.a) a.batch = p.batch.count, a.batch_stride = stride_a;
  if (batched.b) b.batch = p.batch.count, b.batch_stride = stride_b;

  constexpr int kBytes = sizeof(TIn);
  constexpr bool kTf32 = kBytes == 4;
  a.tf32 = b.tf32 = kTf32;
  if (kTf32 && !p.trans_b) return cudaErrorInvalidValue;  // B not K-major

  cudaError_t status = cudaSuccess;
  auto launch = [&](auto policy, auto trans_a, auto trans_b) {
    using P = decltype(policy);
    constexpr bool kTransA = decltype(trans_a)::value, kTransB = decltype(trans_b)::value;
    Sm90MatrixLoads loads;
    loads.batched = batched;
    loads.a_rows = static_cast<int>(std::min<int64_t>(P::kBM, (p.m + 7) / 8 * 8));
    // A box: kBM rows of kBK k (one 128 B row each), or kMnBlock m x kBK k blocks; B
    // likewise with kBN (16-bit MN-major: 64 x 64 blocks).
    status = EncodeTmaMap(&loads.a, a, kTransA ? P::kMnBlock : P::kBK, kTransA ? P::kBK : loads.a_rows);
    if (status == cudaSuccess) {
      status = EncodeTmaMap(&loads.b, b, kTransB ? P::kBK : 64, kTransB ? P::kBN / P::kClusterM : P::kBK);
    }
    if (status == cudaSuccess) {
      status = LaunchSm90Kernel<P, TIn, TOut, kTransA, kTransB>(loads, p, sm_count, stream, workspace);
    }
  };
  auto with_layout = [&](auto policy) {
    using T = std::true_type;
    using F = std::false_type;
    if constexpr (decltype(policy)::kSwapped) {  // (B is K-major: LaunchSm90Gemm's check)
      p.trans_a ? launch(policy, T{}, T{}) : launch(policy, F{}, T{});
    } else if constexpr (kTf32) {
      // An MN-major tf32 A comes from registers: one m64 block per consumer only.
      if (!p.trans_a) {
        launch(policy, F{}, T{});
      } else if constexpr (decltype(policy)::kMmaM == 1) {
        launch(policy, T{}, T{});
      } else {
        status = cudaErrorInvalidValue;
      }
    } else if (p.trans_a) {
      p.trans_b ? launch(policy, T{}, T{}) : launch(policy, T{}, F{});
    } else {
      p.trans_b ? launch(policy, F{}, T{}) : launch(policy, F{}, F{});
    }
  };
  if (swapped) {
    if constexpr (!kTf32) with_layout(Sm90Policy<160, false, 1, kBytes, 2, true>{});
  } else if (tile_m == 256 && tile_n == 256) {
    with_layout(Sm90Policy<256, false, 2, kBytes>{});
  } else if (tile_m == 128 && tile_n == 256) {
    with_layout(Sm90Policy<256, false, 1, kBytes>{});
  } else if (tile_m == 128 && tile_n == 128) {
    with_layout(Sm90Policy<128, true, 1, kBytes>{});
  } else if (tile_m == 128 && tile_n == 64) {
    with_layout(Sm90Policy<64, true, 1, kBytes>{});
  } else if (tile_m == 64 && tile_n == 128) {
    with_layout(Sm90Policy<128, false, 1, kBytes, 1>{});
  } else if (tile_m == 64 && tile_n == 64) {
    with_layout(Sm90Policy<64, false, 1, kBytes, 1>{});
  } else if (tile_m == 192 && tile_n == 128 && !kTf32) {  // (16-bit only: not built for tf32)
    with_layout(Sm90Policy<128, false, 1, kBytes, 3>{});
  } else {
    return cudaErrorInvalidValue;
  }
  return status;
}

}  // namespace jaxgemm
