// jaxgemm_gemm on the host platform: the reference semantics, run by CI without a GPU.
#include <cstring>

#include "ffi/gemm_decode.h"
#include "ffi/poison.h"
#include "ffi/handlers.h"
#include "gemm/cpu_gemm.h"

namespace jaxgemm {
namespace {

ffi::Error GemmCpuImpl(ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::Result<ffi::AnyBuffer> d,
                       bool transpose_a, bool transpose_b, bool tf32, float alpha, int64_t split_k, int64_t tile_m, int64_t tile_n) {
  auto problem = DecodeGemm(a, b, *d, transpose_a, transpose_b, tf32, alpha, split_k);
  if (!problem.has_value()) return problem.error();
  (void)tile_m;  // kernel choice: meaningless for the reference
  (void)tile_n;
  if (PoisonOutputs()) std::memset(d->untyped_data(), 0xff, d->size_bytes());
  if (problem->m == 0 || problem->n == 0 || problem->batch.count == 0) return ffi::Error::Success();
  CpuGemm(*problem);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jaxgemm

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemmGemmCpu, jaxgemm::GemmCpuImpl,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<bool>("transpose_a")
                                  .Attr<bool>("transpose_b")
                                  .Attr<bool>("tf32")
                                  .Attr<float>("alpha")
                                  .Attr<int64_t>("split_k")
                                  .Attr<int64_t>("tile_m")
                                  .Attr<int64_t>("tile_n"));
