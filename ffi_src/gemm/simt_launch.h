// Host-side entry to the SIMT kernels; instantiated in gemm/instances/.
#pragma once
#include <cuda_runtime.h>

#include "gemm/problem.h"
#include "gemm/simt_policy.h"

namespace jaxgemm {

template <class Policy, class TIn, class TOut>
cudaError_t LaunchSimtGemm(const GemmProblem& p, cudaStream_t stream);

}  // namespace jaxgemm
