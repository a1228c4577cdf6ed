// Picks a kernel for a GemmProblem and launches it on the given stream.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "gemm/problem.h"

namespace jaxgemm {

struct SimtChoice {
  int bm, bn;
};

// The SIMT threadblock tile for a problem (with its split_k) on a GPU with `sm_count`
// multiprocessors.
SimtChoice ChooseSimtTile(const GemmProblem& p, int sm_count);

// How many K chunks to compute in parallel (fp32 partials reduced afterwards) when the
// output alone has too few tiles to fill the GPU; 1 otherwise. Ignores p.split_k.
int64_t ChooseSplitK(const GemmProblem& p, int sm_count);

// Multiprocessors of the current device (cached per device), or 0 without a GPU.
int CurrentDeviceSmCount();

// Launches D = alpha * op(A) op(B) with the heuristic's tile, or `forced` when it is not
// {0, 0} (tests and tuning). Returns a CUDA status; *unsupported is set (and
// cudaErrorInvalidValue returned) when no kernel takes the problem or the forced tile.
cudaError_t RunGemm(const GemmProblem& p, cudaStream_t stream, SimtChoice forced, std::string* unsupported);

}  // namespace jaxgemm
