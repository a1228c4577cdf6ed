// jaxgemm_fp8_amax, jaxgemm_fp8_quantize and jaxgemm_fp8_block_quantize on the host platform.
#include "ffi/fp8_quantize_decode.h"
#include "ffi/handlers.h"

namespace jaxgemm {
namespace {

ffi::Error Fp8AmaxCpuImpl(ffi::AnyBuffer x, ffi::AnyBuffer at, ffi::Result<ffi::AnyBuffer> row_amax,
                          ffi::Result<ffi::AnyBuffer> col_amax, ffi::Result<ffi::AnyBuffer> col_partials,
                          int64_t activation) {
  auto problem = DecodeFp8Amax(x, at, *row_amax, *col_amax, *col_partials, activation);
  if (!problem.has_value()) return problem.error();
  Fp8AmaxCpu(*problem);
  return ffi::Error::Success();
}

ffi::Error Fp8QuantizeCpuImpl(ffi::AnyBuffer x, ffi::AnyBuffer at, ffi::AnyBuffer row_scale, ffi::AnyBuffer col_scale,
                              ffi::Result<ffi::AnyBuffer> q, ffi::Result<ffi::AnyBuffer> qt,
                              ffi::Result<ffi::AnyBuffer> amax, ffi::Result<ffi::AnyBuffer> col_partials,
                              int64_t activation) {
  auto problem = DecodeFp8Quantize(x, at, row_scale, col_scale, *q, *qt, *amax, *col_partials, activation);
  if (!problem.has_value()) return problem.error();
  Fp8QuantizeCpu(*problem);
  return ffi::Error::Success();
}

ffi::Error Fp8BlockQuantizeCpuImpl(ffi::AnyBuffer x, ffi::AnyBuffer at, ffi::Result<ffi::AnyBuffer> q,
                                   ffi::Result<ffi::AnyBuffer> q_scale, ffi::Result<ffi::AnyBuffer> qt,
                                   ffi::Result<ffi::AnyBuffer> qt_scale, ffi::Result<ffi::AnyBuffer> col_partials,
                                   int64_t activation, bool tiles) {
  auto problem = DecodeFp8BlockQuantize(x, at, *q, *q_scale, *qt, *qt_scale, *col_partials, activation, tiles);
  if (!problem.has_value()) return problem.error();
  Fp8BlockQuantizeCpu(*problem);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jaxgemm

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemmFp8AmaxCpu, jaxgemm::Fp8AmaxCpuImpl,
                              jaxgemm::BindFp8AmaxCall(xla::ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemmFp8QuantizeCpu, jaxgemm::Fp8QuantizeCpuImpl,
                              jaxgemm::BindFp8QuantizeCall(xla::ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemmFp8BlockQuantizeCpu, jaxgemm::Fp8BlockQuantizeCpuImpl,
                              jaxgemm::BindFp8BlockQuantizeCall(xla::ffi::Ffi::Bind()));
