// Decodes the jaxgemm_ragged_dot, jaxgemm_ragged_epilogue and jaxgemm_ragged_glu calls into
// a GroupedProblem; shared by the CPU and CUDA handlers so both check the same contract:
//   mode 0: out (m, n) = lhs (m, k) by rhs (g, k, n), per group of rows
//   mode 1: the same with rhs stored (g, n, k)
//   mode 2: out (g, k, n) = lhs (m, k)^T by rhs (m, n), per group of rows (the weight gradient)
//   jaxgemm_ragged_epilogue: mode 0 with GroupedProblem's epilogue: bias (g, n) float32,
//   residual (m, n) and aux (m, n) of the output's type, each (0,) when absent;
//   `activation` an Activation id.
//   jaxgemm_ragged_glu: kRowsGated: w_gate and w_up (g, k, n), their biases (g, n) float32
//   and their pre-activations aux_gate, aux_up (m, n), each (0,) when absent.
#pragma once
#include <string>
#include <utility>

#include "ffi/gemm_decode.h"
#include "gemm/sm90/grouped_problem.h"
#include "xla/ffi/api/ffi.h"

namespace jaxgemm {

namespace ffi = xla::ffi;

// The operands, results and attributes of each call, after any context the platform's
// handler binds first.
template <class Binding>
auto BindRaggedCall(Binding binding) {
  return std::move(binding).template Arg<ffi::AnyBuffer>()  // lhs
      .template Arg<ffi::AnyBuffer>()            // rhs
      .template Arg<ffi::AnyBuffer>()            // group_sizes
      .template Ret<ffi::AnyBuffer>()            // out
      .template Attr<int64_t>("mode");
}
template <class Binding>
auto BindRaggedEpilogueCall(Binding binding) {
  return std::move(binding).template Arg<ffi::AnyBuffer>()  // lhs
      .template Arg<ffi::AnyBuffer>()            // rhs
      .template Arg<ffi::AnyBuffer>()            // group_sizes
      .template Arg<ffi::AnyBuffer>()            // bias (empty: none)
      .template Arg<ffi::AnyBuffer>()            // residual (empty: none)
      .template Ret<ffi::AnyBuffer>()            // out
      .template Ret<ffi::AnyBuffer>()            // aux (empty: not wanted)
      .template Attr<int64_t>("activation");
}

template <class Binding>
auto BindRaggedGluCall(Binding binding) {
  return std::move(binding).template Arg<ffi::AnyBuffer>()  // lhs
      .template Arg<ffi::AnyBuffer>()            // w_gate
      .template Arg<ffi::AnyBuffer>()            // w_up
      .template Arg<ffi::AnyBuffer>()            // group_sizes
      .template Arg<ffi::AnyBuffer>()            // bias_gate (empty: none)
      .template Arg<ffi::AnyBuffer>()            // bias_up (empty: none)
      .template Ret<ffi::AnyBuffer>()            // out
      .template Ret<ffi::AnyBuffer>()            // aux_gate (empty: not wanted)
      .template Ret<ffi::AnyBuffer>()            // aux_up (empty: not wanted)
      .template Attr<int64_t>("activation");
}

inline ffi::ErrorOr<GroupedProblem> DecodeRagged(const ffi::AnyBuffer& lhs, const ffi::AnyBuffer& rhs,
                                                 const ffi::AnyBuffer& group_sizes, const ffi::AnyBuffer& out,
                                                 int64_t mode) {
  auto dl = lhs.dimensions(), dr = rhs.dimensions(), dg = group_sizes.dimensions(), dout = out.dimensions();
  auto fail = [&](const std::string& why) {
    return ffi::Unexpected(ffi::Error::InvalidArgument(
        "jaxgemm_ragged_dot: " + why + " (mode " + std::to_string(mode) + ", lhs" + ShapeString(dl) + ", rhs" +
        ShapeString(dr) + ", group_sizes" + ShapeString(dg) + ", out" + ShapeString(dout) + ")"));
  };
  if (mode < 0 || mode > 2) return fail("unknown mode");
  if (group_sizes.element_type() != ffi::DataType::S32 || dg.size() != 1) return fail("group_sizes must be int32 (g,)");
  GroupedProblem p{};
  p.mode = static_cast<GroupedMode>(mode);
  if (lhs.element_type() != rhs.element_type() || !ToElementType(lhs.element_type(), &p.in_type) ||
      !ToElementType(out.element_type(), &p.out_type)) {
    return fail("unsupported or mismatched element types");
  }
  if (dl.size() != 2) return fail("lhs must be (m, k)");
  p.m = dl[0], p.k = dl[1], p.groups = dg[0];
  if (p.mode == GroupedMode::kContraction) {
    if (dr.size() != 2 || dr[0] != p.m) return fail("rhs must be (m, n)");
    p.n = dr[1];
    if (dout.size() != 3 || dout[0] != p.groups || dout[1] != p.k || dout[2] != p.n) return fail("out must be (g, k, n)");
  } else {
    const bool t = p.mode == GroupedMode::kRowsRhsT;
    if (dr.size() != 3 || dr[0] != p.groups || dr[t ? 2 : 1] != p.k) return fail("rhs must be (g, k, n) or (g, n, k)");
    p.n = dr[t ? 1 : 2];
    if (dout.size() != 2 || dout[0] != p.m || dout[1] != p.n) return fail("out must be (m, n)");
  }
  p.lhs = lhs.untyped_data();
  p.rhs = rhs.untyped_data();
  p.group_sizes = static_cast<const int32_t*>(group_sizes.untyped_data());
  p.out = out.untyped_data();
  return p;
}

// An optional (rows, cols) buffer of `type`: *data = null when it has no elements, else its
// data; false when it has elements but not that shape or type.
inline bool OptionalMatrix(const ffi::AnyBuffer& x, ffi::DataType type, int64_t rows, int64_t cols, void** data) {
  *data = nullptr;
  if (x.element_count() == 0) return true;
  const auto dims = x.dimensions();
  if (x.element_type() != type || dims.size() != 2 || dims[0] != rows || dims[1] != cols) return false;
  *data = x.untyped_data();
  return true;
}

// The epilogue's buffers and activation into p (decoded as mode 0).
inline ffi::Error DecodeRaggedEpilogue(GroupedProblem* problem, const ffi::AnyBuffer& bias,
                                       const ffi::AnyBuffer& residual, const ffi::AnyBuffer& out,
                                       const ffi::AnyBuffer& aux, int64_t activation) {
  GroupedProblem& p = *problem;
  auto fail = [&](const std::string& why) {
    return ffi::Error::InvalidArgument("jaxgemm_ragged_epilogue: " + why + " (bias" + ShapeString(bias.dimensions()) +
                                       ", residual" + ShapeString(residual.dimensions()) + ", aux" +
                                       ShapeString(aux.dimensions()) + ", out" + ShapeString(out.dimensions()) + ")");
  };
  if (!IsActivation(static_cast<int>(activation))) return fail("unknown activation " + std::to_string(activation));
  p.activation = static_cast<Activation>(activation);
  void *b = nullptr, *r = nullptr;
  if (!OptionalMatrix(bias, ffi::DataType::F32, p.groups, p.n, &b)) return fail("bias must be float32 (g, n)");
  if (!OptionalMatrix(residual, out.element_type(), p.m, p.n, &r)) {
    return fail("residual must be (m, n) of the output's type");
  }
  if (!OptionalMatrix(aux, out.element_type(), p.m, p.n, &p.aux)) return fail("aux must be (m, n) of the output's type");
  p.bias = static_cast<const float*>(b);
  p.residual = r;
  return ffi::Error::Success();
}

// jaxgemm_ragged_glu's buffers into p (lhs, w_gate, group_sizes and out decoded as mode 0).
inline ffi::Error DecodeRaggedGlu(GroupedProblem* problem, const ffi::AnyBuffer& w_up, const ffi::AnyBuffer& bias_gate,
                                  const ffi::AnyBuffer& bias_up, const ffi::AnyBuffer& out,
                                  const ffi::AnyBuffer& aux_gate, const ffi::AnyBuffer& aux_up, int64_t activation) {
  GroupedProblem& p = *problem;
  auto fail = [&](const std::string& why) {
    return ffi::Error::InvalidArgument(
        "jaxgemm_ragged_glu: " + why + " (w_up" + ShapeString(w_up.dimensions()) + ", bias_gate" +
        ShapeString(bias_gate.dimensions()) + ", bias_up" + ShapeString(bias_up.dimensions()) + ", aux_gate" +
        ShapeString(aux_gate.dimensions()) + ", aux_up" + ShapeString(aux_up.dimensions()) + ")");
  };
  const auto du = w_up.dimensions();
  ElementType up_type;
  if (!ToElementType(w_up.element_type(), &up_type) || up_type != p.in_type || du.size() != 3 || du[0] != p.groups ||
      du[1] != p.k || du[2] != p.n) {
    return fail("w_up must be w_gate's shape and type");
  }
  if (!IsActivation(static_cast<int>(activation))) return fail("unknown activation " + std::to_string(activation));
  p.mode = GroupedMode::kRowsGated;
  p.activation = static_cast<Activation>(activation);
  p.rhs_up = w_up.untyped_data();
  void *bg = nullptr, *bu = nullptr;
  if (!OptionalMatrix(bias_gate, ffi::DataType::F32, p.groups, p.n, &bg) ||
      !OptionalMatrix(bias_up, ffi::DataType::F32, p.groups, p.n, &bu)) {
    return fail("biases must be float32 (g, n)");
  }
  if (!OptionalMatrix(aux_gate, out.element_type(), p.m, p.n, &p.aux) ||
      !OptionalMatrix(aux_up, out.element_type(), p.m, p.n, &p.aux_up) || (p.aux == nullptr) != (p.aux_up == nullptr)) {
    return fail("aux_gate and aux_up: both (m, n) of the output's type, or neither");
  }
  p.bias = static_cast<const float*>(bg);
  p.bias_up = static_cast<const float*>(bu);
  return ffi::Error::Success();
}

}  // namespace jaxgemm
