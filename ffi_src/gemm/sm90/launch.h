// Host-side entry to the sm90 (Hopper: TMA + wgmma) kernels; instantiated in gemm/instances/.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <utility>

#include "gemm/block_scales.h"
#include "gemm/problem.h"
#include "gemm/sm90/schedules.h"

namespace jaxgemm {

// The batch stride (elements) of `operand` when its batch offsets are one stride times the
// batch index (0: broadcast); false when the batch dims need more than one stride.
inline bool SingleBatchStride(const BatchLayout& batch, int operand, int64_t* stride) {
  *stride = 0;
  if (batch.rank == 0) return true;
  for (int d = 0; d < batch.rank - 1; ++d) {
    if (batch.stride[operand][d] != batch.stride[operand][d + 1] * batch.dims[d + 1]) return false;
  }
  *stride = batch.stride[operand][batch.rank - 1];
  return true;
}

// D^T = op(B)^T op(A)^T as a problem of its own: A and B trade places, each stored as it
// was (so each one's transposition flips), and D holds the product transposed. The
// epilogue's operands keep D's layout (GemmProblem::transposed_d).
inline GemmProblem Sm90Swapped(const GemmProblem& p) {
  GemmProblem q = p;
  std::swap(q.m, q.n);
  std::swap(q.a, q.b);
  q.in_type = p.BType();  // (other_b_fp8 stays: A's format is now the other one)
  std::swap(q.lda, q.ldb);
  for (int d = 0; d < kMaxBatchDims; ++d) std::swap(q.batch.stride[kOperandA][d], q.batch.stride[kOperandB][d]);
  q.trans_a = !p.trans_b;
  q.trans_b = !p.trans_a;
  q.transposed_d = true;
  return q;
}

// tf32 with A stored (m, k) and B stored (k, n) as the sm90 kernel runs it: wgmma reads a
// 32-bit B only K-major, so the kernel computes D^T = B^T A^T, where B^T is an A stored
// (k, m) (from registers, Sm90RegisterA) and A^T a K-major B, and its TMA-store epilogue
// writes each tile of D^T transposed into D (GemmProblem::transposed_d). Only for the plain
// epilogue (alpha * product) into a float32 D with 16-byte rows, unsplit; other problems
// come back unchanged (the lowering transposes B for those).
inline GemmProblem Sm90Transposed(const GemmProblem& p) {
  const bool takes = p.in_type == ElementType::kF32 && p.out_type == ElementType::kF32 && p.tf32 && !p.trans_a &&
                     !p.trans_b && !p.transposed_d && p.split_k == 1 && p.epilogue.IsIdentity() &&
                     p.ldd % 4 == 0 && reinterpret_cast<uintptr_t>(p.d) % 16 == 0;
  return takes ? Sm90Swapped(p) : p;
}

// Whether A comes from registers: an MN-major A (stored (k, m)) of a type wgmma reads from
// shared memory K-major only (tf32). The cooperative schedules only (one m64 block per
// consumer; see LaunchSm90Gemm).
inline bool Sm90RegisterA(const GemmProblem& p) { return WgmmaKMajorOnly(p.in_type) && p.trans_a; }

// Whether the sm90 kernel takes the problem: 16-bit inputs, or float32 inputs allowed to
// run as tf32; B K-major (stored (n, k)) for types wgmma reads K-major only;
// TMA-addressable operands: 16-byte row pitches, bases and batch strides, 32-bit coordinates.
inline bool Sm90Supports(const GemmProblem& p) {
  if (p.in_type == ElementType::kF32 && !p.tf32) return false;  // exact float32: SIMT
  if (WgmmaKMajorOnly(p.in_type) && !p.trans_b) return false;
  const int64_t align = 16 / ElementBytes(p.in_type);  // elements per 16 bytes
  int64_t stride_a, stride_b;
  return p.k > 0 && p.lda % align == 0 && p.ldb % align == 0 &&
         reinterpret_cast<uintptr_t>(p.a) % 16 == 0 && reinterpret_cast<uintptr_t>(p.b) % 16 == 0 &&
         p.m < INT32_MAX && p.n < INT32_MAX && p.k < INT32_MAX - 256 && p.batch.count < INT32_MAX &&
         SingleBatchStride(p.batch, kOperandA, &stride_a) && SingleBatchStride(p.batch, kOperandB, &stride_b) &&
         stride_a % align == 0 && stride_b % align == 0;
}

// Device memory the caller lends a launch: stream-K's partial tiles and flags, or with
// `tile_counter` the dynamic walk's counter (KernelRequest::dynamic_tiles).
struct Sm90Workspace {
  void* data = nullptr;
  size_t bytes = 0;
  bool tile_counter = false;
};

// Stream-K's single-wave plan (fewer items than workers) gives every worker a range of at
// least this much K (elements), and each item to at most kSm90StreamKMaxShare workers: a
// head adds its partners' fp32 tiles one after the other, ~1.3 us each from L2 for a
// 128 x 256 tile, against ~0.6 us per 64-deep k-tile of its mainloop.
constexpr int64_t kSm90StreamKMinRangeK = 2048;
constexpr int64_t kSm90StreamKMaxShare = 4;

// How many of `items` work items a persistent grid of `workers` (blocks or clusters) shares
// out stream-K, where its last wave (or its only one) is at most `max_fill_percent` full:
// - several waves: the last, partly filled wave and one full wave, so that every worker gets
//   between one and two items' worth of k-tiles. Shared items run slower than whole ones
//   (their workers leave the lockstep walk over K that lets concurrent tiles share operand
//   slices in L2, a partial tile goes through L2, and a full grid runs at a lower clock).
// - one wave (deep K): every item, each shared by two to kSm90StreamKMaxShare workers.
// Not with split-K (items of different K) or short K.
inline int64_t Sm90StreamKItems(int64_t items, int64_t workers, int64_t k, int64_t split_k, int max_fill_percent) {
  if (split_k != 1 || k < 256 || workers < 2) return 0;
  const int64_t last_wave = items % workers;  // the only wave's items when items < workers
  if (last_wave == 0 || last_wave * 100 > workers * max_fill_percent) return 0;
  if (items > workers) return workers + last_wave;
  const bool deep = items * k >= workers * kSm90StreamKMinRangeK && items * kSm90StreamKMaxShare >= workers;
  return deep ? items : 0;
}

// The blocks behind a schedule (a row of kSm90Schedules), in D's orientation: one block
// covers block_m x block_n of D; a cluster stacks cluster_m of them along M. A block has one
// consumer warpgroup per 64 rows, except the swapped one (160 x 128 of D, or 128 x 160 of
// D^T as the launch sees it), which has two, one per 64 columns of D.
struct Sm90Shape {
  int block_m = 0, block_n = 0, cluster_m = 0;
  bool swapped = false;
  constexpr int Consumers() const { return swapped ? 2 : block_m / 64; }
  constexpr bool Pingpong() const { return !swapped && cluster_m == 1 && block_m == 128 && block_n <= 128; }
};
constexpr Sm90Shape Sm90ShapeOfRow(const Sm90ScheduleRow& row) {
  return {row.BlockM(), row.tile_n, row.cluster_m, row.swapped};
}
inline bool Sm90ShapeOf(int tile_m, int tile_n, Sm90Shape* shape) {
  const Sm90ScheduleRow* row = FindSm90Schedule(tile_m, tile_n);
  if (row != nullptr) *shape = Sm90ShapeOfRow(*row);
  return row != nullptr;
}

// The table's consumer and pingpong columns are what the shapes imply (the cost model and
// stream-K read the shapes; the kernel's policies, the columns).
constexpr bool Sm90ShapesMatchTable() {
  for (const Sm90ScheduleRow& row : kSm90Schedules) {
    const Sm90Shape shape = Sm90ShapeOfRow(row);
    if (shape.Consumers() != row.consumers || shape.Pingpong() != row.pingpong) return false;
  }
  return true;
}
static_assert(Sm90ShapesMatchTable(), "kSm90Schedules: a row's consumers or pingpong disagree with its shape");

// The swapped schedule (Sm90Policy::kSwapped), named by the area of D a block covers:
// 160 x 128, run as 128 x 160 tiles of D^T (Sm90Swapped). 16-bit inputs with A stored
// (m, k) only (its transpose is then the kernel's K-major B).
inline bool Sm90SwappedTile(int tile_m, int tile_n) {
  const Sm90ScheduleRow* row = FindSm90Schedule(tile_m, tile_n);
  return row != nullptr && row->swapped;
}

// Whether a named schedule is a pingpong one (128 x 64, 128 x 128: two m64 blocks per
// consumer), which has no tf32 register A (Sm90RegisterA).
inline bool Sm90PingpongTile(int tile_m, int tile_n) {
  const Sm90ScheduleRow* row = FindSm90Schedule(tile_m, tile_n);
  return row != nullptr && row->pingpong;
}

// Whether stream-K may run at all: JAXGEMM_STREAM_K=0 turns it off (measurements). The
// workspace query then asks for none (GemmWorkspaceBytes), so the launch runs whole tiles,
// and the few-row heuristic splits K where it would have shared items out.
inline bool Sm90StreamKEnabled() {
  const char* v = std::getenv("JAXGEMM_STREAM_K");
  return !(v && v[0] == '0' && v[1] == '\0');
}

// The dynamic walk's tile counter in the workspace (KernelRequest::dynamic_tiles).
inline constexpr size_t kSm90TileCounterBytes = 16;

// How full a last wave may be for stream-K to pay (Sm90StreamKItems): with s the slowdown
// of a shared item against a whole one, sharing 1 + f items costs (1 + f) s against two
// whole waves, so it pays below f = 2 / s - 1. Measured s (H200, 8192^3 and 5120^3): 1.35-1.47
// for 16-bit inputs (tools/stream_k_scan.py had a 3-13% loss where the last wave was
// 73-88% full and a 0.2-8% gain where it was 6-52% full: 55%); for tf32 1.43-1.47 on 2-block
// clusters and 2.1 on single blocks, whose shared phase streams twice the operand bytes
// per tile from DRAM. Most of s is the clock: at the power cap a grid with every SM busy
// runs ~12% slower clocks than one whose last wave leaves half idle. A single wave of
// cooperative tiles shared out (deep K, few tiles) paid at 38-55% full and was even at 73%.
// The pingpong blocks (16-bit inputs) up to 30%: with 1.09 items per block (9% full) stream-K
// ran 1.03-1.47x as fast as whole tiles, and with 1.45 items (45%) 0.98-1.08x, where
// other schedules were faster still (1536^2 x 4096 / 14336, 384 x 6144 x 8192,
// 1024 x 3072 x 4096, 768 x 4096 x 14336, 2048 x 1536 x 8192).
// Never for items shorter than 4096 (64 16-bit k-tiles): there the partial tiles' fixed cost
// outweighs the wave it saves. At K = 2048, shared 128 x 256 tiles ran 0.67-0.70x XLA where
// whole 128 x 128 pingpong tiles ran 0.80-0.93x (2048 x 2112 and 3072 x 2048).
// JAXGEMM_STREAM_K_MAX_FILL=<percent> overrides it all (measurements: tools/stream_k_scan.py;
// the tests, which exercise every schedule's stream-K on small problems).
inline int Sm90StreamKMaxFillPercent(const GemmProblem& p, const Sm90Shape& shape) {
  if (const char* forced = std::getenv("JAXGEMM_STREAM_K_MAX_FILL")) return std::atoi(forced);
  if (p.k < 4096) return 0;
  if (p.in_type != ElementType::kF32) return shape.Pingpong() ? 30 : 55;
  return shape.cluster_m > 1 ? 35 : 0;
}

// Stream-K for an sm90 schedule on `sm_count` SMs: the items shared out (0: none) and the
// workspace they need, one fp32 block tile per block, then one flag per block and consumer.
struct Sm90StreamKPlan {
  int64_t items = 0;
  int64_t workers = 0;  // the grid's workers (blocks or clusters) the plan is for, all of them
  size_t flags_offset = 0, bytes = 0;
};
inline Sm90StreamKPlan PlanSm90StreamK(const GemmProblem& p, const Sm90Shape& shape, int sm_count) {
  Sm90StreamKPlan plan;
  const int64_t tiles_m = (p.m + shape.block_m - 1) / shape.block_m;
  const int64_t groups_m = (tiles_m + shape.cluster_m - 1) / shape.cluster_m;
  const int64_t items = groups_m * ((p.n + shape.block_n - 1) / shape.block_n) * p.batch.count * p.split_k;
  const int64_t workers = std::max(sm_count / shape.cluster_m, 1);
  plan.items = Sm90StreamKItems(items, workers, p.k, p.split_k, Sm90StreamKMaxFillPercent(p, shape));
  plan.workers = workers;
  if (plan.items == 0) return plan;
  const int64_t blocks = workers * shape.cluster_m;
  plan.flags_offset = static_cast<size_t>(blocks) * shape.block_m * shape.block_n * sizeof(float);
  plan.bytes = plan.flags_offset + static_cast<size_t>(blocks) * shape.Consumers() * sizeof(uint32_t);
  return plan;
}

// Stream-K workspace bytes of the named schedule (see LaunchSm90Gemm), 0 when it runs
// without stream-K or the name is unknown.
inline size_t Sm90StreamKBytes(const GemmProblem& p, int tile_m, int tile_n, int sm_count) {
  Sm90Shape shape;
  return Sm90ShapeOf(tile_m, tile_n, &shape) ? PlanSm90StreamK(p, shape, sm_count).bytes : 0;
}

// Launches the persistent sm90 kernel on `sm_count` multiprocessors. Schedules, by the
// output area a block (cluster) covers:
//   128 x 64, 128 x 128: pingpong (consumers alternate tiles, one's epilogue under the
//     other's mainloop);
//   128 x 256: cooperative (both consumers on each tile, 64 rows each);
//   256 x 256: cooperative 128 x 256 tiles in clusters of two blocks sharing B (multicast);
//   64 x 64, 64 x 128: one consumer (few rows: more stages of B in flight);
//   192 x 128: cooperative with three consumers (129-192 rows: one block row; 16-bit only);
//   160 x 128: swapped (the product transposed in 128 x 160 tiles; 16-bit, A stored (m, k)).
// tf32 with A MN-major (Sm90RegisterA) runs on the cooperative and one-consumer schedules
// only; a pingpong tile then returns cudaErrorInvalidValue.
// With `workspace` of at least Sm90StreamKBytes, a last partly filled wave is shared out
// stream-K; without, every block works on whole tiles.
template <class TIn, class TOut>
cudaError_t LaunchSm90Gemm(const GemmProblem& p, int tile_m, int tile_n, int sm_count, cudaStream_t stream,
                           Sm90Workspace workspace = {});

// fp8 (float8_e4m3fn) A (m, k) and B (n, k) with block scales (gemm/block_scales.h), D in
// bfloat16 or float32 (TOut), on the block-scaled kernel's 128 x 192 tiles: each k-tile's
// products promoted into fp32 times its scales. One batch dim at most, on every operand.
// Returns cudaErrorInvalidValue for problems it does not take (Sm90Supports' and these).
template <class TOut>
cudaError_t LaunchSm90BlockScaledGemm(const GemmProblem& p, const BlockScales& scales, int sm_count,
                                      cudaStream_t stream);

}  // namespace jaxgemm
