// SIMT GEMM instantiations for f16 inputs.
#include "gemm/simt_kernel.cuh"
#include "gemm/simt_policy.h"

namespace jaxgemm {

#define JG_INSTANTIATE(Policy, TOut) template cudaError_t LaunchSimtGemm<Policy, __half, TOut>(const GemmProblem&, cudaStream_t);
JG_INSTANTIATE(SimtPolicy128x128, __half)
JG_INSTANTIATE(SimtPolicy128x128, float)

}  // namespace jaxgemm
