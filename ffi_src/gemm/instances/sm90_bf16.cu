// sm90 (TMA + wgmma) GEMM instantiations for bf16 inputs.
#include "gemm/sm90/launch.cuh"

namespace jaxgemm {

template cudaError_t LaunchSm90Gemm<__nv_bfloat16, __nv_bfloat16>(const GemmProblem&, int, int, int, cudaStream_t,
                                                                  Sm90Workspace);
template cudaError_t LaunchSm90Gemm<__nv_bfloat16, float>(const GemmProblem&, int, int, int, cudaStream_t,
                                                          Sm90Workspace);

}  // namespace jaxgemm
