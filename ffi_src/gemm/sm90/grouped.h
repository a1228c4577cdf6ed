// Host interface of the grouped (ragged) Hopper GEMM: one product per group of rows, the
// group sizes read by the kernel from device memory (no host sync; graph-safe).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "gemm/sm90/grouped_problem.h"

namespace jaxgemm {

// Why `p` cannot run on this GPU and build (empty when it can): 16-bit inputs, an output of
// their type or float32, sm_90, dims the tensor maps accept.
std::string GroupedUnsupported(const GroupedProblem& p);

cudaError_t RunGroupedGemm(const GroupedProblem& p, cudaStream_t stream);

}  // namespace jaxgemm
