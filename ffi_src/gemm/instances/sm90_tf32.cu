// sm90 (TMA + wgmma) GEMM instantiation for float32 inputs multiplied as tf32.
#include "gemm/sm90/launch.cuh"

namespace jaxgemm {

template cudaError_t LaunchSm90Gemm<float, float>(const GemmProblem&, int, int, int, cudaStream_t,
                                                  Sm90Workspace);

}  // namespace jaxgemm
