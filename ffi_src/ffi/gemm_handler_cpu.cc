// jaxgemm_gemm on the host platform: the reference semantics, run by CI without a GPU.
#include <cstring>

#include "ffi/gemm_decode.h"
#include "ffi/poison.h"
#include "ffi/handlers.h"
#include "gemm/cpu_gemm.h"

namespace jaxgemm {
namespace {

ffi::Error GemmCpuImpl(ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::RemainingArgs epilogue, ffi::Result<ffi::AnyBuffer> d,
                       ffi::Result<ffi::AnyBuffer> aux, ffi::Result<ffi::AnyBuffer> /*workspace: GPU only*/,
                       GemmAttrs attrs) {
  auto problem = DecodeGemm(a, b, epilogue, *d, *aux, attrs);
  if (!problem.has_value()) return problem.error();
  if (PoisonOutputs()) {
    std::memset(d->untyped_data(), 0xff, d->size_bytes());
    if (aux->size_bytes()) std::memset(aux->untyped_data(), 0xff, aux->size_bytes());
  }
  if (problem->m == 0 || problem->n == 0 || problem->batch.count == 0) return ffi::Error::Success();
  CpuGemm(*problem);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jaxgemm

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemmGemmCpu, jaxgemm::GemmCpuImpl,
                              jaxgemm::BindGemmCall(xla::ffi::Ffi::Bind()));
