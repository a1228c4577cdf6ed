// Which work items each block of the persistent grid takes, in the order every role walks
// them (Sm90Schedule: whole tiles, then stream-K pieces, stream_k.h; or, in the dynamic
// walk, the tiles its cluster takes from a counter, through Sm90TileQueue), and stream-K's
// fixup: a piece's partial sums through the workspace (Sm90StorePartial) and their sum
// at the item's head (Sm90AddPartial).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/fast_divmod.h"
#include "common/ptx_sm90.cuh"
#include "gemm/problem.h"
#include "gemm/sm90/policy.cuh"
#include "gemm/sm90/stream_k.h"
#include "gemm/tile_scheduler.cuh"

namespace jaxgemm {

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
  int32_t taken;  // the dynamic walk: items this walker has read from the tile queue
};

// The dynamic walk's queue in shared memory, behind Sm90GemmKernel's full, empty and order
// barriers (Sm90Policy::kBarrierBytes): a ring of kQueueDepth work items, each slot with a
// full barrier (one arrival, by the cluster's first block's producer thread, which
// publishes the item to every block of the cluster) and an empty barrier in the cluster's
// first block (one arrival per reading warp of every block of the cluster).
template <class P>
struct Sm90TileQueue {
  uint64_t* full;
  uint64_t* empty;
  uint32_t* items;

  // `stages`: the 1 KB-aligned start of the kernel's shared memory.
  __device__ __forceinline__ static Sm90TileQueue At(unsigned char* stages) {
    uint64_t* first = reinterpret_cast<uint64_t*>(stages + P::kBarrierOffset) + 2 * P::kStages + 2;
    return {first, first + P::kQueueDepth, reinterpret_cast<uint32_t*>(first + 2 * P::kQueueDepth)};
  }
  __device__ __forceinline__ static Sm90TileQueue Here() {
    extern __shared__ unsigned char sm90_dynamic_smem[];
    return At(reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(sm90_dynamic_smem) + 1023) &
                                               ~uintptr_t(1023)));
  }
};

// Work items are cluster tiles: kClusterM vertically adjacent output tiles, one per block
// of the cluster (a cluster is one block without clusters). A "worker" is a block, or a
// cluster (Step() of them). Each worker walks whole items First(), First() + Step(), ...
// below `sk_first`. Stream-K (when sk_first < total): the remaining items, between one and
// two workers' worth (or all of them, fewer than the workers), are cut into k-tile ranges
// of equal length, one per worker, so that no worker idles through a last, partly filled
// wave (sm90/stream_k.h). Built on the host
// (For), so that a work item's mapping is multiplies and shifts (FastDivmod): with 64-bit
// divisions, every role spent ~1 us of the kernel's start on the first item's (the
// producer's first TMA load came 1.7 us after the block's start).
template <class P>
struct Sm90Schedule {
  using Work = Sm90Work;
  using Cursor = Sm90Cursor;
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
  // The dynamic walk: the launch's tile counter (zeroed before it). Null: the static walk.
  uint32_t* next_item;

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
    // in L2 (960 x 8192^2 on 128 x 128 tiles 611 -> 740 TFLOP/s,
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
    s.next_item = nullptr;
    return s;
  }

  __device__ __forceinline__ static int32_t First() { return blockIdx.x / P::kClusterM; }
  __device__ __forceinline__ static int32_t Step() { return gridDim.x / P::kClusterM; }

  // (Every thread, before the roles start: nothing to prepare; Sm90GroupedSchedule's tables.)
  __device__ __forceinline__ void Prepare() const {}

  // Rows of item w a consumer multiplies from first_row on (Sm90Consume): those below M,
  // or all of them where the schedule keeps row blocks in step.
  __device__ __forceinline__ int64_t RowsLeft(const GemmProblem& p, const Sm90Work& w, int first_row) const {
    return multiply_empty ? 64 * P::kMmaM : p.m - (w.m0 + first_row);
  }

  // Worker First()'s walk: its stream-K range is worked out once, here.
  __device__ __forceinline__ Sm90Cursor Start() const {
    Sm90Cursor c{First(), 0, 0, 0, 0};
    if (sk_first < total) {
      c.begin = c.iter = Sm90StreamKBegin(sk_k_tiles, First(), Step());
      c.end = Sm90StreamKBegin(sk_k_tiles, First() + 1, Step());
    }
    return c;
  }

  // The next work item of this block into *w; false when the walk is over.
  __device__ __forceinline__ bool Next(const GemmProblem& p, Sm90Cursor& c, Sm90Work* w) const {
    if (next_item != nullptr) return Take(p, c, w);
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

  // The dynamic walk's next item (no stream-K): the cluster's first block's producer thread
  // (thread 0) takes the next item from the counter once its queue slot is free and
  // publishes it; every walker (the producer, consumer and store warps of each block) reads
  // it from the slot and frees it, one arrival per warp. A block that starts late, its SM
  // held by another kernel, takes fewer items instead of delaying its static share. Items
  // past the last (the counter runs on) end every walk.
  __device__ __forceinline__ bool Take(const GemmProblem& p, Sm90Cursor& c, Sm90Work* w) const {
#if defined(JG_SM90_ENABLED)
    const Sm90TileQueue<P> queue = Sm90TileQueue<P>::Here();
    const int slot = c.taken % P::kQueueDepth;
    const uint32_t phase = (c.taken / P::kQueueDepth) & 1;
    ++c.taken;
    const uint32_t rank = P::kClusterM > 1 ? ClusterRank() : 0;
    if (threadIdx.x == 0 && rank == 0) {
      MbarrierWait(&queue.empty[slot], phase ^ 1);
      const uint32_t taken = atomicAdd(next_item, 1u);
      if constexpr (P::kClusterM == 1) {
        StoreShared32(SharedAddress(&queue.items[slot]), taken);
        MbarrierArrive(&queue.full[slot]);
      } else {
        for (uint32_t r = 0; r < P::kClusterM; ++r) PublishCluster32(&queue.items[slot], &queue.full[slot], r, taken);
      }
    }
    // The producer thread (thread 0) reads alone; consumer and store warps read with all
    // their lanes, then lane 0 frees the slot for the warp (the empty barrier's count).
    const bool alone = threadIdx.x == 0;
    MbarrierWait(&queue.full[slot], phase);
    const int32_t item = static_cast<int32_t>(LoadShared32(SharedAddress(&queue.items[slot])));
    if (!alone) __syncwarp();
    if (alone || threadIdx.x % 32 == 0) {
      if (rank == 0) {
        MbarrierArrive(&queue.empty[slot]);
      } else {
        MbarrierArriveClusterRelease(&queue.empty[slot], 0);
      }
    }
    if (item >= total) return false;
    *w = Get(p, item);
    return true;
#else
    return false;
#endif
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

#endif  // JG_SM90_ENABLED

}  // namespace jaxgemm
