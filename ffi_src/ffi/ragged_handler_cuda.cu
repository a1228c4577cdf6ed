// jaxgemm_ragged_dot, jaxgemm_ragged_epilogue and jaxgemm_ragged_glu on CUDA: the grouped
// Hopper GEMM (gemm/sm90/grouped.h); the calls' contract is ffi/ragged_decode.h's.
#include <initializer_list>
#include <string>

#include "common/cuda_check.h"
#include "ffi/handlers.h"
#include "ffi/poison.h"
#include "ffi/ragged_decode.h"
#include "gemm/sm90/grouped.h"

namespace jaxgemm {
namespace {

// A decoded call: refused where the grouped kernel cannot take it, else launched (its
// outputs poisoned first where JAXGEMM_POISON_OUTPUTS asks).
ffi::Error Launch(const GroupedProblem& p, cudaStream_t stream, const std::string& call,
                  std::initializer_list<ffi::Result<ffi::AnyBuffer>*> outputs) {
  const std::string unsupported = GroupedUnsupported(p);
  if (!unsupported.empty()) return ffi::Error::InvalidArgument(call + ": " + unsupported);
  if (PoisonOutputs()) {
    for (auto* buffer : outputs) {
      if ((*buffer)->size_bytes()) {
        JG_RETURN_IF_CUDA_ERROR(cudaMemsetAsync((*buffer)->untyped_data(), 0xff, (*buffer)->size_bytes(), stream));
      }
    }
  }
  const cudaError_t status = RunGroupedGemm(p, stream);
  if (status != cudaSuccess) return CudaErrorToFfi(status, (call + " kernel launch").c_str());
  return ffi::Error::Success();
}

ffi::Error RaggedCudaImpl(cudaStream_t stream, ffi::AnyBuffer lhs, ffi::AnyBuffer rhs, ffi::AnyBuffer group_sizes,
                          ffi::Result<ffi::AnyBuffer> out, int64_t mode) {
  auto problem = DecodeRagged(lhs, rhs, group_sizes, *out, mode);
  if (!problem.has_value()) return problem.error();
  return Launch(*problem, stream, "jaxgemm_ragged_dot", {&out});
}

// bias, residual, aux: the epilogue's buffers, each of 0 elements when absent.
ffi::Error RaggedEpilogueCudaImpl(cudaStream_t stream, ffi::AnyBuffer lhs, ffi::AnyBuffer rhs,
                                  ffi::AnyBuffer group_sizes, ffi::AnyBuffer bias, ffi::AnyBuffer residual,
                                  ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> aux,
                                  int64_t activation) {
  auto problem = DecodeRagged(lhs, rhs, group_sizes, *out, 0);
  if (!problem.has_value()) return problem.error();
  GroupedProblem p = *problem;
  if (auto error = DecodeRaggedEpilogue(&p, bias, residual, *out, *aux, activation); error.failure()) return error;
  return Launch(p, stream, "jaxgemm_ragged_epilogue", {&out, &aux});
}

ffi::Error RaggedGluCudaImpl(cudaStream_t stream, ffi::AnyBuffer lhs, ffi::AnyBuffer w_gate, ffi::AnyBuffer w_up,
                             ffi::AnyBuffer group_sizes, ffi::AnyBuffer bias_gate, ffi::AnyBuffer bias_up,
                             ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> aux_gate,
                             ffi::Result<ffi::AnyBuffer> aux_up, int64_t activation) {
  auto problem = DecodeRagged(lhs, w_gate, group_sizes, *out, 0);
  if (!problem.has_value()) return problem.error();
  GroupedProblem p = *problem;
  auto error = DecodeRaggedGlu(&p, w_up, bias_gate, bias_up, *out, *aux_gate, *aux_up, activation);
  if (error.failure()) return error;
  return Launch(p, stream, "jaxgemm_ragged_glu", {&out, &aux_gate, &aux_up});
}

}  // namespace
}  // namespace jaxgemm

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemmRaggedDotCuda, jaxgemm::RaggedCudaImpl,
                              jaxgemm::BindRaggedCall(
                                  xla::ffi::Ffi::Bind().Ctx<xla::ffi::PlatformStream<cudaStream_t>>()),
                              {xla::ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemmRaggedEpilogueCuda, jaxgemm::RaggedEpilogueCudaImpl,
                              jaxgemm::BindRaggedEpilogueCall(
                                  xla::ffi::Ffi::Bind().Ctx<xla::ffi::PlatformStream<cudaStream_t>>()),
                              {xla::ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemmRaggedGluCuda, jaxgemm::RaggedGluCudaImpl,
                              jaxgemm::BindRaggedGluCall(
                                  xla::ffi::Ffi::Bind().Ctx<xla::ffi::PlatformStream<cudaStream_t>>()),
                              {xla::ffi::Traits::kCmdBufferCompatible});
