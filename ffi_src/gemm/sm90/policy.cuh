// The sm90 kernel's compile-time shape (Sm90Policy): a schedule's tile, consumers,
// pingpong or cooperative, cluster, stages, shared-memory and register budgets, for one
// input size; and the policies of the rows of kSm90Schedules (schedules.h).
#pragma once
#include <algorithm>
#include <type_traits>
#include <utility>

#include "gemm/sm90/schedules.h"

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
// one half empty: every B tile then feeds a single block. 512 threads enter with 128
// registers each, and ptxas holds every instruction to that entry budget: an m64n128
// wgmma's 64 accumulators fit it, an m64n256's 128 do not (tools/register_budget_probe.cu).
// kSwapped (cooperative, two consumers, 16-bit, no cluster): the kernel multiplies the
// product transposed, D^T = op(B)^T op(A)^T (Sm90Swapped), so that D's few rows are the
// columns of its tiles, whose width (kBN = 160) needs no multiple of 64; the general
// epilogue writes each tile of D^T transposed into D (every epilogue; no TMA stores).
// For 257-320 rows: two column blocks of 160 instead of three 128-row blocks, one at most
// half full.
// kBlockScaled (fp8, cooperative, one block): each 128-deep k-tile's products are summed in
// temporary accumulators and added into the fp32 ones times the k-tile's block scales of
// their row and column (Sm90PromoteBlock), which the producer loads into a small stage of
// their own beside each operand stage (Sm90ScaleLoads; gemm/block_scales.h).
// The epilogues an instance of the kernel holds: kPlain, D = alpha * acc through TMA stores
// (Sm90StoreTile, or the handed boxes); kTmaStores, those and the fused bias / activation /
// Aux TMA-store epilogue (Sm90StoreTileFused); kAll, also the general epilogue through
// shared memory (C, residual, float32 outputs with a fused epilogue, the convolutions'
// mapped rows, the swapped tiles' D^T; MakeSm90Store says which problems need it).
enum class Sm90Epilogues { kPlain, kTmaStores, kAll };

template <int kTileN, bool kPingpongTiles = false, int kClusterBlocksM = 1, int kElementBytes = 2,
          int kConsumerWarpgroups = 2, bool kSwappedOperands = false, bool kBlockScaledInputs = false>
struct Sm90Policy {
  static constexpr int kRowBytes = 128;  // one k-tile row: one 128 B swizzle row
  static constexpr int kConsumers = kConsumerWarpgroups;
  static constexpr bool kPingpong = kPingpongTiles;
  static constexpr bool kSwapped = kSwappedOperands;
  static constexpr bool kBlockScaled = kBlockScaledInputs;
  static constexpr int kBScaleRows = 1;  // B's rows per block scale (Sm90BlockScaledGroupsPolicy: 64)
  static_assert(!kBlockScaled || (kElementBytes == 1 && !kPingpong && kClusterBlocksM == 1 && !kSwapped),
                "block scales: fp8 inputs, cooperative, one block");
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
  // full[kStages], empty[kStages], order[2] (pingpong: whose turn to run its mainloop), then
  // the dynamic schedule's tile queue (Sm90TileQueue): full[kQueueDepth], empty[kQueueDepth]
  // and kQueueDepth 32-bit work items.
  static constexpr int kQueueDepth = 4;
  static constexpr int kBarrierBytes = (2 * kStages + 2 + 2 * kQueueDepth) * 8 + kQueueDepth * 4;
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
  // Where the barriers start, from the 1 KB-aligned start of the stages.
  static constexpr int kBarrierOffset = kStages * kStageBytes + kEpilogueBytes + kBiasStageBytes;
  // Block scales: per stage, the k-tile's scales of the tile's kBM rows then of its kBN
  // columns (float32), behind the barriers on a 128 B boundary (TMA's box alignment).
  static constexpr int kScaleStageBytes = kBlockScaled ? (kBM + kBN) * 4 : 0;
  static constexpr int kScaleOffset = (kBarrierOffset + kBarrierBytes + 127) / 128 * 128;
  static constexpr int kEndBytes =
      kBlockScaled ? kScaleOffset + kStages * kScaleStageBytes : kBarrierOffset + kBarrierBytes;
  // + 1 KB so the stages can start on a 1 KB boundary (the 128 B swizzle's period).
  static constexpr int kSmemBytes = kEndBytes + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "over the shared memory of one block");
  // 2 x 232 + 40 (3 x 152 + 40) registers x 128 threads fill the 64 K register file. ptxas
  // compiles the consumers' code for the raised budget (the SASS uses up to R229), but each
  // single instruction must fit the entry budget of 65536 / kThreads = 168 (128 with three
  // consumers; tools/register_budget_probe.cu). One consumer needs no setmaxnreg: 256 threads enter
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

// The policy of row kRow of kSm90Schedules (sm90/schedules.h) for kElementBytes-byte inputs.
template <int kRow, int kElementBytes>
using Sm90RowPolicy = Sm90Policy<kSm90Schedules[kRow].kernel_n, kSm90Schedules[kRow].pingpong,
                                 kSm90Schedules[kRow].cluster_m, kElementBytes, kSm90Schedules[kRow].consumers,
                                 kSm90Schedules[kRow].swapped, kSm90Schedules[kRow].block_scaled>;

// The policy of schedule kTileM x kTileN (a compile error where there is none).
template <int kTileM, int kTileN, int kElementBytes>
using Sm90TilePolicy = Sm90RowPolicy<Sm90ScheduleIndex(kTileM, kTileN), kElementBytes>;

// The block-scaled fp8 kernel's schedule: the table's block_scaled row (one, for now).
using Sm90BlockScaledPolicy = Sm90RowPolicy<Sm90FirstScheduleFor(&Sm90ScheduleRow::block_scaled), 1>;
static_assert(Sm90BlockScaledPolicy::kBlockScaled, "kSm90Schedules: no block_scaled row");

// The same with one scale of B per 64 of its rows (gemm/block_scales.h's groups: 128 x 128
// weight tiles), so that a promotion is one FFMA a value (Sm90PromoteBlockGroups).
struct Sm90BlockScaledGroupsPolicy : Sm90BlockScaledPolicy {
  static constexpr int kBScaleRows = 64;
  static_assert(kBN % kBScaleRows == 0 && kBN <= 256, "whole groups of columns, at most four of them a tile");
};

// f(std::integral_constant<int, row>) for each row of kSm90Schedules, in order.
template <class F, int... kRows>
void ForEachSm90Row(F&& f, std::integer_sequence<int, kRows...>) {
  (f(std::integral_constant<int, kRows>{}), ...);
}
template <class F>
void ForEachSm90Schedule(F&& f) {
  ForEachSm90Row(f, std::make_integer_sequence<int, kSm90ScheduleCount>{});
}

}  // namespace jaxgemm
