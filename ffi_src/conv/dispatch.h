// Picks a conv kernel (sm90 TMA im2col + wgmma, sm80 tensor cores or SIMT) for a
// ConvProblem and launches it.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "conv/problem.h"
#include "gemm/dispatch.h"

namespace jaxgemm {

// Returns a CUDA status; *unsupported is set (and cudaErrorInvalidValue returned) when no
// kernel takes the problem. `family` steers every kind:
// kAuto lets the heuristic choose, kSm80 keeps them off sm90, kSm90 requires sm90 (an error
// where it cannot run). `sm_margin`: SMs the sm90 kernel's persistent grid leaves free.
cudaError_t RunConv(const ConvProblem& p, cudaStream_t stream, KernelFamily family, std::string* unsupported,
                    int sm_margin = 0);

}  // namespace jaxgemm
