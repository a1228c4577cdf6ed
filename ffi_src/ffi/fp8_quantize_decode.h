// Decodes jaxgemm_fp8_amax, jaxgemm_fp8_quantize (quantize/fp8_quantize.h) and
// jaxgemm_fp8_block_quantize (quantize/fp8_block_quantize.h):
//   amax:     x (rows, cols), at (empty, or like x) -> row_amax (rows,), col_amax (cols,),
//             col_partials (chunks, cols) or empty, all float32; attribute activation;
//   quantize: x, at, row_scale (rows,) or (1,), col_scale (cols,) or (1,) float32 ->
//             q (rows, cols) and qt (cols, rows) float8_e4m3fn (or both float8_e5m2), amax
//             (1,) and col_partials (chunks, cols) float32, each empty when not wanted;
//   block quantize: x, at -> q, q_scale (rows, cols / 128), qt, qt_scale (cols, rows / 128),
//             col_partials (rows / 128, cols) or empty (q and qt float8_e4m3fn, or both
//             float8_e5m2); attributes activation, tiles.
#pragma once
#include <string>
#include <utility>

#include "ffi/gemm_decode.h"
#include "quantize/fp8_block_quantize.h"
#include "quantize/fp8_quantize.h"

namespace jaxgemm {

template <class Binding>
auto BindFp8AmaxCall(Binding binding) {
  return std::move(binding).template Arg<ffi::AnyBuffer>()  // x (dy)
      .template Arg<ffi::AnyBuffer>()                         // at (empty: s = x)
      .template Ret<ffi::AnyBuffer>()                         // row_amax
      .template Ret<ffi::AnyBuffer>()                         // col_amax
      .template Ret<ffi::AnyBuffer>()                         // col_partials (empty: none)
      .template Attr<int64_t>("activation");
}

template <class Binding>
auto BindFp8QuantizeCall(Binding binding) {
  return std::move(binding).template Arg<ffi::AnyBuffer>()  // x (dy)
      .template Arg<ffi::AnyBuffer>()                         // at (empty: s = x)
      .template Arg<ffi::AnyBuffer>()                         // row_scale
      .template Arg<ffi::AnyBuffer>()                         // col_scale
      .template Ret<ffi::AnyBuffer>()                         // q (empty: none)
      .template Ret<ffi::AnyBuffer>()                         // qt (empty: none)
      .template Ret<ffi::AnyBuffer>()                         // amax (empty: none)
      .template Ret<ffi::AnyBuffer>()                         // col_partials (empty: none)
      .template Attr<int64_t>("activation");
}

// The source (x, at, activation) of either call, or why not (empty: fine).
inline std::string DecodeFp8Source(const ffi::AnyBuffer& x, const ffi::AnyBuffer& at, int64_t activation,
                                   Fp8QuantizeProblem* p) {
  auto d = x.dimensions();
  if (d.size() != 2) return "x must be (rows, cols)";
  if (!ToElementType(x.element_type(), &p->type)) return "x must be float32, float16 or bfloat16";
  if (!IsActivation(static_cast<int>(activation))) return "unknown activation id";
  const bool has_at = at.element_count() > 0;
  if (has_at && (at.element_type() != x.element_type() || at.dimensions().size() != 2 ||
                 at.dimensions()[0] != d[0] || at.dimensions()[1] != d[1])) {
    return "at must match x";
  }
  p->rows = d[0];
  p->cols = d[1];
  p->activation = static_cast<Activation>(activation);
  p->x = x.untyped_data();
  p->at = has_at ? at.untyped_data() : nullptr;
  return "";
}

// Whether buffer b is a float32 vector of n values.
inline bool IsF32Vector(const ffi::AnyBuffer& b, int64_t n) {
  return b.element_type() == ffi::DataType::F32 && b.dimensions().size() == 1 && b.dimensions()[0] == n;
}

// The stride of a float32 scale vector of n values (1), or of one value for all n (0);
// -1 if b is neither.
inline int64_t ScaleStride(const ffi::AnyBuffer& b, int64_t n) {
  return IsF32Vector(b, n) ? 1 : IsF32Vector(b, 1) ? 0 : -1;
}

// Whether buffer b is a (rows, cols) matrix of type t.
inline bool IsMatrix(const ffi::AnyBuffer& b, ffi::DataType t, int64_t rows, int64_t cols) {
  auto d = b.dimensions();
  return b.element_type() == t && d.size() == 2 && d[0] == rows && d[1] == cols;
}

// The InvalidArgument error of call `name` on source x.
inline ffi::Error Fp8Error(const char* name, const ffi::AnyBuffer& x, const std::string& why) {
  return ffi::Error::InvalidArgument(std::string(name) + ": " + why + " (x" + ShapeString(x.dimensions()) + ")");
}

inline ffi::ErrorOr<Fp8QuantizeProblem> DecodeFp8Amax(const ffi::AnyBuffer& x, const ffi::AnyBuffer& at,
                                                      const ffi::AnyBuffer& row_amax, const ffi::AnyBuffer& col_amax,
                                                      const ffi::AnyBuffer& col_partials, int64_t activation) {
  auto fail = [&](const std::string& why) { return ffi::Unexpected(Fp8Error("jaxgemm_fp8_amax", x, why)); };
  Fp8QuantizeProblem p;
  if (std::string why = DecodeFp8Source(x, at, activation, &p); !why.empty()) return fail(why);
  if (!IsF32Vector(row_amax, p.rows) || !IsF32Vector(col_amax, p.cols)) {
    return fail("row_amax and col_amax must be float32 (rows,) and (cols,)");
  }
  const bool sums = col_partials.element_count() > 0;
  if (sums && !IsMatrix(col_partials, ffi::DataType::F32, p.AmaxChunks(), p.cols)) {
    return fail("col_partials must be float32 (" + std::to_string(p.AmaxChunks()) + ", cols)");
  }
  p.row_amax = static_cast<float*>(row_amax.untyped_data());
  p.col_amax = static_cast<float*>(col_amax.untyped_data());
  p.col_partials = sums ? static_cast<float*>(col_partials.untyped_data()) : nullptr;
  return p;
}

inline ffi::ErrorOr<Fp8QuantizeProblem> DecodeFp8Quantize(const ffi::AnyBuffer& x, const ffi::AnyBuffer& at,
                                                          const ffi::AnyBuffer& row_scale,
                                                          const ffi::AnyBuffer& col_scale, const ffi::AnyBuffer& q,
                                                          const ffi::AnyBuffer& qt, const ffi::AnyBuffer& amax,
                                                          const ffi::AnyBuffer& col_partials, int64_t activation) {
  auto fail = [&](const std::string& why) { return ffi::Unexpected(Fp8Error("jaxgemm_fp8_quantize", x, why)); };
  Fp8QuantizeProblem p;
  if (std::string why = DecodeFp8Source(x, at, activation, &p); !why.empty()) return fail(why);
  using T = ffi::DataType;
  const bool with_q = q.element_count() > 0, with_qt = qt.element_count() > 0;
  p.row_scale_stride = ScaleStride(row_scale, p.rows);
  p.col_scale_stride = ScaleStride(col_scale, p.cols);
  // (q and qt in one format, e4m3 or e5m2: the first present one's.)
  const T format = with_q ? q.element_type() : qt.element_type();
  p.e5m2 = format == T::F8E5M2;
  if ((format != T::F8E4M3FN && !p.e5m2) ||
      (with_q && (!IsMatrix(q, format, p.rows, p.cols) || p.row_scale_stride < 0)) ||
      (with_qt && (!IsMatrix(qt, format, p.cols, p.rows) || p.col_scale_stride < 0))) {
    return fail("q (rows, cols) and qt (cols, rows) must be float8_e4m3fn, or both float8_e5m2, with float32 "
                "row_scale (rows,) or (1,) and col_scale (cols,) or (1,)");
  }
  const bool with_amax = amax.element_count() > 0, sums = col_partials.element_count() > 0;
  if (with_amax && !IsF32Vector(amax, 1)) return fail("amax must be float32 (1,)");
  if (sums && !IsMatrix(col_partials, T::F32, p.AmaxChunks(), p.cols)) {
    return fail("col_partials must be float32 (" + std::to_string(p.AmaxChunks()) + ", cols)");
  }
  p.row_scale = static_cast<const float*>(row_scale.untyped_data());
  p.col_scale = static_cast<const float*>(col_scale.untyped_data());
  p.q = with_q ? q.untyped_data() : nullptr;
  p.qt = with_qt ? qt.untyped_data() : nullptr;
  p.amax = with_amax ? static_cast<float*>(amax.untyped_data()) : nullptr;
  p.col_partials = sums ? static_cast<float*>(col_partials.untyped_data()) : nullptr;
  return p;
}

template <class Binding>
auto BindFp8BlockQuantizeCall(Binding binding) {
  return std::move(binding).template Arg<ffi::AnyBuffer>()  // x (dy)
      .template Arg<ffi::AnyBuffer>()                         // at (empty: s = x)
      .template Ret<ffi::AnyBuffer>()                         // q
      .template Ret<ffi::AnyBuffer>()                         // q_scale
      .template Ret<ffi::AnyBuffer>()                         // qt
      .template Ret<ffi::AnyBuffer>()                         // qt_scale
      .template Ret<ffi::AnyBuffer>()                         // col_partials (empty: none)
      .template Attr<int64_t>("activation")
      .template Attr<bool>("tiles");
}

inline ffi::ErrorOr<Fp8BlockQuantizeProblem> DecodeFp8BlockQuantize(
    const ffi::AnyBuffer& x, const ffi::AnyBuffer& at, const ffi::AnyBuffer& q, const ffi::AnyBuffer& q_scale,
    const ffi::AnyBuffer& qt, const ffi::AnyBuffer& qt_scale, const ffi::AnyBuffer& col_partials, int64_t activation,
    bool tiles) {
  auto fail = [&](const std::string& why) {
    return ffi::Unexpected(Fp8Error("jaxgemm_fp8_block_quantize", x, why));
  };
  Fp8QuantizeProblem source;
  if (std::string why = DecodeFp8Source(x, at, activation, &source); !why.empty()) return fail(why);
  Fp8BlockQuantizeProblem p;
  p.rows = source.rows, p.cols = source.cols, p.type = source.type, p.activation = source.activation;
  p.x = source.x, p.at = source.at, p.tiles = tiles;
  if (p.rows % kQuantBlock != 0 || p.cols % kQuantBlock != 0) return fail("rows and cols must be multiples of 128");
  const int64_t rb = p.rows / kQuantBlock, cb = p.cols / kQuantBlock;
  using T = ffi::DataType;
  p.e5m2 = q.element_type() == T::F8E5M2;
  const T format = p.e5m2 ? T::F8E5M2 : T::F8E4M3FN;
  if (!IsMatrix(q, format, p.rows, p.cols) || !IsMatrix(qt, format, p.cols, p.rows) ||
      !IsMatrix(q_scale, T::F32, p.rows, cb) || !IsMatrix(qt_scale, T::F32, p.cols, rb)) {
    return fail("q (rows, cols) and qt (cols, rows) must be float8_e4m3fn (or both float8_e5m2), q_scale (rows, "
                "cols / 128) and qt_scale (cols, rows / 128) float32");
  }
  const bool sums = col_partials.element_count() > 0;
  if (sums && !IsMatrix(col_partials, T::F32, rb, p.cols)) return fail("col_partials must be float32 (rows / 128, cols)");
  p.q = q.untyped_data();
  p.q_scale = static_cast<float*>(q_scale.untyped_data());
  p.qt = qt.untyped_data();
  p.qt_scale = static_cast<float*>(qt_scale.untyped_data());
  p.col_partials = sums ? static_cast<float*>(col_partials.untyped_data()) : nullptr;
  return p;
}

}  // namespace jaxgemm
