// sm90 (TMA + wgmma) GEMM instantiations for float8 operands of two formats, an input (e4m3)
// times a gradient (e5m2): dw (both K-major, the schedules built for fp8).
#include "gemm/sm90/fp8_operands.h"
#include "gemm/sm90/launch.cuh"

namespace jaxgemm {

template cudaError_t LaunchSm90Gemm<Fp8E4m3E5m2, __nv_bfloat16>(const GemmProblem&, int, int, int, cudaStream_t,
                                                                Sm90Workspace);
template cudaError_t LaunchSm90Gemm<Fp8E4m3E5m2, float>(const GemmProblem&, int, int, int, cudaStream_t,
                                                        Sm90Workspace);

}  // namespace jaxgemm
