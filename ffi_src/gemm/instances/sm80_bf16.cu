// sm80 tensor-core GEMM instantiations for bf16 inputs.
#include "gemm/sm80_kernel.cuh"

namespace jaxgemm {

template cudaError_t LaunchSm80Gemm<__nv_bfloat16, __nv_bfloat16>(const GemmProblem&, cudaStream_t);
template cudaError_t LaunchSm80Gemm<__nv_bfloat16, float>(const GemmProblem&, cudaStream_t);

}  // namespace jaxgemm
