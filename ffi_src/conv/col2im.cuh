// Launcher of the CUDA col2im (see col2im.h).
#pragma once
#include <cuda_runtime.h>

#include "conv/col2im.h"

namespace jaxgemm {

// Needs Col2imFitsInt32(p).
cudaError_t LaunchCol2im(const Col2imProblem& p, cudaStream_t stream);

}  // namespace jaxgemm
