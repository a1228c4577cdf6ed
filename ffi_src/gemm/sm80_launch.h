// Host-side entry to the sm80 tensor-core kernels; instantiated in gemm/instances/.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "gemm/problem.h"

namespace jaxgemm {

// Whether the sm80 kernel takes the problem: 16-bit inputs, 16-byte row starts.
inline bool Sm80Supports(const GemmProblem& p) {
  return p.in_type != ElementType::kF32 && p.lda % 8 == 0 && p.ldb % 8 == 0 &&
         reinterpret_cast<uintptr_t>(p.a) % 16 == 0 && reinterpret_cast<uintptr_t>(p.b) % 16 == 0 &&
         p.k < INT32_MAX - 64;
}

template <class TIn, class TOut>
cudaError_t LaunchSm80Gemm(const GemmProblem& p, cudaStream_t stream);

}  // namespace jaxgemm
