// jaxgemm_bias_act_grad on CUDA.
#include "common/cuda_check.h"
#include "elementwise/bias_act_grad.cuh"
#include "ffi/bias_act_grad_decode.h"
#include "ffi/handlers.h"

namespace jaxgemm {
namespace {

ffi::Error BiasActGradCudaImpl(cudaStream_t stream, ffi::AnyBuffer dy, ffi::AnyBuffer z, ffi::AnyBuffer extra,
                               ffi::Result<ffi::AnyBuffer> dz, ffi::Result<ffi::AnyBuffer> dbias,
                               int64_t activation) {
  auto problem = DecodeBiasActGrad(dy, z, extra, *dz, *dbias, activation);
  if (!problem.has_value()) return problem.error();
  JG_RETURN_IF_CUDA_ERROR(LaunchBiasActGrad(*problem, stream));
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jaxgemm

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemmBiasActGradCuda, jaxgemm::BiasActGradCudaImpl,
                              jaxgemm::BindBiasActGradCall(xla::ffi::Ffi::Bind().Ctx<xla::ffi::PlatformStream<cudaStream_t>>()),
                              {xla::ffi::Traits::kCmdBufferCompatible});
