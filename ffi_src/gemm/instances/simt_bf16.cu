// SIMT GEMM instantiations for bf16 inputs.
#include "gemm/simt_kernel.cuh"
#include "gemm/simt_policy.h"

namespace jaxgemm {

#define JG_INSTANTIATE(Policy, TOut) template cudaError_t LaunchSimtGemm<Policy, __nv_bfloat16, TOut>(const GemmProblem&, cudaStream_t);
JG_INSTANTIATE(SimtPolicy128x128, __nv_bfloat16)
JG_INSTANTIATE(SimtPolicy128x128, float)

}  // namespace jaxgemm
