// jaxgemm_col2im on CUDA.
#include "common/cuda_check.h"
#include "conv/col2im.cuh"
#include "ffi/col2im_decode.h"
#include "ffi/handlers.h"
#include "ffi/poison.h"

namespace jaxgemm {
namespace {

ffi::Error Col2imCudaImpl(cudaStream_t stream, ffi::AnyBuffer cols, ffi::Result<ffi::AnyBuffer> dx, Col2imAttrs attrs) {
  auto problem = DecodeCol2im(cols, *dx, attrs);
  if (!problem.has_value()) return problem.error();
  if (!Col2imFitsInt32(*problem)) return ffi::Error::InvalidArgument("jaxgemm_col2im: sizes too large for 32-bit indices");
  if (PoisonOutputs()) JG_RETURN_IF_CUDA_ERROR(cudaMemsetAsync(dx->untyped_data(), 0xff, dx->size_bytes(), stream));
  JG_RETURN_IF_CUDA_ERROR(LaunchCol2im(*problem, stream));
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jaxgemm

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemmCol2imCuda, jaxgemm::Col2imCudaImpl,
                              jaxgemm::BindCol2imCall(xla::ffi::Ffi::Bind().Ctx<xla::ffi::PlatformStream<cudaStream_t>>()),
                              {xla::ffi::Traits::kCmdBufferCompatible});
