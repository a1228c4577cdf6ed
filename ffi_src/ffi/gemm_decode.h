// Decodes the jaxgemm_gemm call (buffers + attributes) into a GemmProblem; shared by the
// CPU and CUDA handlers so both check the same contract.
#pragma once
#include <algorithm>
#include <string>

#include "gemm/problem.h"
#include "xla/ffi/api/ffi.h"

namespace jaxgemm {

namespace ffi = xla::ffi;

inline std::string ShapeString(ffi::AnyBuffer::Dimensions dims) {
  std::string s = "(";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + (dims.size() == 1 ? ",)" : ")");
}

inline ffi::ErrorOr<ElementType> ToElementType(ffi::DataType t, const char* what) {
  switch (t) {
    case ffi::DataType::F32: return ElementType::kF32;
    case ffi::DataType::F16: return ElementType::kF16;
    case ffi::DataType::BF16: return ElementType::kBF16;
    default:
      return ffi::Unexpected(ffi::Error::InvalidArgument(
          std::string("jaxgemm_gemm: unsupported dtype for ") + what));
  }
}

// a: (*batch_a, rows, cols), b: (*batch_b, rows, cols), d: (*batch, m, n), equal ranks;
// each batch dim of a and b is 1 (broadcast) or the output's.
inline ffi::ErrorOr<GemmProblem> DecodeGemm(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b,
                                            const ffi::AnyBuffer& d, bool transpose_a,
                                            bool transpose_b, bool tf32, float alpha,
                                            int64_t split_k) {
  auto da = a.dimensions(), db = b.dimensions(), dd = d.dimensions();
  auto shapes = [&] {
    return " (a" + ShapeString(da) + ", b" + ShapeString(db) + ", out" + ShapeString(dd) + ")";
  };
  auto fail = [&](const std::string& why) {
    return ffi::Unexpected(ffi::Error::InvalidArgument("jaxgemm_gemm: " + why + shapes()));
  };
  const size_t rank = da.size();
  if (split_k < 1) return fail("split_k must be >= 1");
  // With split_k > 1 the output has an extra dim of S partial products before (m, n).
  const size_t split_dims = split_k > 1 ? 1 : 0;
  if (rank < 2 || db.size() != rank || dd.size() != rank + split_dims) {
    return fail("operands need equal ranks >= 2 (plus a split dim in the output when split_k > 1)");
  }
  if (split_k > 1 && (d.element_type() != ffi::DataType::F32 || dd[rank - 2] != split_k)) {
    return fail("split-K partials must be float32 with a dim of size split_k before (m, n)");
  }
  if (a.element_type() != b.element_type()) return fail("a and b must have the same dtype");
  auto in_type = ToElementType(a.element_type(), "a/b");
  if (!in_type.has_value()) return ffi::Unexpected(in_type.error());
  auto out_type = ToElementType(d.element_type(), "out");
  if (!out_type.has_value()) return ffi::Unexpected(out_type.error());

  GemmProblem p;
  p.in_type = *in_type;
  p.out_type = *out_type;
  p.trans_a = transpose_a;
  p.trans_b = transpose_b;
  p.tf32 = tf32;
  p.alpha = alpha;
  const int64_t a_rows = da[rank - 2], a_cols = da[rank - 1];
  const int64_t b_rows = db[rank - 2], b_cols = db[rank - 1];
  p.m = transpose_a ? a_cols : a_rows;
  p.k = transpose_a ? a_rows : a_cols;
  p.n = transpose_b ? b_rows : b_cols;
  const int64_t kb = transpose_b ? b_cols : b_rows;
  if (kb != p.k) return fail("inner dimensions differ");
  if (dd[rank - 2 + split_dims] != p.m || dd[rank - 1 + split_dims] != p.n) return fail("output shape is not (m, n)");
  p.split_k = split_k;
  p.lda = a_cols;
  p.ldb = b_cols;
  p.ldd = p.n;

  // Walk batch dims innermost first, dropping size-1 output dims and merging a dim into
  // its inner neighbour when both operands are contiguous across the two.
  int64_t stride_a = a_rows * a_cols, stride_b = b_rows * b_cols;
  int64_t dims[16], sa[16], sb[16];
  int n = 0;
  for (int i = static_cast<int>(rank) - 3; i >= 0; --i) {
    const int64_t out = dd[i];
    const int64_t expected = da[i] == 1 ? db[i] : da[i];
    if ((db[i] != 1 && db[i] != expected) || out != expected) return fail("batch dims do not broadcast");
    const int64_t s_a = da[i] == 1 ? 0 : stride_a, s_b = db[i] == 1 ? 0 : stride_b;
    stride_a *= da[i];
    stride_b *= db[i];
    if (out == 1) continue;
    if (n > 0 && s_a == sa[n - 1] * dims[n - 1] && s_b == sb[n - 1] * dims[n - 1]) {
      dims[n - 1] *= out;
      continue;
    }
    if (n == 16) return fail("too many batch dims");
    dims[n] = out;
    sa[n] = s_a;
    sb[n] = s_b;
    ++n;
  }
  if (n > kMaxBatchDims) return fail("more than 4 alternating broadcast batch dims");
  p.batch.rank = n;
  for (int j = 0; j < n; ++j) {  // stored outermost first
    p.batch.dims[j] = dims[n - 1 - j];
    p.batch.stride_a[j] = sa[n - 1 - j];
    p.batch.stride_b[j] = sb[n - 1 - j];
    p.batch.count *= p.batch.dims[j];
  }
  for (size_t i = 0; i + 2 < rank; ++i) {
    if (dd[i] == 0) p.batch.count = 0;
  }
  p.a = a.untyped_data();
  p.b = b.untyped_data();
  p.d = d.untyped_data();
  return p;
}

}  // namespace jaxgemm
