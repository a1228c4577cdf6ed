// SIMT conv instantiations for bf16 inputs whose channels do not come in 16-byte chunks.
#include "conv/conv_kernel.cuh"

namespace jaxgemm {

template cudaError_t LaunchSimtConv<__nv_bfloat16, __nv_bfloat16, ConvKind::kFprop>(const ConvGemm&, cudaStream_t);
template cudaError_t LaunchSimtConv<__nv_bfloat16, float, ConvKind::kFprop>(const ConvGemm&, cudaStream_t);
template cudaError_t LaunchSimtConv<__nv_bfloat16, __nv_bfloat16, ConvKind::kDgrad>(const ConvGemm&, cudaStream_t);
template cudaError_t LaunchSimtConv<__nv_bfloat16, float, ConvKind::kWgrad>(const ConvGemm&, cudaStream_t);

}  // namespace jaxgemm
