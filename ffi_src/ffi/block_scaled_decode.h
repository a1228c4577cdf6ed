// Decodes the jaxgemm_block_scaled_gemm call into a GemmProblem and its BlockScales
// (gemm/block_scales.h); shared by the CPU and CUDA handlers so both check one contract:
//   a: (batch, m, k) and b: (batch, n, k) float8_e4m3fn, or e5m2 beside e4m3 (both K-major),
//   scales_a: (batch, blocks, pitch_a) and scales_b: (batch, blocks, pitch_b) float32, the
//     pitches multiples of 4 and at least m and ceil(n / b_scale_rows), blocks dividing k
//     into blocks of a multiple of 128 values,
//   bias: (1 or batch, n) in out's dtype, or empty (none),
//   out: (batch, m, n) bfloat16 or float32, aux: like out (z, the pre-activation) or empty,
//   activation: an Activation id,
//   b_scale_rows: rows of b per scale, 1 or 64 (BlockScales::b_rows).
// The epilogue is the GEMM's (gemm/epilogue_steps.cuh): z = block-scaled sum + bias,
// D = act(z), Aux = z.
#pragma once
#include <string>
#include <utility>

#include "ffi/gemm_decode.h"
#include "gemm/block_scales.h"
#include "gemm/problem.h"
#include "xla/ffi/api/ffi.h"

namespace jaxgemm {

// K values per k-tile of the block-scaled kernel: blocks are whole k-tiles.
inline constexpr int64_t kBlockScaleGranule = 128;

template <class Binding>
auto BindBlockScaledCall(Binding binding) {
  return std::move(binding).template Arg<ffi::AnyBuffer>()  // a
      .template Arg<ffi::AnyBuffer>()            // b
      .template Arg<ffi::AnyBuffer>()            // scales_a
      .template Arg<ffi::AnyBuffer>()            // scales_b
      .template Arg<ffi::AnyBuffer>()            // bias (empty: none)
      .template Ret<ffi::AnyBuffer>()            // out
      .template Ret<ffi::AnyBuffer>()            // aux (empty: not wanted)
      .template Attr<int64_t>("activation")
      .template Attr<int64_t>("b_scale_rows");
}

// The epilogue's part of the call into p (whose batch and out_type are decoded): why it
// cannot serve (empty: it can).
inline std::string DecodeBlockScaledEpilogue(const ffi::AnyBuffer& bias, const ffi::AnyBuffer& out,
                                             const ffi::AnyBuffer& aux, int64_t activation, GemmProblem* p) {
  if (!IsActivation(static_cast<int>(activation))) return "unknown activation id";
  if (bias.element_count() > 0) {
    // (The operand table's rule for its dtype and shape, one batch dim of 1 or batch.)
    auto dbias = bias.dimensions();
    if (!CheckEpilogueOperand(bias, kEpilogueOperandRows[kEpilogueBias], *p, 1).empty() ||
        (dbias[0] != 1 && dbias[0] != p->batch.count)) {
      return "bias must be (1 or batch, n) in out's dtype, got bias" + ShapeString(dbias);
    }
    p->epilogue.operand[kEpilogueBias] = bias.untyped_data();
    if (p->batch.rank == 1 && dbias[0] > 1) p->batch.stride[BatchOperandOf(kEpilogueBias)][0] = p->n;
  }
  if (aux.element_count() > 0) {
    if (aux.element_type() != out.element_type() || aux.element_count() != out.element_count()) {
      return "aux must match out";
    }
    p->epilogue.aux = aux.untyped_data();
  }
  p->epilogue.activation = static_cast<Activation>(activation);
  return "";
}

struct BlockScaledGemm {
  GemmProblem problem;
  BlockScales scales;
};

inline ffi::ErrorOr<BlockScaledGemm> DecodeBlockScaledGemm(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b,
                                                           const ffi::AnyBuffer& scales_a,
                                                           const ffi::AnyBuffer& scales_b, const ffi::AnyBuffer& bias,
                                                           const ffi::AnyBuffer& out, const ffi::AnyBuffer& aux,
                                                           int64_t activation, int64_t b_scale_rows) {
  auto da = a.dimensions(), db = b.dimensions(), dsa = scales_a.dimensions(), dsb = scales_b.dimensions();
  auto dd = out.dimensions();
  auto fail = [&](const std::string& why) {
    return ffi::Unexpected(ffi::Error::InvalidArgument(
        "jaxgemm_block_scaled_gemm: " + why + " (a" + ShapeString(da) + ", b" + ShapeString(db) + ", scales_a" +
        ShapeString(dsa) + ", scales_b" + ShapeString(dsb) + ", out" + ShapeString(dd) + ")"));
  };
  if (da.size() != 3 || db.size() != 3 || dsa.size() != 3 || dsb.size() != 3 || dd.size() != 3) {
    return fail("every operand must be 3-D");
  }
  GemmProblem p;
  if (!DecodeGemmInputTypes(a.element_type(), b.element_type(), &p) || !IsFloat8(p.in_type)) {
    return fail("a and b must be float8_e4m3fn, or float8_e4m3fn beside float8_e5m2");
  }
  if (scales_a.element_type() != ffi::DataType::F32 || scales_b.element_type() != ffi::DataType::F32) {
    return fail("the scales must be float32");
  }
  if (out.element_type() == ffi::DataType::BF16) {
    p.out_type = ElementType::kBF16;
  } else if (out.element_type() == ffi::DataType::F32) {
    p.out_type = ElementType::kF32;
  } else {
    return fail("out must be bfloat16 or float32");
  }
  if (b_scale_rows != 1 && b_scale_rows != kBlockScaleGroupRows) return fail("b_scale_rows must be 1 or 64");
  const int64_t batch = da[0], m = da[1], k = da[2], n = db[1], blocks = dsa[1];
  if (db[0] != batch || db[2] != k || dd[0] != batch || dd[1] != m || dd[2] != n) {
    return fail("a (batch, m, k), b (batch, n, k) and out (batch, m, n) disagree");
  }
  const int64_t b_scales = (n + b_scale_rows - 1) / b_scale_rows;
  if (dsa[0] != batch || dsb[0] != batch || dsb[1] != blocks || dsa[2] < m || dsb[2] < b_scales || dsa[2] % 4 ||
      dsb[2] % 4) {
    return fail("scales_a must be (batch, blocks, pitch >= m) and scales_b (batch, blocks, pitch >= ceil(n / "
                "b_scale_rows)), pitches multiples of 4");
  }
  if (k <= 0 || blocks <= 0 || k % blocks || (k / blocks) % kBlockScaleGranule) {
    return fail("K must split into blocks of a multiple of 128 values");
  }
  p.m = m;
  p.n = n;
  p.k = k;
  p.trans_b = true;
  p.lda = p.ldb = k;
  p.ldd = n;
  p.batch.count = batch;
  if (batch > 1) {
    p.batch.rank = 1;
    p.batch.dims[0] = batch;
    p.batch.stride[kOperandA][0] = m * k;
    p.batch.stride[kOperandB][0] = n * k;
  }
  const std::string epilogue_error = DecodeBlockScaledEpilogue(bias, out, aux, activation, &p);
  if (!epilogue_error.empty()) return fail(epilogue_error);
  p.a = a.untyped_data();
  p.b = b.untyped_data();
  p.d = out.untyped_data();
  BlockScales s;
  s.a = static_cast<const float*>(scales_a.untyped_data());
  s.b = static_cast<const float*>(scales_b.untyped_data());
  s.blocks = blocks;
  s.block_k = k / blocks;
  s.b_rows = b_scale_rows;
  s.pitch_a = dsa[2];
  s.pitch_b = dsb[2];
  return BlockScaledGemm{p, s};
}

}  // namespace jaxgemm
