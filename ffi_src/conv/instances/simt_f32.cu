// SIMT conv instantiations for float32 inputs.
#include "conv/conv_kernel.cuh"

namespace jaxgemm {

template cudaError_t LaunchSimtConv<float, float, ConvKind::kFprop>(const ConvGemm&, cudaStream_t);
template cudaError_t LaunchSimtConv<float, float, ConvKind::kDgrad>(const ConvGemm&, cudaStream_t);
template cudaError_t LaunchSimtConv<float, float, ConvKind::kWgrad>(const ConvGemm&, cudaStream_t);

}  // namespace jaxgemm
