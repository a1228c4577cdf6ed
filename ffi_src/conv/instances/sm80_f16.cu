// sm80 tensor-core conv instantiations for f16 inputs.
#include "conv/conv_kernel.cuh"

namespace jaxgemm {

template cudaError_t LaunchSm80Conv<__half, __half, ConvKind::kFprop>(const ConvGemm&, cudaStream_t);
template cudaError_t LaunchSm80Conv<__half, float, ConvKind::kFprop>(const ConvGemm&, cudaStream_t);
template cudaError_t LaunchSm80Conv<__half, __half, ConvKind::kDgrad>(const ConvGemm&, cudaStream_t);
template cudaError_t LaunchSm80Conv<__half, float, ConvKind::kWgrad>(const ConvGemm&, cudaStream_t);

}  // namespace jaxgemm
