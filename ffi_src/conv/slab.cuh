// Where one (group, split) slab of a conv's implicit GEMM reads and writes: its k range and
// its offsets into the epilogue's operands. Shared by the kernels and the host emulation
// of their loaders (tools/conv_loader_emulation.cc).
#pragma once
#include <cstdint>

#include "common/device_numeric.cuh"
#include "conv/implicit_gemm.h"
#include "gemm/epilogue.cuh"

namespace jaxgemm {

// The k range of slab `part` (wgrad's split; the whole k otherwise).
__device__ __forceinline__ void ConvChunk(const ConvGemm& g, int64_t part, int64_t* begin, int64_t* size) {
  *begin = part * g.k_chunk;
  const int64_t left = g.k - *begin;
  *size = left < 0 ? 0 : (left < g.k_chunk ? left : g.k_chunk);
}

template <class TOut>
__device__ __forceinline__ typename GemmEpilogue<TOut>::Offsets ConvOutOffsets(const ConvGemm& g, int64_t group,
                                                                               int64_t part) {
  return {part * g.out_split_stride + group * g.n, 0, group * g.n, group * g.n};
}

// Vector stores of kWidth need every group's and partial's columns kWidth-aligned.
template <class TOut, int kWidth>
bool ConvVectorStore(const ConvGemm& g) {
  return g.out.ldd % kWidth == 0 && g.n % kWidth == 0 && g.out_split_stride % kWidth == 0 &&
         IsAligned(g.out.d, kWidth * sizeof(TOut)) && IsAligned(g.out.epilogue.aux, kWidth * sizeof(TOut));
}

}  // namespace jaxgemm
