// sm90 (TMA + wgmma) GEMM instantiations for f16 inputs.
#include "gemm/sm90/launch.cuh"

namespace jaxgemm {

template cudaError_t LaunchSm90Gemm<__half, __half>(const GemmProblem&, int, int, int, cudaStream_t,
                                                    Sm90Workspace);
template cudaError_t LaunchSm90Gemm<__half, float>(const GemmProblem&, int, int, int, cudaStream_t,
                                                   Sm90Workspace);

}  // namespace jaxgemm
