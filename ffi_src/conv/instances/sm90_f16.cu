// sm90 (TMA im2col + wgmma) conv fprop and wgrad instantiations for f16 inputs.
#include "conv/sm90_conv_launch.cuh"

namespace jaxgemm {

template cudaError_t LaunchSm90ConvFprop<__half, __half>(const Sm90ConvFpropLoads&, const GemmProblem&, int, int,
                                                         cudaStream_t);
template cudaError_t LaunchSm90ConvFprop<__half, float>(const Sm90ConvFpropLoads&, const GemmProblem&, int, int,
                                                        cudaStream_t);

template cudaError_t LaunchSm90ConvWgrad<__half>(const Sm90ConvWgradLoads&, const GemmProblem&, int, int,
                                                 cudaStream_t);

}  // namespace jaxgemm
