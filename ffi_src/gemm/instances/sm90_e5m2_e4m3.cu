// sm90 (TMA + wgmma) GEMM instantiations for float8 operands of two formats, a gradient (e5m2)
// times a weight (e4m3): dx (both K-major, the schedules built for fp8).
#include "gemm/sm90/fp8_operands.h"
#include "gemm/sm90/launch.cuh"

namespace jaxgemm {

template cudaError_t LaunchSm90Gemm<Fp8E5m2E4m3, __nv_bfloat16>(const GemmProblem&, int, int, int, cudaStream_t,
                                                                Sm90Workspace);
template cudaError_t LaunchSm90Gemm<Fp8E5m2E4m3, float>(const GemmProblem&, int, int, int, cudaStream_t,
                                                        Sm90Workspace);

}  // namespace jaxgemm
