// The CPU reference's element-wise epilogue, one copy for the GEMM, the forward convolution
// and the grouped GEMM (the GPU kernels' counterpart is gemm/epilogue_steps.cuh). Each caller
// describes one output row (its operands' pointers already offset to the row, its batch
// index or group) and ApplyEpilogue runs the steps in cpu_epilogue.cc's fixed order.
// Adding an operand (as the per-row scale was) is a row of gemm/problem.h's table and its step
// in cpu_epilogue.cc.
#pragma once
#include <cstdint>

#include "common/activation.h"
#include "common/element_type.h"
#include "gemm/problem.h"

namespace jaxgemm {

// What one product brings to the epilogue: the gated form has two (gate and up), each
// with its own bias and aux. A null pointer turns its step off.
struct EpilogueProduct {
  const float* acc = nullptr;  // the float32 product, n columns
  const void* bias = nullptr;  // per column, EpilogueRow::bias_type
  void* aux = nullptr;         // stores z, the pre-activation value
};

// One output row of n columns. Every element operand but the bias is of its table row's type
// (gemm/problem.h: the scales float32, the others the output's).
struct EpilogueRow {
  int64_t n = 0;
  ElementType type = ElementType::kF32;       // out, the operands and aux
  ElementType bias_type = ElementType::kF32;  // the GEMM's and conv's bias: `type`; grouped: f32
  float alpha = 1.f;
  float beta = 0.f;
  // The table's operands (gemm/problem.h), each at this row's first value: a matrix
  // operand at the row, a column operand at column 0, a row operand at the row's value.
  // The bias is read from the product (z.bias, up->bias) instead.
  const void* operand[kEpilogueOperands] = {};
  // The grouped kernel rounds the product to the output type before its bias is added.
  bool round_product = false;
  EpilogueProduct z;                   // the product the activation takes
  const EpilogueProduct* up = nullptr;  // the GLU's up projection: out = act(z) * z_up
  Activation activation = Activation::kNone;
  void* out = nullptr;
};

void ApplyEpilogue(const EpilogueRow& row);

// Output row `row` of batch index z of a GEMM problem (its operands from p.epilogue, acc the
// row's float32 product, d this batch index's and split's D): the GEMM's and the
// block-scaled GEMM's rows.
EpilogueRow GemmEpilogueRow(const GemmProblem& p, int64_t z, int64_t row, const float* acc, char* d);

// base + i elements of type t, for offsetting an operand to its row; null (the operand is
// off) stays null.
inline const void* ElementAt(const void* base, int64_t i, ElementType t) {
  return base != nullptr ? static_cast<const char*>(base) + i * ElementBytes(t) : nullptr;
}
inline void* ElementAt(void* base, int64_t i, ElementType t) {
  return base != nullptr ? static_cast<char*>(base) + i * ElementBytes(t) : nullptr;
}

}  // namespace jaxgemm
