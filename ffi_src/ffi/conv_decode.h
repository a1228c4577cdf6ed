// Decodes the jaxgemm_conv call into a ConvProblem; shared by the CPU and CUDA handlers.
//   kind 0 (fprop): a = x (N,H,W,C), b = w (R,S,C/G,K), out = y (N,P,Q,K) [input dtype or
//                   float32], bias (K,), residual and aux like y (each empty: absent).
//   kind 1 (dgrad): a = dy (N,P,Q,K), b = w per group transposed to (R,S,K/G,C),
//                   out = dx (N,H,W,C) in the input dtype.
//   kind 2 (wgrad): a = x (N,H,W,C), b = dy (N,P,Q,K), out = fp32 partials (S',R,S,C/G,K)
//                   summed by the caller.
// Attributes: the forward convolution's strides, top/left padding, dilations and groups;
// `kernel` picks the CUDA fprop kernel (KernelFamily ids: 0 heuristic, 2 never sm90,
// 3 sm90 or an error); the other kinds and the CPU handler ignore it. `sm_margin`: SMs the
// sm90 kernel's persistent grid leaves free (a weight gradient beside an all-reduce).
#pragma once
#include <string>
#include <utility>

#include "conv/problem.h"
#include "ffi/gemm_decode.h"

namespace jaxgemm {

// Decoded by name from the call's attributes (the registration below).
struct ConvAttrs {
  int64_t kind = 0, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1, groups = 1;
  int64_t activation = 0;
  int64_t kernel = 0;
  int64_t sm_margin = 0;
};

}  // namespace jaxgemm

XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(
    jaxgemm::ConvAttrs,
    xla::ffi::StructMember<int64_t>("kind"),
    xla::ffi::StructMember<int64_t>("stride_h"),
    xla::ffi::StructMember<int64_t>("stride_w"),
    xla::ffi::StructMember<int64_t>("pad_h"),
    xla::ffi::StructMember<int64_t>("pad_w"),
    xla::ffi::StructMember<int64_t>("dil_h"),
    xla::ffi::StructMember<int64_t>("dil_w"),
    xla::ffi::StructMember<int64_t>("groups"),
    xla::ffi::StructMember<int64_t>("activation"),
    xla::ffi::StructMember<int64_t>("kernel"),
    xla::ffi::StructMember<int64_t>("sm_margin"));

namespace jaxgemm {

template <class Binding>
auto BindConvCall(Binding binding) {
  return std::move(binding).template Arg<ffi::AnyBuffer>()  // a
      .template Arg<ffi::AnyBuffer>()            // b
      .template Arg<ffi::AnyBuffer>()            // bias (empty: none)
      .template Arg<ffi::AnyBuffer>()            // residual (empty: none)
      .template Ret<ffi::AnyBuffer>()            // out
      .template Ret<ffi::AnyBuffer>()            // aux = pre-activation (empty: not wanted)
      .template Attrs<ConvAttrs>();
}

inline ffi::ErrorOr<ConvProblem> DecodeConv(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b,
                                            const ffi::AnyBuffer& bias, const ffi::AnyBuffer& residual,
                                            const ffi::AnyBuffer& out, const ffi::AnyBuffer& aux,
                                            const ConvAttrs& attrs) {
  auto da = a.dimensions(), db = b.dimensions(), dout = out.dimensions();
  auto fail = [&](const std::string& why) {
    return ffi::Unexpected(ffi::Error::InvalidArgument("jaxgemm_conv: " + why + " (kind " +
                                                       std::to_string(attrs.kind) + ", a" + ShapeString(da) + ", b" +
                                                       ShapeString(db) + ", out" + ShapeString(dout) + ")"));
  };
  ConvProblem p;
  if (attrs.kind < 0 || attrs.kind > 2) return fail("unknown kind");
  p.kind = static_cast<ConvKind>(attrs.kind);
  if (attrs.stride_h < 1 || attrs.stride_w < 1 || attrs.dil_h < 1 || attrs.dil_w < 1 || attrs.groups < 1) {
    return fail("strides, dilations and groups must be >= 1");
  }
  if (!IsActivation(static_cast<int>(attrs.activation))) return fail("unknown activation id");
  if (attrs.kernel != 0 && attrs.kernel != 2 && attrs.kernel != 3) return fail("unknown kernel family id");
  if (a.element_type() != b.element_type() || !ToElementType(a.element_type(), &p.in_type)) {
    return fail("a and b need one dtype of float32, float16, bfloat16");
  }
  if (!ToElementType(out.element_type(), &p.out_type)) return fail("unsupported output dtype");
  const size_t out_rank = p.kind == ConvKind::kWgrad ? 5 : 4;
  if (da.size() != 4 || db.size() != 4 || dout.size() != out_rank) return fail("wrong ranks");
  p.stride_h = attrs.stride_h;
  p.stride_w = attrs.stride_w;
  p.pad_h = attrs.pad_h;
  p.pad_w = attrs.pad_w;
  p.dil_h = attrs.dil_h;
  p.dil_w = attrs.dil_w;
  p.groups = attrs.groups;
  const int64_t g = attrs.groups;
  switch (p.kind) {
    case ConvKind::kFprop:  // x, w -> y
      p.n = da[0], p.h = da[1], p.w = da[2], p.c = da[3];
      p.r = db[0], p.s = db[1], p.k = db[3];
      p.p = dout[1], p.q = dout[2];
      if (db[2] * g != p.c || p.k % g != 0) return fail("channels do not split into groups");
      if (dout[0] != p.n || dout[3] != p.k) return fail("output is not (N, P, Q, K)");
      if (p.out_type != p.in_type && p.out_type != ElementType::kF32) return fail("output must be a's dtype or float32");
      break;
    case ConvKind::kDgrad:  // dy, w^T -> dx
      p.n = da[0], p.p = da[1], p.q = da[2], p.k = da[3];
      p.r = db[0], p.s = db[1], p.c = db[3];
      p.h = dout[1], p.w = dout[2];
      if (db[2] * g != p.k || p.c % g != 0) return fail("channels do not split into groups");
      if (dout[0] != p.n || dout[3] != p.c) return fail("output is not (N, H, W, C)");
      if (p.out_type != p.in_type) return fail("output must have a's dtype");
      break;
    case ConvKind::kWgrad:  // x, dy -> dw partials
      p.n = da[0], p.h = da[1], p.w = da[2], p.c = da[3];
      p.p = db[1], p.q = db[2], p.k = db[3];
      p.split = dout[0], p.r = dout[1], p.s = dout[2];
      if (db[0] != p.n) return fail("x and dy differ in batch");
      if (dout[3] * g != p.c || p.k % g != 0 || dout[4] != p.k) return fail("output is not (split, R, S, C/G, K)");
      if (p.split < 1 || p.out_type != ElementType::kF32) return fail("partials must be float32 with split >= 1");
      break;
  }
  const bool has_bias = bias.element_count() > 0, has_residual = residual.element_count() > 0;
  const bool has_aux = aux.element_count() > 0;
  if (p.kind != ConvKind::kFprop && (has_bias || has_residual || has_aux || attrs.activation != 0)) {
    return fail("only fprop takes epilogue operands");
  }
  ElementType t;
  if (has_bias && (bias.dimensions().size() != 1 || bias.dimensions()[0] != p.k ||
                   !ToElementType(bias.element_type(), &t) || t != p.out_type)) {
    return fail("bias must be (K,) in the output dtype");
  }
  if (has_residual && (residual.element_count() != out.element_count() || residual.element_type() != out.element_type())) {
    return fail("residual must match the output");
  }
  if (has_aux && (aux.element_count() != out.element_count() || aux.element_type() != out.element_type())) {
    return fail("aux must match the output");
  }
  p.a = a.untyped_data();
  p.b = b.untyped_data();
  p.out = out.untyped_data();
  p.epilogue.activation = static_cast<Activation>(attrs.activation);
  p.epilogue.operand[kEpilogueBias] = has_bias ? bias.untyped_data() : nullptr;
  p.epilogue.operand[kEpilogueResidual] = has_residual ? residual.untyped_data() : nullptr;
  p.epilogue.aux = has_aux ? aux.untyped_data() : nullptr;
  return p;
}

}  // namespace jaxgemm
