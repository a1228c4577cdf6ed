// The sm90 GEMM's schedules, one row each: everything else that names one reads this table
// (the launcher, Sm90Shape, the heuristic's candidates, the conv launcher, and through the
// nanobind module Python's autotuner, tests and tools). Plain C++, so that CPU-only builds
// export it too.
#pragma once
#include <cstddef>

namespace jaxgemm {

// A schedule is named by the area of D one block, or one cluster of blocks, covers.
struct Sm90ScheduleRow {
  int tile_m, tile_n;  // its name
  int kernel_n;        // the kernel's tile columns (Sm90Policy's kTileN): tile_n, or 160 swapped
  int cluster_m;       // blocks per cluster, stacked along M (they share B by TMA multicast)
  int consumers;       // consumer warpgroups, 64 rows (swapped: 64 of D's columns) each
  bool pingpong;       // the consumers take alternate tiles (else both work on every tile)
  bool swapped;        // multiplies D^T = B^T A^T (Sm90Swapped): 16-bit, A stored (m, k)
  // The kernels built with it:
  bool half;           // GEMMs of 16-bit inputs (float16, bfloat16)
  bool tf32;           // GEMMs of float32 inputs multiplied as tf32
  bool fp8;            // GEMMs of float8_e4m3fn inputs (both K-major), scaled per tensor or row
  bool block_scaled;   // GEMMs of float8_e4m3fn inputs with block scales (Sm90Policy::kBlockScaled)
  bool conv_fprop;     // the convolutions' forward (and data gradient), as 128 x tile_n
  bool conv_wgrad;     // the convolutions' weight gradient, as 128 x tile_n

  constexpr bool Is(int m, int n) const { return tile_m == m && tile_n == n; }
  // One block's rows of D (a cluster's tile_m is shared out along M).
  constexpr int BlockM() const { return tile_m / cluster_m; }
};

// Why each exists: docs/kernels.md (section 5) and the heuristic's candidates (heuristic.cu).
// 128 x 192, block scales only: promotion doubles the accumulators (96 + 96 registers a
// thread at 192 columns; 128 x 256 would need 256), and it ran the promoted wgmma fastest
// with loads (tools/wgmma_rate.cu: 3116 MACs per SM clock against 2492 for 128 x 128; the
// top-level NOTES.md, "Open: fp8 on Hopper").
inline constexpr Sm90ScheduleRow kSm90Schedules[] = {
    // tile      kernel_n cluster consumers pingpong swapped
    //                                              half tf32 fp8 block_scaled conv_fprop conv_wgrad
    {256, 256, 256, 2, 2, false, false, true, true, true, false, false, false},
    {128, 256, 256, 1, 2, false, false, true, true, true, false, true, false},
    {128, 128, 128, 1, 2, true, false, true, true, true, false, true, true},
    {128, 64, 64, 1, 2, true, false, true, true, true, false, true, true},
    {64, 128, 128, 1, 1, false, false, true, true, true, false, false, false},
    {64, 64, 64, 1, 1, false, false, true, true, true, false, false, false},
    {192, 128, 128, 1, 3, false, false, true, false, false, false, false, false},
    {160, 128, 160, 1, 2, false, true, true, false, false, false, false, false},
    {128, 192, 192, 1, 2, false, false, false, false, false, true, false, false},
};
inline constexpr int kSm90ScheduleCount = static_cast<int>(sizeof(kSm90Schedules) / sizeof(kSm90Schedules[0]));

// The row of schedule tile_m x tile_n; -1 when there is none.
constexpr int Sm90ScheduleIndex(int tile_m, int tile_n) {
  for (int i = 0; i < kSm90ScheduleCount; ++i) {
    if (kSm90Schedules[i].Is(tile_m, tile_n)) return i;
  }
  return -1;
}

// The first row built for a kind of kernel (`built`: one of the kernel columns); -1 when
// none is.
constexpr int Sm90FirstScheduleFor(bool Sm90ScheduleRow::*built) {
  for (int i = 0; i < kSm90ScheduleCount; ++i) {
    if (kSm90Schedules[i].*built) return i;
  }
  return -1;
}

constexpr const Sm90ScheduleRow* FindSm90Schedule(int tile_m, int tile_n) {
  const int i = Sm90ScheduleIndex(tile_m, tile_n);
  return i < 0 ? nullptr : &kSm90Schedules[i];
}

}  // namespace jaxgemm
