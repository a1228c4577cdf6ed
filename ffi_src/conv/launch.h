// Host-side entry to the conv kernels; instantiated in conv/instances/.
#pragma once
#include <cuda_runtime.h>

#include "conv/implicit_gemm.h"

namespace jaxgemm {

// Whether the sm80 tensor-core kernel takes the conv: 16-bit inputs; channels per group of
// A and columns per group of B multiples of 8 (whole 16-byte chunks), 16-byte aligned
// tensors.
inline bool Sm80ConvSupports(const ConvGemm& g, ElementType in_type) {
  return in_type != ElementType::kF32 && g.a_cg % 8 == 0 && g.a_pitch % 8 == 0 && g.n % 8 == 0 && g.ldb % 8 == 0 &&
         reinterpret_cast<uintptr_t>(g.a) % 16 == 0 && reinterpret_cast<uintptr_t>(g.b) % 16 == 0;
}

template <class TIn, class TOut, ConvKind kKind>
cudaError_t LaunchSm80Conv(const ConvGemm& g, cudaStream_t stream);

template <class TIn, class TOut, ConvKind kKind>
cudaError_t LaunchSimtConv(const ConvGemm& g, cudaStream_t stream);

}  // namespace jaxgemm
