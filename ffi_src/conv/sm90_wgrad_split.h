// The sm90 conv weight gradient's tile and split: plain C++, so that the launcher
// (sm90_conv.cu) and Python's choice of the split (through the nanobind module) read the
// same rule.
#pragma once
#include <algorithm>
#include <cstdint>

namespace jaxgemm {

// 64 or fewer output columns (K = 64 layers; dgrad with C = 64): 128 x 64 tiles, else half
// of every 128-wide tile would multiply zeros.
constexpr int Sm90ConvTileN(int64_t n) { return n <= 64 ? 64 : 128; }

// Chunks of the wgrad's GEMM k (N*P*Q pixels) computed in parallel, one fp32 partial each,
// for the persistent sm90 kernel (128 x Sm90ConvTileN(n) tiles, k-tiles of 64 pixels) on
// `sm_count` SMs: the count minimizing rounds of sm_count work items times a chunk's
// k-tiles (+2 for a tile's pipeline fill and epilogue, ~0.5 us per 128 x 128 x 64 k-tile, in
// proportion for 128 x 64), plus writing and summing the partials (~3 TB/s). Chunks of at
// least 4 k-tiles, at most 128 of them.
inline int64_t Sm90ConvWgradSplit(int64_t m, int64_t n, int64_t k, int sm_count) {
  const int tile_n = Sm90ConvTileN(n);
  const int64_t tiles = ((m + 127) / 128) * ((n + tile_n - 1) / tile_n);
  const int64_t k_tiles = (k + 63) / 64;
  const double k_tile_s = 0.5e-6 * tile_n / 128;
  const int64_t most = std::max<int64_t>(1, std::min<int64_t>(128, k_tiles / 4));
  int64_t best = 1;
  double best_cost = 0;
  for (int64_t split = 1; split <= most; ++split) {
    const int64_t rounds = (tiles * split + sm_count - 1) / sm_count;
    const double cost = rounds * ((k_tiles + split - 1) / split + 2) * k_tile_s + split * double(m) * n * 8 / 3e12;
    if (split == 1 || cost < best_cost) best = split, best_cost = cost;
  }
  return best;
}

}  // namespace jaxgemm
