// Picks a kernel for a GemmProblem and launches it on the given stream.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "gemm/problem.h"

namespace jaxgemm {

struct SimtChoice {
  int bm, bn;
};

// The SIMT threadblock tile for a problem on a GPU with `sm_count` multiprocessors.
SimtChoice ChooseSimtTile(const GemmProblem& p, int sm_count);

// Launches D = alpha * op(A) op(B). Returns a CUDA status; *unsupported is set (and
// cudaErrorInvalidValue returned) when no kernel takes the problem's dtypes.
cudaError_t RunGemm(const GemmProblem& p, cudaStream_t stream, std::string* unsupported);

}  // namespace jaxgemm
