// Decodes the jaxgemm_gemm call (buffers + attributes) into a GemmProblem; shared by the
// CPU and CUDA handlers so both check the same contract:
//   a: (*batch_a, rows, cols), b: (*batch_b, rows, cols), out: (*batch, m, n) [(*batch, S, m, n)
//   for split_k = S > 1], the epilogue's operands by their shapes (gemm/problem.h: c and
//   residual (*batch_x, m, n), bias (*batch_x, n)), aux like out.
// Every batch dim of an operand is 1 (broadcast) or the output's. An epilogue operand or
// aux with no elements is absent.
#pragma once
#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "gemm/problem.h"
#include "xla/ffi/api/ffi.h"

namespace jaxgemm {

namespace ffi = xla::ffi;

// jaxgemm_gemm's attributes, decoded by name from the call's dictionary (the registration
// below): adding one is a member here, its StructMember line and its Python keyword.
struct GemmAttrs {
  bool transpose_a = false, transpose_b = false, tf32 = false;
  float alpha = 1.f, beta = 0.f;
  int64_t activation = 0, split_k = 1;
  int64_t tile_m = 0, tile_n = 0;  // a forced tile (0: the heuristic's)
  int64_t kernel = 0;              // KernelFamily id (gemm/dispatch.h); 0: heuristic
  int64_t sm_margin = 0;           // KernelRequest::sm_margin
  bool dynamic_tiles = false;      // KernelRequest::dynamic_tiles
};

}  // namespace jaxgemm

XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(
    jaxgemm::GemmAttrs,
    xla::ffi::StructMember<bool>("transpose_a"),
    xla::ffi::StructMember<bool>("transpose_b"),
    xla::ffi::StructMember<bool>("tf32"),
    xla::ffi::StructMember<float>("alpha"),
    xla::ffi::StructMember<float>("beta"),
    xla::ffi::StructMember<int64_t>("activation"),
    xla::ffi::StructMember<int64_t>("split_k"),
    xla::ffi::StructMember<int64_t>("tile_m"),
    xla::ffi::StructMember<int64_t>("tile_n"),
    xla::ffi::StructMember<int64_t>("kernel"),
    xla::ffi::StructMember<int64_t>("sm_margin"),
    xla::ffi::StructMember<bool>("dynamic_tiles"));

namespace jaxgemm {

// The operands, results and attributes of jaxgemm_gemm, after any context the platform's
// handler binds first: a, b, then one buffer per epilogue operand in kEpilogueOperandRows'
// order (gemm/problem.h; empty: absent).
template <class Binding>
auto BindGemmCall(Binding binding) {
  return std::move(binding).template Arg<ffi::AnyBuffer>()  // a
      .template Arg<ffi::AnyBuffer>()            // b
      .RemainingArgs()                           // the epilogue's operands
      .template Ret<ffi::AnyBuffer>()            // out
      .template Ret<ffi::AnyBuffer>()            // aux = pre-activation (empty: not wanted)
      .template Ret<ffi::AnyBuffer>()            // workspace (uint8; the CUDA kernels' scratch, may be empty)
      .template Attrs<GemmAttrs>();
}

inline std::string ShapeString(ffi::AnyBuffer::Dimensions dims) {
  std::string s = "(";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + (dims.size() == 1 ? ",)" : ")");
}

inline bool ToElementType(ffi::DataType t, ElementType* out) {
  switch (t) {
    case ffi::DataType::F32: *out = ElementType::kF32; return true;
    case ffi::DataType::F16: *out = ElementType::kF16; return true;
    case ffi::DataType::BF16: *out = ElementType::kBF16; return true;
    default: return false;
  }
}

// The GEMM's operands may also be 8-bit floats (IsFloat8); its output and epilogue
// operands may not.
inline bool ToGemmInputType(ffi::DataType t, ElementType* out) {
  if (t == ffi::DataType::F8E4M3FN || t == ffi::DataType::F8E5M2) {
    *out = t == ffi::DataType::F8E4M3FN ? ElementType::kF8E4M3 : ElementType::kF8E5M2;
    return true;
  }
  return ToElementType(t, out);
}

// A's and B's types into p (in_type, other_b_fp8): one type of float32, float16, bfloat16
// or float8_e4m3fn, or float8 e4m3 beside e5m2 in either order.
inline bool DecodeGemmInputTypes(ffi::DataType a, ffi::DataType b, GemmProblem* p) {
  ElementType ta, tb;
  if (!ToGemmInputType(a, &ta) || !ToGemmInputType(b, &tb)) return false;
  p->in_type = ta;
  p->other_b_fp8 = ta != tb;
  if (ta == tb) return ta != ElementType::kF8E5M2;
  return IsFloat8(ta) && IsFloat8(tb);
}

// The output's batch dims (dd, the first batch_rank) and each present operand's strides
// along them into *batch, innermost first: size-1 output dims dropped, a dim merged into its
// inner neighbour when every operand is contiguous across the two. Empty, or why not.
inline std::string DecodeBatchDims(const ffi::AnyBuffer* const (&operands)[kBatchOperands],
                                   const char* const (&names)[kBatchOperands], const bool (&present)[kBatchOperands],
                                   ffi::AnyBuffer::Dimensions dd, size_t batch_rank, BatchLayout* batch) {
  int64_t stride[kBatchOperands];  // elements of one batch index's slab, then of each dim's
  for (int o = 0; o < kBatchOperands; ++o) {
    if (!present[o]) continue;
    auto dx = operands[o]->dimensions();
    stride[o] = 1;
    for (size_t i = batch_rank; i < dx.size(); ++i) stride[o] *= dx[i];
  }
  int64_t dims[16], strides[kBatchOperands][16];
  int n = 0;
  batch->count = 1;
  for (int i = static_cast<int>(batch_rank) - 1; i >= 0; --i) {
    const int64_t out = dd[i];
    int64_t s[kBatchOperands] = {};
    for (int o = 0; o < kBatchOperands; ++o) {
      if (!present[o]) continue;
      const int64_t x = operands[o]->dimensions()[i];
      if (x != 1 && x != out) return std::string("batch dims of ") + names[o] + " do not broadcast";
      s[o] = x == 1 ? 0 : stride[o];
      stride[o] *= x;
    }
    batch->count *= out;
    if (out == 1 || out == 0) continue;
    bool merge = n > 0;
    for (int o = 0; o < kBatchOperands && merge; ++o) merge = s[o] == strides[o][n - 1] * dims[n - 1];
    if (merge) {
      dims[n - 1] *= out;
      continue;
    }
    if (n == 16) return "too many batch dims";
    dims[n] = out;
    for (int o = 0; o < kBatchOperands; ++o) strides[o][n] = s[o];
    ++n;
  }
  if (n > kMaxBatchDims) return "more than 4 alternating broadcast batch dims";
  batch->rank = n;
  for (int j = 0; j < n; ++j) {  // stored outermost first
    batch->dims[j] = dims[n - 1 - j];
    for (int o = 0; o < kBatchOperands; ++o) batch->stride[o][j] = strides[o][n - 1 - j];
  }
  return "";
}

// Why epilogue operand `row`'s buffer x cannot serve problem p (empty: it can): its dtype
// (OperandType), its shape (OperandShape) after the batch dims.
inline std::string CheckEpilogueOperand(const ffi::AnyBuffer& x, const EpilogueOperandRow& row, const GemmProblem& p,
                                        size_t batch_rank) {
  ElementType t;
  if (!ToElementType(x.element_type(), &t) || t != EpilogueOperandType(row.id, p.out_type)) {
    return std::string(row.name) + (row.type == OperandType::kFloat32 ? " needs float32" : " needs the output's dtype");
  }
  auto dx = x.dimensions();
  const bool matrix = row.shape == OperandShape::kMatrix;
  const int64_t last = row.shape == OperandShape::kRows ? p.m : p.n;
  if (dx.size() != batch_rank + (matrix ? 2 : 1) || dx[dx.size() - 1] != last || (matrix && dx[dx.size() - 2] != p.m)) {
    return std::string(row.name) + " has shape " + ShapeString(dx);
  }
  return "";
}

inline ffi::ErrorOr<GemmProblem> DecodeGemm(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b,
                                            const ffi::RemainingArgs& epilogue, const ffi::AnyBuffer& d,
                                            const ffi::AnyBuffer& aux, const GemmAttrs& attrs) {
  auto da = a.dimensions(), db = b.dimensions(), dd = d.dimensions();
  auto fail = [&](const std::string& why) {
    return ffi::Unexpected(ffi::Error::InvalidArgument("jaxgemm_gemm: " + why + " (a" + ShapeString(da) + ", b" +
                                                       ShapeString(db) + ", out" + ShapeString(dd) + ")"));
  };
  if (epilogue.size() != kEpilogueOperands) {
    return fail("needs " + std::to_string(kEpilogueOperands) + " epilogue operand buffers after a and b, got " +
                std::to_string(epilogue.size()));
  }
  // The operands with batch dims (a, b, then the table's), present when non-empty.
  const ffi::AnyBuffer* operands[kBatchOperands] = {&a, &b};
  const char* names[kBatchOperands] = {"a", "b"};
  bool present[kBatchOperands] = {true, true};
  std::optional<ffi::AnyBuffer> buffers[kEpilogueOperands];
  bool any_operand = false;
  for (int o = 0; o < kEpilogueOperands; ++o) {
    auto x = epilogue.get<ffi::AnyBuffer>(o);
    if (!x.has_value()) return fail(std::string("epilogue operand ") + kEpilogueOperandRows[o].name + " is no buffer");
    buffers[o] = *x;
    operands[BatchOperandOf(o)] = &*buffers[o];
    names[BatchOperandOf(o)] = kEpilogueOperandRows[o].name;
    present[BatchOperandOf(o)] = buffers[o]->element_count() > 0;
    any_operand = any_operand || present[BatchOperandOf(o)];
  }
  const bool split = attrs.split_k > 1;
  const size_t rank = da.size();
  if (attrs.split_k < 1) return fail("split_k must be >= 1");
  if (rank < 2 || db.size() != rank || dd.size() != rank + (split ? 1 : 0)) {
    return fail("operands need equal ranks >= 2 (plus a split dim in the output when split_k > 1)");
  }
  GemmProblem p;
  if (!DecodeGemmInputTypes(a.element_type(), b.element_type(), &p)) {
    return fail("a and b need one dtype of float32, float16, bfloat16, float8_e4m3fn, or float8_e4m3fn beside "
                "float8_e5m2");
  }
  if (!ToElementType(d.element_type(), &p.out_type)) return fail("unsupported output dtype");
  if (IsFloat8(p.in_type)) {
    if (split || p.out_type == ElementType::kF16) {
      return fail("float8 inputs take a bfloat16 or float32 output and no split-K");
    }
    if (attrs.transpose_a || !attrs.transpose_b) return fail("float8 operands must both be K-major (a (m, k), b (n, k))");
  } else if (present[BatchOperandOf(kEpilogueRowScale)] || present[BatchOperandOf(kEpilogueColScale)]) {
    return fail("row_scale and col_scale scale float8 products only");
  }
  if (!IsActivation(static_cast<int>(attrs.activation))) return fail("unknown activation id");
  if (split && p.out_type != ElementType::kF32) return fail("split-K partials must be float32");

  p.trans_a = attrs.transpose_a;
  p.trans_b = attrs.transpose_b;
  p.tf32 = attrs.tf32;
  const int64_t a_rows = da[rank - 2], a_cols = da[rank - 1];
  const int64_t b_rows = db[rank - 2], b_cols = db[rank - 1];
  p.m = p.trans_a ? a_cols : a_rows;
  p.k = p.trans_a ? a_rows : a_cols;
  p.n = p.trans_b ? b_rows : b_cols;
  if ((p.trans_b ? b_cols : b_rows) != p.k) return fail("inner dimensions differ");
  if (dd[dd.size() - 2] != p.m || dd[dd.size() - 1] != p.n) return fail("output shape is not (m, n)");
  if (split && dd[rank - 2] != attrs.split_k) return fail("the split dim of the output is not split_k");
  p.lda = a_cols;
  p.ldb = b_cols;
  p.ldd = p.n;
  p.split_k = attrs.split_k;

  const size_t batch_rank = rank - 2;
  if (split && any_operand) return fail("split-K takes no epilogue operands");
  for (int o = 0; o < kEpilogueOperands; ++o) {
    if (!present[BatchOperandOf(o)]) continue;
    const std::string why = CheckEpilogueOperand(*buffers[o], kEpilogueOperandRows[o], p, batch_rank);
    if (!why.empty()) return fail(why);
    p.epilogue.operand[o] = buffers[o]->untyped_data();
  }
  const bool has_aux = aux.element_count() > 0;
  if (has_aux && (aux.element_type() != d.element_type() || aux.dimensions().size() != dd.size() || split)) {
    return fail("aux must match the output");
  }

  const std::string batch_error = DecodeBatchDims(operands, names, present, dd, batch_rank, &p.batch);
  if (!batch_error.empty()) return fail(batch_error);

  p.a = a.untyped_data();
  p.b = b.untyped_data();
  p.d = d.untyped_data();
  p.epilogue.alpha = attrs.alpha;
  p.epilogue.beta = p.epilogue.c() ? attrs.beta : 0.f;
  p.epilogue.activation = static_cast<Activation>(attrs.activation);
  p.epilogue.aux = has_aux ? aux.untyped_data() : nullptr;
  return p;
}

}  // namespace jaxgemm
