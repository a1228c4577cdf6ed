// Picks a conv kernel (sm80 tensor cores or SIMT) for a ConvProblem and launches it.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "conv/problem.h"

namespace jaxgemm {

// Returns a CUDA status; *unsupported is set (and cudaErrorInvalidValue returned) when no
// kernel takes the problem.
cudaError_t RunConv(const ConvProblem& p, cudaStream_t stream, std::string* unsupported);

}  // namespace jaxgemm
