// SIMT GEMM instantiations for f32 inputs.
#include "gemm/simt_kernel.cuh"
#include "gemm/simt_policy.h"

namespace jaxgemm {

#define JG_INSTANTIATE(Policy, TOut) template cudaError_t LaunchSimtGemm<Policy, float, TOut>(const GemmProblem&, cudaStream_t);
JG_INSTANTIATE(SimtPolicy256x128F32, float)
JG_INSTANTIATE(SimtPolicy128x128F32, float)
JG_INSTANTIATE(SimtPolicy128x64, float)
JG_INSTANTIATE(SimtPolicy64x64, float)

}  // namespace jaxgemm
