// The Hopper heuristic: which schedule (a row of kSm90Schedules), split and grid a problem
// gets, from a cost model fitted to measurements on an H200 (docs/kernels.md, section 6).
// Host code only; RunGemm (dispatch.cu) and the nanobind module's queries call it.
#include "gemm/sm90/heuristic.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "gemm/sm90/launch.h"
#include "gemm/sm90/schedules.h"

namespace jaxgemm {
namespace {


// The sm90 schedules, by the output area one block (cluster) covers, with their measured
// relative speeds (128 x 64, made for GEMMs with few rows, runs ~0.6x as fast as the others
// on large problems). 64 x 128 (one consumer, 8 stages) keeps more of B in flight, but in
// single waves that fill the SMs (96-256 rows, N = 4096 / 8192, K = 4096-14336) it ran
// 0.85-0.99x as fast as 128 x 64 (two consumers) over the same items, so the 64-row tile is
// the choice only where it makes fewer waves (777 x 1234 x 4321; at M = 128, N = K = 8192
// the two run equal). (In half-filled waves it was ~10% faster, but splits that fill the
// SMs beat both.) On large problems its speed is a guess below 128 x 64's
// (a third of the reuse per loaded byte).
// 128 x 128 (pingpong): 0.84-0.85 of 128 x 256's speed over several waves and 0.945 in
// one wave of equal items (3072x5120x7168, 512x14336x4096, 1024^2 x 32768).
// Its block holds two tiles at once, one per consumer, so up to two waves of them are its
// single wave; and the cooperative tiles pay an exposed epilogue per item
// (kCooperativeEpilogueK), which the pingpong hides under the other consumer's mainloop.
// With that term its multi-wave speed is 0.89: fitted with the two figures to a sweep of
// 20 shapes (2048^2 x 512 ... 8192^3, and two of the shapes above) where 128 x 128 beat the
// cooperative tiles by 1-9% at K <= 4096 in few waves and lost 5% at K = 8192.
// tf32 keeps its older figures (64 x 128 at 1.05, 128 x 128 at 0.84, no epilogue term): the
// sweeps that moved the 16-bit ones were bf16 only.
struct Sm90Candidate {
  Sm90Tile tile;
  double speed, single_wave_speed, tf32_speed, tf32_single_wave_speed;
};
constexpr Sm90Candidate kSm90Candidates[] = {{{256, 256}, 1.00, 0.96, 1.00, 0.96},
                                             {{128, 256}, 0.99, 0.99, 0.99, 0.99},
                                             {{128, 128}, 0.89, 0.94, 0.84, 0.94},
                                             {{128, 64}, 0.60, 0.99, 0.60, 0.99},
                                             {{64, 128}, 0.50, 0.85, 0.50, 1.05},
                                             {{192, 128}, 0.90, 0.95, 0.0, 0.0},
                                             {{160, 128}, 0.88, 0.84, 0.0, 0.0}};

// Every candidate is a schedule of the table, with a tf32 speed where (and only where) the
// schedule is built for tf32. (64 x 64 is no candidate: only the few-row rule picks it.)
constexpr bool CandidatesAreSchedules() {
  for (const Sm90Candidate& c : kSm90Candidates) {
    const Sm90ScheduleRow* row = FindSm90Schedule(c.tile.m, c.tile.n);
    if (row == nullptr || (c.tf32_speed > 0) != row->tf32) return false;
  }
  return true;
}
static_assert(CandidatesAreSchedules(), "kSm90Candidates and kSm90Schedules (sm90/schedules.h) disagree");

// The pingpong schedules read MN-major operands more slowly; the cooperative tiles' times
// do not depend on the layout (within 1%). Against the layout of the fit above (K-major A,
// MN-major B: NN), over six shapes (2048^3, 3072 x 2048 x 2048, 1536 x 2816 x 2048,
// 4096^2 x 1024, 2048^2 x 1024, 8192^2 x 512) the pingpong 128 x 128 took
// 1.115x as long with both operands MN-major (A stored (k, m), B (k, n)), 1.04x with A
// MN-major and B K-major, and 0.99x with both K-major (taken as 1). Its speed is divided
// by those, and 128 x 64's (the same schedule, unmeasured) too. (tf32 pingpong operands
// are always K-major: an MN-major tf32 A takes the register-A schedules, Sm90Considered.)
double PingpongLayoutSpeed(const GemmProblem& p) {
  if (!p.trans_a) return 1.0;
  return p.trans_b ? 0.96 : 0.90;
}

// The pingpong 128 x 128's speed beyond this many waves (see Sm90Cost).
constexpr double kPingpongManyWaves = 6;
constexpr double kPingpongManyWaveSpeed = 0.84;

// The exposed epilogue of a cooperative 128 x 256 item (both consumers finish together and
// write their boxes before the next item's mainloop), as K units of its mainloop, by the
// fit above (16-bit inputs): 256 in a single wave, with the start and the last drain. Over
// many waves only part of it recurs per wave: 128 per wave plus 128 once fits the sweep in
// ffi_src/gemm/NOTES.md's reference data (35 NN shapes, K = 512-8192: with 256 per wave
// 8192 x 4096 x 1024, 8192^2 x 1024, 6144^2 x 1024 and 6144 x 4096 x 1024 stayed on the
// pingpong, 2.5-4.5% slower than the clusters; ~0.7 us per tile, as the timeline shows, is
// ~70 K units). The price: around 4
// waves of pingpong tiles at K = 2048 the clusters now win the model by a hair and ran 1-2%
// slower (4096 x 2048, 2048 x 4096, 512 x 16384 x 2048).
constexpr double kCooperativeEpilogueK = 128;
constexpr double kCooperativeTailK = 128;
// fp8 products writing Aux (fp8.dense's forward, z beside y): the fused epilogue sends both
// through one pair of boxes, waiting for each block's stores before the next, and the
// mainloop it is counted in runs twice as fast. On one H100 (s61,
// tools/fp8_forward_sweep.py, bias + gelu + z) the cooperative 256 x 256 took 0.396 ms at
// 32768 x 4096 x 1024 against the pingpong 128 x 128's 0.369, and 0.229 against 0.220 at
// 32768 x 1024 x 4096 (plain, 0.246 against 0.266 and 0.194 / 0.196): 8x the term puts
// both on the pingpong and leaves K >= 8192 (16384 x 4096 x 14336) cooperative. Measured
// with it (same H100): 0.369 and 0.220 ms; fp8.dense's step 1.356 -> 1.327 and 1.120 -> 1.105.
constexpr double kFp8AuxEpilogueScale = 8;
// At K <= 256 an item is a few k-tiles and then its boxes, so over many waves both schedules
// are bound by writing the output, and the cooperative tiles ran 0-10% faster (8192^2 x 64
// and x 256; 8192 x 4096 x 256 0.795 against the pingpong's 0.751, 8192^2 x 256 0.830
// against 0.767): no epilogue term there. Within two waves of their items
// the pingpong's hidden epilogue won instead, by 10-18% (H200, bf16, x XLA, 128 x 256 or
// 256 x 256 -> 128 x 128): 1024 x 4096 x 256 0.722 -> 0.852, 2048^2 x 256
// 0.738 -> 0.866, 512 x 8192 x 256 0.721 -> 0.844, 8192 x 512 x 256 0.743 -> 0.866,
// 256 x 16384 x 256 0.789 -> 0.920, 256 x 12288 x 64 0.640 -> 0.748, 2048 x 4096 x 256
// 0.878 -> 0.972, 2048^2 x 192 0.720 -> 0.858, and batched 64 x 256^3 0.835 -> 0.937,
// 16 x 512^2 x 256 0.787 -> 0.913, 8 x 1024^2 x 256 1.012 -> 1.109. At about four waves
// they tied (4096^2 x 256 0.770 against 0.777, 2048 x 8192 x 256, 16384 x 1024 x 256), so
// the term applies up to two. The 192-row tile keeps the picks of its own fit (kTallRows;
// none at K <= 256 measured slower than the pingpong: 768 x 12288 x 256 1.028 against 0.936).
constexpr double kShallowExposedMaxWaves = 2;

// float32 products of 16-bit inputs (an unsplit GEMM's: a split's partials are costed by
// kSplitPartialCost) write twice the bytes at the same per-SM pace of TMA stores (~4.3 us
// per 128 x 256 float tile against ~1.6 us for bf16), so the cooperative tiles'
// exposed epilogue per wave grows, at any K, while the pingpong still writes one consumer's
// tile under the other's mainloop. 192 per wave (and the 16-bit tail once) fits a sweep of
// 44 shapes (H200, bf16 inputs, float32 outputs): 256 put the pingpong on
// products of K = 8192 where it ran 5-6% behind 128 x 256, 384 also on the large squares at
// K = 2048-4096 (4% behind). Measured, x XLA, the old pick -> the new: 8192^2 x 64
// 0.900 -> 0.915, 4096^2 x 256 0.795 -> 0.847, 256 x 12288 x 256 0.886 -> 0.975,
// 8192^2 x 1024 0.852 -> 0.869, 1024 x 16384 x 1024 0.835 -> 0.885, 1536 x 16384 x 512 with A
// stored (k, m) 0.763 -> 0.796; deep products keep theirs (4096^3: 256 x 256 0.986, the
// pingpong 0.947), as does 2048^3 with A stored (k, m) (128 x 256 0.904, the pingpong 0.847).
constexpr double kCooperativeFloatEpilogueK = 192;
bool FloatOutput(const GemmProblem& p) {
  return p.in_type != ElementType::kF32 && p.out_type == ElementType::kF32 && p.split_k == 1;
}

// The narrow tiles' single-wave speeds hold where streaming B bounds the product (at most
// 128 rows). With more rows a single wave is bound by the tensor cores, which one consumer
// warpgroup (64 x 128) or a 64-column tile keeps less busy: both then ran at ~0.62 of
// those speeds (1024 x 1024 x 32768, unsplit: 64 x 128 483 and 128 x 64 463 TFLOP/s against
// 734 for 128 x 256 split 4). Already at 192 and 256 rows with N = 4096,
// 128 x 128 split 2 ran 1.05-1.38x as fast as the 64 x 128 the old 256-row bound left
// (256 x 4096 x 14336: 656 against 474 TFLOP/s).
constexpr int64_t kStreamingRows = 128;
constexpr double kNarrowComputeBound = 0.62;
constexpr int64_t kTf32StreamingRows = 256;  // tf32's older bound (not re-measured)

// One consumer warpgroup (64-row tiles) or 64-column tiles: made for products with few rows.
constexpr bool IsNarrow(Sm90Tile t) { return t.m == 64 || t.n == 64; }

// 192 x 128 (three consumers; GEMMs with 16-bit inputs only) is for 129-192 rows and twice
// that: 128-row tiles cover 129-192 rows with two row blocks, the second at most half full,
// so that the full ones bound the time, and every B tile is read by two blocks. Measured
// (H200, bf16, x XLA, the old pick -> 192 x 128 at the heuristic's
// split): 192 x 6144 x 14336 0.509 -> 0.826, 192 x 14336 x 4096 0.556 -> 0.894,
// 192 x 8192^2 0.747 -> 0.991, 160 x 8192^2 0.481 -> 0.796, 192 x 4096 x 14336 0.634 -> 0.846,
// 384 x 8192^2 0.827 -> 0.960. It lost at 256 rows (two row blocks, one a third full: 0.42
// against 0.87) and 288 (0.57 against 0.63, 128 x 256), and won at 320 only by 7% once the
// last row block multiplied its empty m64 block too (0.62 -> 0.73 against 0.68; before, that
// block ran ahead of the full ones and stopped sharing their B tiles in L2), so it is
// considered where the last row block has rows for all three consumers (129-192 rows,
// 321-384). Its speeds are fitted to single waves, whole or shared stream-K (0.95 / 0.90;
// no tf32 figures: not built for it); over two waves it ran 4% behind the pingpong
// (384 x 16384 x 1024: 0.917 against 0.956), hence a lower speed beyond one wave.
// Beyond 384 rows (unsplit; rows padded to 192 by at most 1/8) it is for waves it fills
// better: 768 x 4096 x 8192 makes 96 items of 128 x 256 (0.73 of a wave), 384 of 128 x 128,
// 128 of 192 x 128. Measured (H200, bf16, x XLA, the old pick -> 192 x 128):
// 768 x 4096 x 8192 0.826 -> 0.975, 3072 x 1024 x 8192 0.819 -> 0.970, 768 x 4096 x 14336
// 0.883 -> 0.984 (128 x 128 split 2), 768 x 4096 x 2048 / 4096 0.807 / 0.764 -> 0.995 / 0.951,
// 768 x 1536 x 14336 0.733 -> 0.885, 3072 x 384 x 14336 0.708 -> 0.847, 12288 x 192 x 4096
// 0.714 -> 0.804, and at short K 768 x 12288 x 256 0.936 -> 1.028, 768 x 4096 x 512
// 0.709 -> 0.837. There its epilogue counts as the cooperative tiles' beyond one wave. With A
// stored (k, m) it ran ~6% slower than A stored (m, k) (768 x 4096 x 8192 0.919 against
// 0.975, 1536 x 2048 x 14336 0.915 against 0.972), and lost 6144 x 384 x 8192 to the
// pingpong's shared wave (0.805 against 0.851), hence kTallMnMajorASpeed. The picks at
// 129-384 rows stand as the first figures fitted them (those above are not applied there).
constexpr int64_t kTallRows = 192, kTallTileMaxRows = 384;
constexpr double kTallManyWaveSpeed = 0.85;
constexpr double kTallMnMajorASpeed = 0.94;
constexpr bool IsTall(Sm90Tile t) { return t.m == kTallRows; }
int64_t TallRowBlocks(const GemmProblem& p) { return (p.m + kTallRows - 1) / kTallRows; }
// The 192-row blocks pad the rows by at most 1/8.
bool TallRowsPadLittle(const GemmProblem& p) { return 8 * TallRowBlocks(p) * kTallRows <= 9 * p.m; }
// Up to 384 rows: the last row block holds more than 128 rows (all three consumers have
// some); beyond, an unsplit product whose rows the blocks pad little.
bool TallTileFits(const GemmProblem& p) {
  if (p.m <= kTallTileMaxRows) return (p.m - 1) % kTallRows >= 128;
  return p.split_k == 1 && TallRowsPadLittle(p);
}

// Shallow products (K <= 128, 16-bit inputs) are bound by writing the output: an item is
// one or two k-tiles, then its boxes. There 192 x 128 ran fastest over a wave or more of its
// items, against every other schedule (H200, bf16, x XLA, the old pick -> 192 x 128):
// 8192^2 x 32 0.822 -> 0.990, 8192^2 x 64 0.797 -> 0.974, 16384 x 4096 x 64
// 0.798 -> 0.965, 4096^2 x 64 0.735 -> 0.806, 8192^2 x 128 0.794 -> 0.839, and batched
// attention-like products (q k^T, B stored (n, k)): 32 x 2048^2 x 64 0.863 -> 0.939,
// 64 x 1024^2 x 64 0.814 -> 0.950, 128 x 512^2 x 64 0.814 -> 0.901, 16 x 2048^2 x 128
// 0.814 -> 0.876, 8 x 4096^2 x 128 0.853 -> 0.875, 32 x 1024^2 x 128 0.777 -> 0.836; even at
// 4096^2 x 128 and 16 x 1024^2 x 128 (0.768 / 0.767 against the pingpong's 0.772 / 0.777).
// At K = 192 it tied (8192^2: 0.873 against 0.865) and at K = 256 it lost (4096^2 0.733
// against 0.764, 8 x 2048^2 0.761 against 0.793), where the mainloop counts again and the
// wave model decides. Every measured row count padded to 192 by at most 1/8 (512, 1024, ...);
// others are left to the wave model, as are products of less than a wave of such items.
// With float32 outputs (16-bit inputs) the pingpong 128 x 128 ran faster (8192^2 x 64 0.916
// against 0.902, 8 x 4096^2 x 128 0.933 against 0.866, 1024 x 8192 x 64 1.031 against 1.005),
// so those products are left to the wave model (kCooperativeFloatEpilogueK) beyond 384 rows;
// at 384 rows 192 x 128 still won (384 x 12288 x 64: 0.809 against 0.737).
// (A likely reason, not yet tested on its own: each of its consumers' 64 x 128 block fills
// exactly its two output boxes, so no box waits for an earlier store within an item, while
// 128 x 256's consumers write four boxes through two slots.)
constexpr int64_t kShallowMaxK = 128;
bool ShallowTallFits(const GemmProblem& p, int sm_count) {
  if (p.k > kShallowMaxK || WgmmaKMajorOnly(p.in_type) || p.m <= 128) return false;  // (16-bit only)
  if (FloatOutput(p) && p.m > kTallTileMaxRows) return false;
  const double items = double(TallRowBlocks(p)) * double((p.n + 127) / 128) * double(p.batch.count);  // 128 columns each
  return TallRowsPadLittle(p) && items >= sm_count;
}

// 160 x 128 (swapped: the kernel multiplies D^T in 128 x 160 tiles; 16-bit inputs, A stored
// (m, k), GEMMs only) is for 257-320 rows, which 128-row tiles cover with three row blocks
// (the last at most half full) and 192-row ones with two (the last at most two thirds):
// its two column blocks of D^T hold 320 rows. Measured (H200, bf16, forced against the
// heuristic's old pick, x XLA): 288 x 8192^2 0.476 -> 0.855, 320 x 8192^2
// 0.679 -> 0.903, 272 x 8192^2 0.472 -> 0.762, 257 x 8192^2 0.398 -> 0.585,
// 320 x 6144 x 4096 0.664 -> 0.860, 300 x 14336 x 4096 0.634 -> 0.779, 320 x 8192 x 2048
// 0.594 -> 0.776, split 2 at 288 x 4096 x 14336 0.580 -> 0.833; lost at 288 x 4096^2 (0.797
// against 0.748 split 2, 0.604 whole) and 160 x 8192^2 (0.750 against the 192-row tile's
// 0.776). The speeds are fitted to these: whole single waves 0.84 (against 128 x 256),
// shared out stream-K or over more than one wave 0.88, between what 320 x 6144 x 4096 (a
// shared wave of 96 items) and 300 x 14336 x 4096 (two waves) need to take it (with 0.84 the
// pingpong and 128 x 256 kept them) and what 288 x 4096 x 14336 needs to keep split 2 (its
// shared wave of 64 items ran 0.679). Other row counts are unmeasured, hence the bounds.
// Below K = 2048 its general epilogue (no TMA stores) costs more than the rows it saves:
// 288 x 16384 x 1024 0.579 against the pingpong's 0.608, 288 x 8192 x 256 0.490 against 0.674;
// at K = 2048 it still won (320 x 8192 x 2048 0.771 against 0.590, 288 x 2048 x 8192 split 4
// 0.734 against 0.664 for 128 x 128 split 2).
constexpr int64_t kSwappedMinRows = 257, kSwappedMaxRows = 320, kSwappedMinK = 2048;
bool SwappedTileFits(const GemmProblem& p) {
  return p.m >= kSwappedMinRows && p.m <= kSwappedMaxRows && p.k >= kSwappedMinK && !p.trans_a &&
         !WgmmaKMajorOnly(p.in_type);  // (16-bit only)
}

// Products of at most this many rows (one m64 block) stream B: see FewRowsSm90.
constexpr int64_t kFewRows = kSm90FewRows;

// Whether the heuristic's wave model considers a schedule for a problem. Convolutions have
// neither the narrow, the 64-row, the 192-row nor the swapped tiles (they pick 128 x 64 by
// their own rule); with at most 64 rows they keep 128 x 256. GEMMs with at most 64 rows
// take FewRowsSm90 instead. Shallow GEMMs that ShallowTallFits consider the 192-row tile
// only: their time is writing the output, which the wave model does not count.
bool Sm90Considered(const Sm90Candidate& c, const GemmProblem& p, int sm_count, bool with_narrow) {
  if (IsFloat8(p.in_type) && !FindSm90Schedule(c.tile.m, c.tile.n)->fp8) return false;
  if (with_narrow && ShallowTallFits(p, sm_count)) return IsTall(c.tile);
  if (IsNarrow(c.tile) && !with_narrow) return false;
  if (IsTall(c.tile) && (!with_narrow || WgmmaKMajorOnly(p.in_type) || !TallTileFits(p))) return false;
  if (Sm90SwappedTile(c.tile.m, c.tile.n) && (!with_narrow || !SwappedTileFits(p))) return false;
  if (Sm90RegisterA(p) && Sm90PingpongTile(c.tile.m, c.tile.n)) return false;
  if (p.m <= kFewRows) return c.tile.m == 128 && c.tile.n == 256;
  return true;
}

// A GEMM with at most 64 rows is bound by streaming B from memory, not by the tensor
// cores, and the wave model's "busiest SM" does not apply: a block can pull two or more
// times its fair share of the bandwidth, so blocks with one tile more than others cost
// little, while each doubling of the split costs a pass over fp32 partials and a slower
// epilogue. The rule: the widest tile whose column tiles alone give work to >= 3/4 of the
// SMs, unsplit (64 x 128 or 128 x 256); otherwise 64 x 64 tiles, split until they do (chunks
// of >= 512), but never past one wave: where the next doubling overshot (1.2-1.5 waves),
// the smaller split ran 3-9% faster (16 x 3072 / 2560 x 4096 / 8192, 16 x 1536 x 4096).
// The 64-row tiles (one consumer) keep more of B in flight than 128-row ones
// (12 stages of 64 x 64, 8 of 64 x 128). Measured (H200, bf16, us, XLA in the same
// process): M = 16, N = K = 8192: 64 x 64 unsplit 35.1, 64 x 128 34.8, 128 x 64 35.2 (XLA
// 35.0); M = 16 / 64, N = K = 4096: 64 x 64 split 2 12.2 / 12.4, 128 x 64 split 2 14.0 /
// 14.2 (XLA 7.7 / 13.3); M = 16 / 64, N = 14336, K = 4096: 128 x 128 unsplit 31.2 / 31.5
// (128 x 64 unsplit 32.5 / 35.7; XLA 31.2 / 34.4).
// Where the split's chunks are deep enough for stream-K's single shared wave
// (PlanSm90StreamK), each 64 x 64 tile can instead be shared by as many workers as the split
// has slabs, on a grid of tiles x share blocks: the heads add their partners' partial tiles
// in the kernel, and XLA's sum over the fp32 partials (a second kernel) goes. Measured
// (H200, bf16, us, XLA in the same process), split 2 -> shared by 2:
// N = K = 4096, M = 1 / 16 / 32 / 64: 10.9 / 11.2 / 11.4 / 11.7 -> 10.3 / 10.4 / 10.5 / 10.5
// (XLA 7.7 / 8.0 / 8.9 / 13.2); M = 16, N = 4096, K = 8192 / 11008 / 14336: 20.8 / 25.8 /
// 32.4 -> 20.8 / 26.1 / 32.4; split 4 -> shared by 4, 16 x 2048 x 8192: 11.3 -> 11.5. So the
// heuristic shares where K < 8192 and splits deeper. A caller that needs one slab (a fused
// epilogue) gets the shared grid at any depth (Sm90GridSms): against whole tiles on 64
// blocks it halves the time per item.
constexpr int64_t kFewRowsSharedMaxK = 8192;
struct FewRowsChoice {
  Sm90Tile tile;
  int64_t split_k;
  int shared_sms;  // > 0: the grid that shares the split's work out unsplit (stream-K)
};
FewRowsChoice FewRowsSm90(const GemmProblem& p, int sm_count) {
  const double enough = 0.75 * sm_count;
  for (int tile_n : {256, 128}) {
    if (double((p.n + tile_n - 1) / tile_n) * double(p.batch.count) < enough) continue;
    return {{tile_n == 256 ? 128 : 64, tile_n}, 1, 0};
  }
  const int64_t tiles = (p.n + 63) / 64 * p.batch.count;
  int64_t split = 1;
  while (split < 16 && double(tiles) * double(split) < enough && tiles * split * 2 <= sm_count) {
    GemmProblem q = p;
    q.split_k = split * 2;
    if (q.KChunk() < 512) break;
    split *= 2;
  }
  int shared_sms = 0;
  if (split > 1 && Sm90StreamKEnabled()) {  // (the split stays within one wave: tiles x split <= SMs)
    GemmProblem whole = p;
    whole.split_k = 1;
    const int grid = static_cast<int>(tiles * split);
    if (PlanSm90StreamK(whole, {64, 64, 1}, grid).items == tiles) shared_sms = grid;
  }
  if (shared_sms > 0 && p.k < kFewRowsSharedMaxK) split = 1;
  return {{64, 64}, split, shared_sms};
}

// What a split's fp32 partials cost, per output element and slab, in the wave model's unit
// (one multiply-add on one SM at speed 1): the kernel writes 4 bytes and XLA's sum reads
// them, 8 bytes at ~3.3 TB/s, while an SM does ~3.6e12 multiply-adds per second. Without it
// splitting looked free wherever it evened out the waves (512 x 14336 x 4096 chose split 4,
// whose partials take about as long as the product).
constexpr double kSplitPartialCost = 8.8;

// Stream-K's cost beyond the average work per SM, from forced schedules (H200, bf16:
// 1536^2 x 14336 / 4096, 384 x 6144 x 8192, 640 x 2560 x 16384, 768 x 4096 x 14336,
// 1024 x 2048 x 16384, 1024 x 3072 x 4096, 2048 x 1536 x 8192):
// - a last wave shared out over several (cooperative tiles): 0.1 item per SM (the ~1.5 items
//   each SM shares out ran ~6% slower than whole ones; 8192^3);
// - the pingpong's: 0.2 item (0.17-0.38 over three shapes with 1.09 items per block, the
//   fill it is planned for; 0.30-0.41 with 1.45);
// - a single wave shared out (fewer items than workers): the work runs 1.11x as long, and
//   each head waits for its partners' partial tiles and adds them: ~280 K units per partner
//   and one (8 shapes, 2-4 workers per item; ~10 us for a 128 x 256 tile's partners at once).
// - plus, for the 16-bit 128 x 256 and 256 x 256 tiles, half a wave per full last wave
//   (kStreamKFillWaves x its fill): over 1.45 waves (96 items of 2-block clusters on 66) they
//   ran 15-21% behind the pingpong (768 x 8192 / 1024 x 6144 / 2048 x 3072 / 4096 x 1536 x
//   4096: 0.80-0.83 against 0.95-0.96 x XLA; whole waves 0.76), 6% at K = 8192
//   (1024 x 6144 x 8192: 0.916 against 0.973) and even at 2816 x 2304 x 8192 (1.5 waves, a
//   full grid of pingpong tiles); as one more item there they cost ~0.45 (K = 4096) and
//   ~0.3 waves (K = 8192), not 0.1. At 8192^3 (fill 0.5) they stay the pick, as measured
//   (shared and whole waves within 1%).
constexpr double kStreamKExtraWaves = 0.1;
constexpr double kPingpongStreamKExtraWaves = 0.2;
constexpr double kStreamKFillWaves = 0.5;
constexpr double kSharedWaveRate = 1.11;
constexpr double kSharedWavePartialK = 280;

// A wave model: the busiest SM's (cluster's) work items times each item's tile area and K
// (plus the cooperative tiles' exposed epilogue, kCooperativeEpilogueK per wave and
// kCooperativeTailK once, for 16-bit inputs),
// over the schedule's relative speed (2-block clusters, which cut L2 traffic, win by ~1-2%
// once there are several waves; in a single wave they measured 4% slower), plus 5% per
// doubling of the split and the traffic of its fp32 partials (kSplitPartialCost), which
// XLA sums after the kernel. A cluster covers two tiles at once, and half the SMs' worth
// of clusters are resident. Where the schedule shares work out stream-K, every SM gets
// the average work plus stream-K's cost (kStreamKExtraWaves ...), at the speed of a busy
// grid.
// tf32 runs at half the rate per loaded byte, so the clusters' L2 saving buys it nothing:
// over whole waves the 2-block clusters ran ~0.5% slower than single blocks at 8192^3, and
// less steadily, and 1.2% slower at 4096^3 (H200); they stay tf32's
// choice where a stream-K phase pays (Sm90StreamKMaxFillPercent).
// `gemm`: a GEMM's schedule. Convolutions (false) get none of the terms fitted to GEMMs
// only (kStreamKFillWaves, kCooperativeFloatEpilogueK, the shallow few-wave exception):
// their stream-K and float32 outputs were not measured with them.
double Sm90Cost(const GemmProblem& p, int sm_count, const Sm90Candidate& c, bool gemm) {
  const double slabs = double(p.batch.count) * double(p.split_k);
  const double items = std::ceil(double(p.m) / c.tile.m) * std::ceil(double(p.n) / c.tile.n) * slabs;
  Sm90Shape shape;
  Sm90ShapeOf(c.tile.m, c.tile.n, &shape);
  const int workers = std::max(1, sm_count / shape.cluster_m);
  const bool stream_k = PlanSm90StreamK(p, shape, sm_count).items > 0;
  const bool shared_wave = stream_k && items < workers;  // every item shared by 2 or more workers
  const bool tf32 = p.in_type == ElementType::kF32;
  const double fill = items / workers - std::floor(items / workers);  // of the last wave
  double extra_waves = shape.Pingpong() ? kPingpongStreamKExtraWaves : kStreamKExtraWaves;
  if (gemm && !tf32 && c.tile.n == 256) extra_waves += kStreamKFillWaves * fill;
  const double waves = !stream_k    ? std::ceil(items / workers)
                       : shared_wave ? kSharedWaveRate * items / workers
                                     : items / workers + extra_waves;
  const double k = double(p.split_k > 1 ? p.KChunk() : p.k);
  // A 128 x 128 pingpong block's two tiles at once (fitted for 16-bit inputs only; 128 x 64's
  // single-wave speed is for few rows streaming B).
  const double single_waves = c.tile.m == 128 && c.tile.n == 128 && !tf32 ? 2 : 1;
  // (Stream-K keeps every SM busy, as several waves do.)
  double speed = waves > single_waves || stream_k ? (tf32 ? c.tf32_speed : c.speed)
                                                  : (tf32 ? c.tf32_single_wave_speed : c.single_wave_speed);
  // One unsplit 128 x 128 tile per pingpong block, on fewer blocks than SMs: the fewer
  // blocks, the faster each (a partly idle grid runs at a higher clock). Against 128 x 256
  // tiles per multiply-add: 0.96 with 128 of 132 blocks busy, 1.04 with 100, 1.07 with 96,
  // 1.10 with 72 and 80 (1024 x 2048 x 16384, 640 x 2560 x 16384, 3072 x 512 x 14336,
  // 1024 x 1536 x 14336, 1536 x 768 x 8192, 2048 x 640 x 14336): a line in the fill, up to
  // 1.10. Measured at K >= 8192 only, where it decides between these tiles and a shared
  // wave; below, the table's speeds stand.
  if (!stream_k && single_waves == 2 && items <= workers && p.split_k == 1 && p.k >= 8192) {
    speed = std::min(1.10, 1.31 - 0.36 * items / workers);
  }
  // Over many waves the pingpong 128 x 128 falls back to 0.84 (its rate before the exposed
  // epilogue term) against the 2-block clusters (whose halved L2 reads of B buy clock at the
  // power cap), whatever K: beyond 6 waves (16-bit, NN, K = 512-4096) the clusters ran 2-6%
  // faster in 9 of 10 shapes (8192^2 x 1024 / 2048, 8192 x 4096 x 1024 / 2048, 6144 x 4096 x 1024,
  // 6144^2 x 1024, 4096^2 x 2048, 2048 x 8192 x 2048, 3072 x 5120 x 4096; a tie at
  // 4096^2 x 1024), while at 4 to 6 waves the pingpong stayed 2-6% ahead (2048 x 4096 /
  // 4096 x 2048 / 1024 x 8192 / 8192 x 1024 x 1024, 3072 x 4096 x 1024, 4096 x 2048 x 2048).
  if (single_waves == 2 && items / workers > kPingpongManyWaves) speed = std::min(speed, kPingpongManyWaveSpeed);
  if (shape.Pingpong()) speed *= PingpongLayoutSpeed(p);
  // (The 192-row tile's speed beyond one wave holds with a shared last wave too: 384 x 12288
  // x 4096 ran 0.78 on it, against 0.90 for 128 x 256 with one.)
  if (IsTall(c.tile) && waves > 1) speed = kTallManyWaveSpeed;
  const bool many_tall_rows = IsTall(c.tile) && p.m > kTallTileMaxRows;
  if (many_tall_rows && p.trans_a) speed *= kTallMnMajorASpeed;
  const int64_t streaming_rows = tf32 ? kTf32StreamingRows : kStreamingRows;
  if (waves <= 1 && IsNarrow(c.tile) && p.m > streaming_rows) speed *= kNarrowComputeBound;
  if (tf32 && shape.cluster_m > 1) speed -= 0.02;
  const double split_pass = 1.0 + 0.05 * std::log2(double(p.split_k));
  // At K <= 256 (16-bit outputs) only for GEMMs of up to kShallowExposedMaxWaves waves of
  // 128 x 256 / 256 x 256 items: see there. (float32 outputs: kCooperativeFloatEpilogueK.)
  const bool float_out = gemm && FloatOutput(p);
  const bool cooperative = c.tile.n == 256 || (many_tall_rows && waves > 1);
  const bool few_shallow_waves = gemm && c.tile.n == 256 && waves <= kShallowExposedMaxWaves;
  const bool exposed_epilogue = !tf32 && cooperative && (k > 256 || float_out || few_shallow_waves);
  const double epilogue_scale = IsFloat8(p.in_type) && p.epilogue.aux != nullptr ? kFp8AuxEpilogueScale : 1.0;
  const double epilogue_k =
      !exposed_epilogue ? 0.0 : float_out ? kCooperativeFloatEpilogueK : kCooperativeEpilogueK * epilogue_scale;
  const double tail_k = exposed_epilogue ? kCooperativeTailK : 0.0;
  // A shared single wave's heads wait for their partners' partial tiles and add them.
  const double fixup_k = shared_wave ? kSharedWavePartialK * (std::ceil(workers / items) + 1) : 0.0;
  const double mainloop =
      (waves * (k + epilogue_k) + tail_k + fixup_k) * shape.block_m * shape.block_n / speed * split_pass;
  return mainloop + (p.split_k > 1 ? kSplitPartialCost * double(p.m) * double(p.n) * slabs : 0.0);
}

// The cheapest considered sm90 schedule for p (at its split_k), and its cost.
const Sm90Candidate& CheapestSm90(const GemmProblem& p, int sm_count, bool with_narrow, double* cost) {
  const Sm90Candidate* best = nullptr;
  for (const Sm90Candidate& c : kSm90Candidates) {
    if (!Sm90Considered(c, p, sm_count, with_narrow)) continue;
    const double c_cost = Sm90Cost(p, sm_count, c, with_narrow);
    if (!best || c_cost < *cost) {
      *cost = c_cost;
      best = &c;
    }
  }
  return *best;
}


}  // namespace

int64_t Sm90FewRowsSplitK(const GemmProblem& p, int sm_count) { return FewRowsSm90(p, sm_count).split_k; }

double Sm90CheapestCost(const GemmProblem& p, int sm_count) {
  double cost = 0;
  CheapestSm90(p, sm_count, true, &cost);
  return cost;
}

Sm90Tile ChooseSm90Tile(const GemmProblem& p, int sm_count, bool with_narrow) {
  if (with_narrow && p.m <= kFewRows) return FewRowsSm90(p, sm_count).tile;
  double cost = 0;
  return CheapestSm90(p, sm_count, with_narrow, &cost).tile;
}

int Sm90GridSms(const GemmProblem& p, int sm_count) {
  if (p.m > kFewRows || p.split_k != 1) return sm_count;
  const int shared = FewRowsSm90(p, sm_count).shared_sms;
  return shared > 0 ? shared : sm_count;
}

bool IsSm90Tile(int tile_m, int tile_n) {
  Sm90Shape shape;
  return Sm90ShapeOf(tile_m, tile_n, &shape);
}

}  // namespace jaxgemm
