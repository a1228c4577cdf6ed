// The block-scaled fp8 GEMM's instantiations (LaunchSm90BlockScaledGemm: float8_e4m3fn
// operands, both K-major, each 128-deep k-tile promoted with its block scales).
#include <cuda_bf16.h>

#include "gemm/sm90/launch.cuh"

namespace jaxgemm {

template cudaError_t LaunchSm90BlockScaledGemm<__nv_bfloat16>(const GemmProblem&, const BlockScales&, int,
                                                              cudaStream_t);
template cudaError_t LaunchSm90BlockScaledGemm<float>(const GemmProblem&, const BlockScales&, int, cudaStream_t);

}  // namespace jaxgemm
