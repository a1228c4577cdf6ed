// sm90 (TMA im2col + wgmma) conv fprop and wgrad instantiations for bf16 inputs.
#include "conv/sm90_conv_launch.cuh"

namespace jaxgemm {

template cudaError_t LaunchSm90ConvFprop<__nv_bfloat16, __nv_bfloat16>(const Sm90ConvFpropLoads&, const GemmProblem&,
                                                                       int, int, cudaStream_t);
template cudaError_t LaunchSm90ConvFprop<__nv_bfloat16, float>(const Sm90ConvFpropLoads&, const GemmProblem&, int, int,
                                                               cudaStream_t);

template cudaError_t LaunchSm90ConvWgrad<__nv_bfloat16>(const Sm90ConvWgradLoads&, const GemmProblem&, int, int,
                                                        cudaStream_t);

}  // namespace jaxgemm
