// Decode GEMM kernel instantiations for bf16 inputs.
#include "gemm/decode_kernel.cuh"

namespace jaxgemm {

template cudaError_t LaunchDecodeGemm<__nv_bfloat16, __nv_bfloat16>(const GemmProblem&, int, cudaStream_t);
template cudaError_t LaunchDecodeGemm<__nv_bfloat16, float>(const GemmProblem&, int, cudaStream_t);

}  // namespace jaxgemm
