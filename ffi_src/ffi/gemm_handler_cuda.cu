// jaxgemm_gemm on CUDA: decode, launch on XLA's stream, report errors as ffi::Error.
#include <string>

#include "common/cuda_check.h"
#include "ffi/gemm_decode.h"
#include "ffi/poison.h"
#include "ffi/handlers.h"
#include "gemm/dispatch.h"

namespace jaxgemm {
namespace {

ffi::Error GemmCudaImpl(cudaStream_t stream, ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::RemainingArgs epilogue,
                        ffi::Result<ffi::AnyBuffer> d, ffi::Result<ffi::AnyBuffer> aux,
                        ffi::Result<ffi::AnyBuffer> workspace, GemmAttrs attrs) {
  auto problem = DecodeGemm(a, b, epilogue, *d, *aux, attrs);
  if (!problem.has_value()) return problem.error();
  if (PoisonOutputs()) {  // 0xff.. is NaN in f32, f16 and bf16: unwritten elements show
    JG_RETURN_IF_CUDA_ERROR(cudaMemsetAsync(d->untyped_data(), 0xff, d->size_bytes(), stream));
    if (aux->size_bytes()) JG_RETURN_IF_CUDA_ERROR(cudaMemsetAsync(aux->untyped_data(), 0xff, aux->size_bytes(), stream));
  }
  if (attrs.kernel < 0 || attrs.kernel > static_cast<int64_t>(KernelFamily::kDecode)) {
    return ffi::Error::InvalidArgument("jaxgemm_gemm: unknown kernel family id " + std::to_string(attrs.kernel));
  }
  std::string unsupported;
  const KernelRequest request{static_cast<KernelFamily>(attrs.kernel), int(attrs.tile_m), int(attrs.tile_n),
                              int(attrs.sm_margin), attrs.dynamic_tiles};
  const Sm90Workspace scratch{workspace->untyped_data(), workspace->size_bytes(), attrs.dynamic_tiles};
  const cudaError_t status = RunGemm(*problem, stream, request, &unsupported, scratch);
  if (!unsupported.empty()) return ffi::Error::InvalidArgument("jaxgemm_gemm: " + unsupported);
  if (status != cudaSuccess) return CudaErrorToFfi(status, "jaxgemm_gemm kernel launch");
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jaxgemm

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemmGemmCuda, jaxgemm::GemmCudaImpl,
                              jaxgemm::BindGemmCall(xla::ffi::Ffi::Bind().Ctx<xla::ffi::PlatformStream<cudaStream_t>>()),
                              {xla::ffi::Traits::kCmdBufferCompatible});
