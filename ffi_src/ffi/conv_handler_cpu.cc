// jaxgemm_conv on the host platform: the reference semantics, run by CI without a GPU.
#include <cstring>

#include "conv/cpu_conv.h"
#include "ffi/conv_decode.h"
#include "ffi/handlers.h"
#include "ffi/poison.h"

namespace jaxgemm {
namespace {

ffi::Error ConvCpuImpl(ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::AnyBuffer bias, ffi::AnyBuffer residual,
                       ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> aux,
                       ConvAttrs attrs) {
  auto problem = DecodeConv(a, b, bias, residual, *out, *aux, attrs);
  if (!problem.has_value()) return problem.error();
  if (PoisonOutputs()) {
    std::memset(out->untyped_data(), 0xff, out->size_bytes());
    if (aux->size_bytes()) std::memset(aux->untyped_data(), 0xff, aux->size_bytes());
  }
  CpuConv(*problem);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jaxgemm

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemmConvCpu, jaxgemm::ConvCpuImpl, jaxgemm::BindConvCall(xla::ffi::Ffi::Bind()));
