// Decode GEMM kernel instantiations for f16 inputs.
#include "gemm/decode_kernel.cuh"

namespace jaxgemm {

template cudaError_t LaunchDecodeGemm<__half, __half>(const GemmProblem&, int, cudaStream_t);
template cudaError_t LaunchDecodeGemm<__half, float>(const GemmProblem&, int, cudaStream_t);

}  // namespace jaxgemm
