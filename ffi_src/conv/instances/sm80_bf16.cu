// sm80 tensor-core conv instantiations for bf16 inputs.
#include "conv/conv_kernel.cuh"

namespace jaxgemm {

template cudaError_t LaunchSm80Conv<__nv_bfloat16, __nv_bfloat16, ConvKind::kFprop>(const ConvGemm&, cudaStream_t);
template cudaError_t LaunchSm80Conv<__nv_bfloat16, float, ConvKind::kFprop>(const ConvGemm&, cudaStream_t);
template cudaError_t LaunchSm80Conv<__nv_bfloat16, __nv_bfloat16, ConvKind::kDgrad>(const ConvGemm&, cudaStream_t);
template cudaError_t LaunchSm80Conv<__nv_bfloat16, float, ConvKind::kWgrad>(const ConvGemm&, cudaStream_t);

}  // namespace jaxgemm
