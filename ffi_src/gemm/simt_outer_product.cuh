// The FFMA order of a SIMT thread tile: acc[i][j] += fa[i] * fb[j], walked so that the
// register file's banks do not serialize operand reads.
//
// A model inferred from the SASS of our kernels and cuBLAS's SGEMM, not documented by
// NVIDIA (tools/sass_hot_loop.py counts conflicts with it; docs/kernels.md, section 4): an
// FFMA's three sources are read from two banks (even / odd register numbers), one read per
// bank per cycle, unless a source comes from the operand reuse cache, which keeps one
// register per operand slot and bank when the instruction before marked it `.reuse`.
// Row-major order reuses fa[i] for eight FFMAs but reads fb[j] and the accumulator every
// time, so they must sit in opposite banks (SimtGemmKernel's epilogue arranges that by
// staging accumulator quads pair-swapped; the conv kernels do not yet), and the first FFMA
// of a row also reads fa[i].
// Walking odd rows backwards starts each row on the fb[j] the previous row ended on, which
// the reuse cache still holds, so that FFMA reads only fa[i] and the accumulator, whose
// banks differ whenever the row's first column has the parity of the row.
#pragma once

namespace jaxgemm {

template <int kRows, int kCols>
__device__ __forceinline__ void SimtOuterProduct(float (&acc)[kRows][kCols], const float (&fa)[kRows],
                                                 const float (&fb)[kCols]) {
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int j = i % 2 ? kCols - 1 - c : c;  // serpentine: odd rows walk back
      acc[i][j] = fmaf(fa[i], fb[j], acc[i][j]);
    }
  }
}

}  // namespace jaxgemm
