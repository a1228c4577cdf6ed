// The Python extension: hands the FFI handlers to jaxgemm._ffi, which registers them with XLA.
#include <nanobind/nanobind.h>

#include "ffi/handlers.h"

namespace nb = nanobind;

namespace {

template <typename T>
nb::capsule EncapsulateFfiHandler(T* fn) {
  static_assert(std::is_invocable_r_v<XLA_FFI_Error*, T, XLA_FFI_CallFrame*>,
                "an FFI handler takes XLA_FFI_CallFrame* and returns XLA_FFI_Error*");
  return nb::capsule(reinterpret_cast<void*>(fn));
}

}  // namespace

NB_MODULE(_jaxgemm, m) {
  m.def("cpu_registrations", []() {
    nb::dict d;
    d["jaxgemm_gemm"] = EncapsulateFfiHandler(JaxgemmGemmCpu);
    return d;
  });
  m.def("cuda_registrations", []() {
    nb::dict d;
#if defined(JAXGEMM_WITH_CUDA)
    d["jaxgemm_gemm"] = EncapsulateFfiHandler(JaxgemmGemmCuda);
#endif
    return d;
  });
  m.attr("with_cuda") =
#if defined(JAXGEMM_WITH_CUDA)
      true;
#else
      false;
#endif
}
