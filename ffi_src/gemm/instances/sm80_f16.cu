// sm80 tensor-core GEMM instantiations for f16 inputs.
#include "gemm/sm80_kernel.cuh"

namespace jaxgemm {

template cudaError_t LaunchSm80Gemm<__half, __half>(const GemmProblem&, cudaStream_t);
template cudaError_t LaunchSm80Gemm<__half, float>(const GemmProblem&, cudaStream_t);

}  // namespace jaxgemm
