// The CUDA launcher of fp8_block_quantize.h's pass (fp8_block_quantize.cu):
// cudaErrorInvalidValue for a matrix the kernel does not take (rows or columns not a
// multiple of 128, buffers not 16-byte aligned).
#pragma once
#include <cuda_runtime.h>

#include "quantize/fp8_block_quantize.h"

namespace jaxgemm {

cudaError_t LaunchFp8BlockQuantize(const Fp8BlockQuantizeProblem& p, cudaStream_t stream);

}  // namespace jaxgemm
