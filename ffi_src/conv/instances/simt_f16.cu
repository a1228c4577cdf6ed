// SIMT conv instantiations for f16 inputs whose channels do not come in 16-byte chunks.
#include "conv/conv_kernel.cuh"

namespace jaxgemm {

template cudaError_t LaunchSimtConv<__half, __half, ConvKind::kFprop>(const ConvGemm&, cudaStream_t);
template cudaError_t LaunchSimtConv<__half, float, ConvKind::kFprop>(const ConvGemm&, cudaStream_t);
template cudaError_t LaunchSimtConv<__half, __half, ConvKind::kDgrad>(const ConvGemm&, cudaStream_t);
template cudaError_t LaunchSimtConv<__half, float, ConvKind::kWgrad>(const ConvGemm&, cudaStream_t);

}  // namespace jaxgemm
