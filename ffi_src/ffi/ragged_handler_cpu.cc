// jaxgemm_ragged_dot, jaxgemm_ragged_epilogue and jaxgemm_ragged_glu on the host platform:
// the reference semantics (gemm/cpu_grouped.h), run by CI without a GPU; the calls'
// contract is ffi/ragged_decode.h's.
#include <cstring>
#include <initializer_list>

#include "ffi/handlers.h"
#include "ffi/poison.h"
#include "ffi/ragged_decode.h"
#include "gemm/cpu_grouped.h"

namespace jaxgemm {
namespace {

// A decoded call run by the reference (its outputs poisoned first where
// JAXGEMM_POISON_OUTPUTS asks).
ffi::Error Run(const GroupedProblem& p, std::initializer_list<ffi::Result<ffi::AnyBuffer>*> outputs) {
  if (PoisonOutputs()) {
    for (auto* buffer : outputs) {
      if ((*buffer)->size_bytes()) std::memset((*buffer)->untyped_data(), 0xff, (*buffer)->size_bytes());
    }
  }
  CpuGroupedGemm(p);
  return ffi::Error::Success();
}

ffi::Error RaggedCpuImpl(ffi::AnyBuffer lhs, ffi::AnyBuffer rhs, ffi::AnyBuffer group_sizes,
                         ffi::Result<ffi::AnyBuffer> out, int64_t mode) {
  auto problem = DecodeRagged(lhs, rhs, group_sizes, *out, mode);
  if (!problem.has_value()) return problem.error();
  return Run(*problem, {&out});
}

ffi::Error RaggedEpilogueCpuImpl(ffi::AnyBuffer lhs, ffi::AnyBuffer rhs, ffi::AnyBuffer group_sizes,
                                 ffi::AnyBuffer bias, ffi::AnyBuffer residual, ffi::Result<ffi::AnyBuffer> out,
                                 ffi::Result<ffi::AnyBuffer> aux, int64_t activation) {
  auto problem = DecodeRagged(lhs, rhs, group_sizes, *out, 0);
  if (!problem.has_value()) return problem.error();
  GroupedProblem p = *problem;
  if (auto error = DecodeRaggedEpilogue(&p, bias, residual, *out, *aux, activation); error.failure()) return error;
  return Run(p, {&out, &aux});
}

ffi::Error RaggedGluCpuImpl(ffi::AnyBuffer lhs, ffi::AnyBuffer w_gate, ffi::AnyBuffer w_up, ffi::AnyBuffer group_sizes,
                            ffi::AnyBuffer bias_gate, ffi::AnyBuffer bias_up, ffi::Result<ffi::AnyBuffer> out,
                            ffi::Result<ffi::AnyBuffer> aux_gate, ffi::Result<ffi::AnyBuffer> aux_up,
                            int64_t activation) {
  auto problem = DecodeRagged(lhs, w_gate, group_sizes, *out, 0);
  if (!problem.has_value()) return problem.error();
  GroupedProblem p = *problem;
  auto error = DecodeRaggedGlu(&p, w_up, bias_gate, bias_up, *out, *aux_gate, *aux_up, activation);
  if (error.failure()) return error;
  return Run(p, {&out, &aux_gate, &aux_up});
}

}  // namespace
}  // namespace jaxgemm

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemmRaggedDotCpu, jaxgemm::RaggedCpuImpl,
                              jaxgemm::BindRaggedCall(xla::ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemmRaggedEpilogueCpu, jaxgemm::RaggedEpilogueCpuImpl,
                              jaxgemm::BindRaggedEpilogueCall(xla::ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemmRaggedGluCpu, jaxgemm::RaggedGluCpuImpl,
                              jaxgemm::BindRaggedGluCall(xla::ffi::Ffi::Bind()));
