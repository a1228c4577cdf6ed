// jaxgemm_block_scaled_gemm on the host platform: the reference (gemm/cpu_block_scaled.h),
// run by CI without a GPU; the call's contract is ffi/block_scaled_decode.h's.
#include <cstring>

#include "ffi/block_scaled_decode.h"
#include "ffi/handlers.h"
#include "ffi/poison.h"
#include "gemm/cpu_block_scaled.h"

namespace jaxgemm {
namespace {

ffi::Error BlockScaledGemmCpuImpl(ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::AnyBuffer scales_a,
                                  ffi::AnyBuffer scales_b, ffi::AnyBuffer bias, ffi::Result<ffi::AnyBuffer> out,
                                  ffi::Result<ffi::AnyBuffer> aux, int64_t activation,
                                  int64_t b_scale_rows) {
  auto call = DecodeBlockScaledGemm(a, b, scales_a, scales_b, bias, *out, *aux, activation, b_scale_rows);
  if (!call.has_value()) return call.error();
  if (PoisonOutputs()) {
    std::memset(out->untyped_data(), 0xff, out->size_bytes());
    if (aux->size_bytes() > 0) std::memset(aux->untyped_data(), 0xff, aux->size_bytes());
  }
  CpuBlockScaledGemm(call->problem, call->scales);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jaxgemm

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemmBlockScaledGemmCpu, jaxgemm::BlockScaledGemmCpuImpl,
                              jaxgemm::BindBlockScaledCall(xla::ffi::Ffi::Bind()));
