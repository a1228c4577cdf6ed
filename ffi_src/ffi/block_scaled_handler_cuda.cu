// jaxgemm_block_scaled_gemm on CUDA: the block-scaled sm90 kernel (LaunchSm90BlockScaledGemm)
// on XLA's stream; the call's contract is ffi/block_scaled_decode.h's.
#include <cuda_bf16.h>

#include "common/cuda_check.h"
#include "ffi/block_scaled_decode.h"
#include "ffi/handlers.h"
#include "ffi/poison.h"
#include "gemm/dispatch.h"
#include "gemm/sm90/launch.h"

namespace jaxgemm {
namespace {

ffi::Error BlockScaledGemmCudaImpl(cudaStream_t stream, ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::AnyBuffer scales_a,
                                   ffi::AnyBuffer scales_b, ffi::AnyBuffer bias, ffi::Result<ffi::AnyBuffer> out,
                                   ffi::Result<ffi::AnyBuffer> aux, int64_t activation,
                                   int64_t b_scale_rows) {
  auto call = DecodeBlockScaledGemm(a, b, scales_a, scales_b, bias, *out, *aux, activation, b_scale_rows);
  if (!call.has_value()) return call.error();
  const GemmProblem& p = call->problem;
  if (PoisonOutputs()) {
    JG_RETURN_IF_CUDA_ERROR(cudaMemsetAsync(out->untyped_data(), 0xff, out->size_bytes(), stream));
    if (aux->size_bytes() > 0) {
      JG_RETURN_IF_CUDA_ERROR(cudaMemsetAsync(aux->untyped_data(), 0xff, aux->size_bytes(), stream));
    }
  }
  if (p.m == 0 || p.n == 0 || p.batch.count == 0) return ffi::Error::Success();
  if (CurrentDeviceComputeCapability() != 90 || !Sm90Supports(p)) {
    return ffi::Error::InvalidArgument(
        "jaxgemm_block_scaled_gemm: runs on a Hopper GPU (compute capability 9.0) with K a multiple of 16");
  }
  const int sm_count = KernelSmCount(0);
  const cudaError_t status = p.out_type == ElementType::kBF16
                                 ? LaunchSm90BlockScaledGemm<__nv_bfloat16>(p, call->scales, sm_count, stream)
                                 : LaunchSm90BlockScaledGemm<float>(p, call->scales, sm_count, stream);
  if (status != cudaSuccess) return CudaErrorToFfi(status, "jaxgemm_block_scaled_gemm kernel launch");
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jaxgemm

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemmBlockScaledGemmCuda, jaxgemm::BlockScaledGemmCudaImpl,
                              jaxgemm::BindBlockScaledCall(
                                  xla::ffi::Ffi::Bind().Ctx<xla::ffi::PlatformStream<cudaStream_t>>()),
                              {xla::ffi::Traits::kCmdBufferCompatible});
