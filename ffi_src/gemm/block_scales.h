// The block scales of an fp8 GEMM (jaxgemm_block_scaled_gemm; ffi/block_scaled_decode.h):
//   D[b, m, n] = sum over blocks j of  scale_a[b, j, m] scale_b[b, j, n / b_rows]
//                                      sum_{k in block j} A[b, m, k] B[b, n, k]
// with blocks of block_k values along K (a multiple of the kernel's 128-deep k-tile) and A
// (m, k), B (n, k) both K-major. B's scales are per row (b_rows = 1) or per group of 64 rows
// (b_rows = 64: weights in 128 x 128 tiles, DeepSeek-V3's, each tile's scale given twice),
// so that a consumer's promotion multiplies by one scale per 64 columns of its tile. The
// scales are stored by block, rows (groups) innermost ((batch, blocks, pitch), the pitch a
// multiple of 4 floats), so that one block's scales of a tile's rows are one 16-byte-aligned
// run: one TMA box per k-tile.
#pragma once
#include <cstdint>

namespace jaxgemm {

// B's rows per scale where they come in groups (BlockScales::b_rows): a 128 x 128 weight
// tile's scale covers two.
inline constexpr int64_t kBlockScaleGroupRows = 64;

struct BlockScales {
  const float* a = nullptr;  // (batch, blocks, pitch_a), pitch_a >= m
  const float* b = nullptr;  // (batch, blocks, pitch_b), pitch_b >= ceil(n / b_rows)
  int64_t blocks = 0, block_k = 0;
  int64_t b_rows = 1;  // rows of B that share a scale: 1 or kBlockScaleGroupRows
  int64_t pitch_a = 0, pitch_b = 0;
};

}  // namespace jaxgemm
