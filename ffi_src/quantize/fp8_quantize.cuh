// The CUDA launchers of fp8_quantize.h's passes (fp8_quantize.cu): cudaErrorInvalidValue
// for a matrix the kernels do not take (columns not a multiple of 8, rows of 16, buffers
// not 16-byte aligned).
#pragma once
#include <cuda_runtime.h>

#include "quantize/fp8_quantize.h"

namespace jaxgemm {

cudaError_t LaunchFp8Amax(const Fp8QuantizeProblem& p, cudaStream_t stream);
cudaError_t LaunchFp8Quantize(const Fp8QuantizeProblem& p, cudaStream_t stream);

}  // namespace jaxgemm
