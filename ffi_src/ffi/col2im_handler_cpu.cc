// jaxgemm_col2im on the host platform.
#include "ffi/col2im_decode.h"
#include "ffi/handlers.h"

namespace jaxgemm {
namespace {

ffi::Error Col2imCpuImpl(ffi::AnyBuffer cols, ffi::Result<ffi::AnyBuffer> dx, Col2imAttrs attrs) {
  auto problem = DecodeCol2im(cols, *dx, attrs);
  if (!problem.has_value()) return problem.error();
  Col2imCpu(*problem);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jaxgemm

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemmCol2imCpu, jaxgemm::Col2imCpuImpl, jaxgemm::BindCol2imCall(xla::ffi::Ffi::Bind()));
