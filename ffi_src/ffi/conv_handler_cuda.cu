// jaxgemm_conv on CUDA: decode, launch on XLA's stream, report errors as ffi::Error.
#include <string>

#include "common/cuda_check.h"
#include "conv/dispatch.h"
#include "ffi/conv_decode.h"
#include "ffi/handlers.h"
#include "ffi/poison.h"

namespace jaxgemm {
namespace {

ffi::Error ConvCudaImpl(cudaStream_t stream, ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::AnyBuffer bias,
                        ffi::AnyBuffer residual, ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> aux,
                        ConvAttrs attrs) {
  auto problem = DecodeConv(a, b, bias, residual, *out, *aux, attrs);
  if (!problem.has_value()) return problem.error();
  if (PoisonOutputs()) {  // 0xff.. is NaN in f32, f16 and bf16: unwritten elements show
    JG_RETURN_IF_CUDA_ERROR(cudaMemsetAsync(out->untyped_data(), 0xff, out->size_bytes(), stream));
    if (aux->size_bytes()) JG_RETURN_IF_CUDA_ERROR(cudaMemsetAsync(aux->untyped_data(), 0xff, aux->size_bytes(), stream));
  }
  std::string unsupported;
  const cudaError_t status =
      RunConv(*problem, stream, static_cast<KernelFamily>(attrs.kernel), &unsupported,
              static_cast<int>(attrs.sm_margin));
  if (!unsupported.empty()) return ffi::Error::InvalidArgument("jaxgemm_conv: " + unsupported);
  if (status != cudaSuccess) return CudaErrorToFfi(status, "jaxgemm_conv kernel launch");
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jaxgemm

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemmConvCuda, jaxgemm::ConvCudaImpl,
                              jaxgemm::BindConvCall(xla::ffi::Ffi::Bind().Ctx<xla::ffi::PlatformStream<cudaStream_t>>()),
                              {xla::ffi::Traits::kCmdBufferCompatible});
