// Decodes jaxgemm_bias_act_grad: dy, z, extra (empty: none) of shape (*batch, rows, cols);
// results dz like dy and fp32 dbias partials (*batch, chunks, cols).
#pragma once
#include <utility>

#include "elementwise/bias_act_grad.h"
#include "ffi/gemm_decode.h"

namespace jaxgemm {

// The operands, results and attribute of jaxgemm_bias_act_grad, after any context the
// platform's handler binds first.
template <class Binding>
auto BindBiasActGradCall(Binding binding) {
  return std::move(binding).template Arg<ffi::AnyBuffer>()  // dy
      .template Arg<ffi::AnyBuffer>()            // z
      .template Arg<ffi::AnyBuffer>()            // extra (empty: none)
      .template Ret<ffi::AnyBuffer>()            // dz
      .template Ret<ffi::AnyBuffer>()            // dbias partials
      .template Attr<int64_t>("activation");
}

inline ffi::ErrorOr<BiasActGradProblem> DecodeBiasActGrad(const ffi::AnyBuffer& dy, const ffi::AnyBuffer& z,
                                                          const ffi::AnyBuffer& extra, const ffi::AnyBuffer& dz,
                                                          const ffi::AnyBuffer& dbias, int64_t activation) {
  auto d = dy.dimensions(), db = dbias.dimensions();
  auto fail = [&](const std::string& why) {
    return ffi::Unexpected(ffi::Error::InvalidArgument("jaxgemm_bias_act_grad: " + why + " (dy" + ShapeString(d) +
                                                       ", z" + ShapeString(z.dimensions()) + ", dbias" +
                                                       ShapeString(db) + ")"));
  };
  BiasActGradProblem p;
  const size_t rank = d.size();
  if (rank < 2 || db.size() != rank) return fail("dy needs rank >= 2 and dbias the same rank");
  if (!ToElementType(dy.element_type(), &p.type) || z.element_type() != dy.element_type() ||
      dz.element_type() != dy.element_type() || dbias.element_type() != ffi::DataType::F32) {
    return fail("dy, z and dz need one float dtype, dbias float32");
  }
  if (!IsActivation(static_cast<int>(activation))) return fail("unknown activation id");
  const bool has_extra = extra.element_count() > 0;
  if (z.element_count() != dy.element_count() || dz.element_count() != dy.element_count() ||
      (has_extra && (extra.element_count() != dy.element_count() || extra.element_type() != dy.element_type()))) {
    return fail("z, extra and dz must match dy");
  }
  p.rows = d[rank - 2];
  p.cols = d[rank - 1];
  p.chunks = db[rank - 2];
  p.batch = 1;
  for (size_t i = 0; i + 2 < rank; ++i) {
    if (db[i] != d[i]) return fail("dbias batch dims differ from dy's");
    p.batch *= d[i];
  }
  if (db[rank - 1] != p.cols || p.chunks < 1) return fail("dbias must be (*batch, chunks, cols)");
  p.activation = static_cast<Activation>(activation);
  p.dy = dy.untyped_data();
  p.z = z.untyped_data();
  p.extra = has_extra ? extra.untyped_data() : nullptr;
  p.dz = dz.untyped_data();
  p.dbias_partials = static_cast<float*>(dbias.untyped_data());
  return p;
}

}  // namespace jaxgemm
