// jaxgemm_bias_act_grad on the host platform.
#include "ffi/bias_act_grad_decode.h"
#include "ffi/handlers.h"

namespace jaxgemm {
namespace {

ffi::Error BiasActGradCpuImpl(ffi::AnyBuffer dy, ffi::AnyBuffer z, ffi::AnyBuffer extra,
                              ffi::Result<ffi::AnyBuffer> dz, ffi::Result<ffi::AnyBuffer> dbias, int64_t activation) {
  auto problem = DecodeBiasActGrad(dy, z, extra, *dz, *dbias, activation);
  if (!problem.has_value()) return problem.error();
  BiasActGradCpu(*problem);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jaxgemm

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemmBiasActGradCpu, jaxgemm::BiasActGradCpuImpl,
                              jaxgemm::BindBiasActGradCall(xla::ffi::Ffi::Bind()));
