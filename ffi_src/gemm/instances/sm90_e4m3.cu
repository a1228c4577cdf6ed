// sm90 (TMA + wgmma) GEMM instantiations for float8_e4m3fn inputs (both operands K-major,
// the schedules built for fp8: kSm90Schedules' fp8 column).
#include <cuda_fp8.h>

#include "gemm/sm90/launch.cuh"

namespace jaxgemm {

template cudaError_t LaunchSm90Gemm<__nv_fp8_e4m3, __nv_bfloat16>(const GemmProblem&, int, int, int, cudaStream_t,
                                                                  Sm90Workspace);
template cudaError_t LaunchSm90Gemm<__nv_fp8_e4m3, float>(const GemmProblem&, int, int, int, cudaStream_t,
                                                          Sm90Workspace);

}  // namespace jaxgemm
