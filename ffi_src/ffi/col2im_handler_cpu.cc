// jaxgemm_col2im on the host platform.
#include "ffi/col2im_decode.h"
#include "ffi/handlers.h"

namespace jaxgemm {
namespace {

ffi::Error Col2imCpuImpl(ffi::AnyBuffer cols, ffi::Result<ffi::AnyBuffer> dx, int64_t r, int64_t s, int64_t stride_h,
                         int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t dil_h, int64_t dil_w) {
  auto problem = DecodeCol2im(cols, *dx, Col2imAttrs{r, s, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w});
  if (!problem.has_value()) return problem.error();
  Col2imCpu(*problem);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jaxgemm

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemmCol2imCpu, jaxgemm::Col2imCpuImpl, jaxgemm::BindCol2imCall(xla::ffi::Ffi::Bind()));
