// The block scales of an fp8 GEMM (jaxgemm_block_scaled_gemm; ffi/block_scaled_decode.h):
//   D[b, m, n] = sum over blocks j of  scale_a[b, j, m] scale_b[b, j, n]
//                                      sum_{k in block j} A[b, m, k] B[b, n, k]
// with blocks of block_k values along K (a multiple of the kernel's 128-deep k-tile) and A
// (m, k), B (n, k) both K-major. The scales are stored by block, rows innermost ((batch,
// blocks, pitch), the pitch a multiple of 4 floats), so that one block's scales of a
// tile's rows are one 16-byte-aligned run: one TMA box per k-tile.
#pragma once
#include <cstdint>

namespace jaxgemm {

struct BlockScales {
  const float* a = nullptr;  // (batch, blocks, pitch_a), pitch_a >= m
  const float* b = nullptr;  // (batch, blocks, pitch_b), pitch_b >= n
  int64_t blocks = 0, block_k = 0;
  int64_t pitch_a = 0, pitch_b = 0;
};

}  // namespace jaxgemm
