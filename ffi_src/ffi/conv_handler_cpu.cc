// jaxgemm_conv on the host platform: the reference semantics, run by CI without a GPU.
#include <cstring>

#include "conv/cpu_conv.h"
#include "ffi/conv_decode.h"
#include "ffi/handlers.h"
#include "ffi/poison.h"

namespace jaxgemm {
namespace {

ffi::Error ConvCpuImpl(ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::AnyBuffer bias, ffi::AnyBuffer residual,
                       ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> aux, int64_t kind,
                       int64_t stride_h, int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t dil_h,
                       int64_t dil_w, int64_t groups, int64_t activation, int64_t kernel, int64_t sm_margin) {
  const ConvAttrs attrs{kind, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups, activation, kernel, sm_margin};
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
