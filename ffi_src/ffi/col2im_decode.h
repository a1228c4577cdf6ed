// Decodes jaxgemm_col2im (conv/col2im.h): cols (*batch, P, Q, pitch) -> dx (*batch, H, W, C),
// both of one float dtype; leading batch dims (the image batch, and vmap's) are folded.
// Attributes: the window (r, s) and the forward convolution's strides, top/left padding and
// dilations.
#pragma once
#include <string>

#include "conv/col2im.h"
#include "ffi/gemm_decode.h"

namespace jaxgemm {

// Decoded by name from the call's attributes (the registration below).
struct Col2imAttrs {
  int64_t r = 1, s = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1;
};

}  // namespace jaxgemm

XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(
    jaxgemm::Col2imAttrs,
    xla::ffi::StructMember<int64_t>("r"),
    xla::ffi::StructMember<int64_t>("s"),
    xla::ffi::StructMember<int64_t>("stride_h"),
    xla::ffi::StructMember<int64_t>("stride_w"),
    xla::ffi::StructMember<int64_t>("pad_h"),
    xla::ffi::StructMember<int64_t>("pad_w"),
    xla::ffi::StructMember<int64_t>("dil_h"),
    xla::ffi::StructMember<int64_t>("dil_w"));

namespace jaxgemm {

template <class Binding>
auto BindCol2imCall(Binding binding) {
  return std::move(binding).template Arg<ffi::AnyBuffer>()  // cols
      .template Ret<ffi::AnyBuffer>()            // dx
      .template Attrs<Col2imAttrs>();
}

inline ffi::ErrorOr<Col2imProblem> DecodeCol2im(const ffi::AnyBuffer& cols, const ffi::AnyBuffer& dx,
                                                const Col2imAttrs& a) {
  auto dc = cols.dimensions(), dd = dx.dimensions();
  auto fail = [&](const std::string& why) {
    return ffi::Unexpected(ffi::Error::InvalidArgument("jaxgemm_col2im: " + why + " (cols" + ShapeString(dc) +
                                                       ", dx" + ShapeString(dd) + ")"));
  };
  Col2imProblem p;
  if (dc.size() < 4 || dd.size() != dc.size()) return fail("cols and dx need one rank >= 4");
  if (cols.element_type() != dx.element_type() || !ToElementType(cols.element_type(), &p.type)) {
    return fail("cols and dx need one dtype of float32, float16, bfloat16");
  }
  if (a.r < 1 || a.s < 1 || a.stride_h < 1 || a.stride_w < 1 || a.dil_h < 1 || a.dil_w < 1) {
    return fail("window, strides and dilations must be >= 1");
  }
  const size_t rank = dc.size();
  p.n = 1;
  for (size_t i = 0; i + 3 < rank; ++i) {
    if (dc[i] != dd[i]) return fail("batch dims differ");
    p.n *= dc[i];
  }
  p.p = dc[rank - 3], p.q = dc[rank - 2], p.pitch = dc[rank - 1];
  p.h = dd[rank - 3], p.w = dd[rank - 2], p.c = dd[rank - 1];
  p.r = a.r, p.s = a.s;
  if (p.pitch < p.r * p.s * p.c) return fail("cols rows are shorter than r * s * C");
  p.stride_h = a.stride_h, p.stride_w = a.stride_w;
  p.pad_h = a.pad_h, p.pad_w = a.pad_w;
  p.dil_h = a.dil_h, p.dil_w = a.dil_w;
  p.cols = cols.untyped_data();
  p.dx = dx.untyped_data();
  return p;
}

}  // namespace jaxgemm
