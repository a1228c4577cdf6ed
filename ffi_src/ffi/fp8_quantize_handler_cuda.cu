// jaxgemm_fp8_amax, jaxgemm_fp8_quantize and jaxgemm_fp8_block_quantize on CUDA.
#include "common/cuda_check.h"
#include "ffi/fp8_quantize_decode.h"
#include "ffi/handlers.h"
#include "quantize/fp8_block_quantize.cuh"
#include "quantize/fp8_quantize.cuh"

namespace jaxgemm {
namespace {

ffi::Error Fp8AmaxCudaImpl(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer at,
                           ffi::Result<ffi::AnyBuffer> row_amax, ffi::Result<ffi::AnyBuffer> col_amax,
                           ffi::Result<ffi::AnyBuffer> col_partials, int64_t activation) {
  auto problem = DecodeFp8Amax(x, at, *row_amax, *col_amax, *col_partials, activation);
  if (!problem.has_value()) return problem.error();
  JG_RETURN_IF_CUDA_ERROR(LaunchFp8Amax(*problem, stream));
  return ffi::Error::Success();
}

ffi::Error Fp8QuantizeCudaImpl(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer at, ffi::AnyBuffer row_scale,
                               ffi::AnyBuffer col_scale, ffi::Result<ffi::AnyBuffer> q,
                               ffi::Result<ffi::AnyBuffer> qt, ffi::Result<ffi::AnyBuffer> amax,
                               ffi::Result<ffi::AnyBuffer> col_partials, int64_t activation) {
  auto problem = DecodeFp8Quantize(x, at, row_scale, col_scale, *q, *qt, *amax, *col_partials, activation);
  if (!problem.has_value()) return problem.error();
  JG_RETURN_IF_CUDA_ERROR(LaunchFp8Quantize(*problem, stream));
  return ffi::Error::Success();
}

ffi::Error Fp8BlockQuantizeCudaImpl(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer at,
                                    ffi::Result<ffi::AnyBuffer> q, ffi::Result<ffi::AnyBuffer> q_scale,
                                    ffi::Result<ffi::AnyBuffer> qt, ffi::Result<ffi::AnyBuffer> qt_scale,
                                    ffi::Result<ffi::AnyBuffer> col_partials, int64_t activation, bool tiles) {
  auto problem = DecodeFp8BlockQuantize(x, at, *q, *q_scale, *qt, *qt_scale, *col_partials, activation, tiles);
  if (!problem.has_value()) return problem.error();
  JG_RETURN_IF_CUDA_ERROR(LaunchFp8BlockQuantize(*problem, stream));
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jaxgemm

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemmFp8AmaxCuda, jaxgemm::Fp8AmaxCudaImpl,
                              jaxgemm::BindFp8AmaxCall(
                                  xla::ffi::Ffi::Bind().Ctx<xla::ffi::PlatformStream<cudaStream_t>>()),
                              {xla::ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemmFp8QuantizeCuda, jaxgemm::Fp8QuantizeCudaImpl,
                              jaxgemm::BindFp8QuantizeCall(
                                  xla::ffi::Ffi::Bind().Ctx<xla::ffi::PlatformStream<cudaStream_t>>()),
                              {xla::ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemmFp8BlockQuantizeCuda, jaxgemm::Fp8BlockQuantizeCudaImpl,
                              jaxgemm::BindFp8BlockQuantizeCall(
                                  xla::ffi::Ffi::Bind().Ctx<xla::ffi::PlatformStream<cudaStream_t>>()),
                              {xla::ffi::Traits::kCmdBufferCompatible});
