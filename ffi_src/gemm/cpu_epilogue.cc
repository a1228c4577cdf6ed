#include "gemm/cpu_epilogue.h"

namespace jaxgemm {
namespace {

// Where operand `o` of a GEMM problem starts for output row `row`, by the operand's shape:
// `slab` is its batch index's offset, `pitch` a matrix operand's row pitch.
int64_t OperandAtRow(int o, int64_t slab, int64_t row, int64_t pitch) {
  switch (kEpilogueOperandRows[o].shape) {
    case OperandShape::kMatrix: return slab + row * pitch;
    case OperandShape::kColumns: return slab;
    case OperandShape::kRows: return slab + row;
  }
  return slab;
}

// v rounded to t, as the grouped kernel's epilogue rounds the product before its bias.
float RoundTo(float v, ElementType t) {
  uint32_t word = 0;
  StoreFromFloat(&word, 0, v, t);
  return LoadAsFloat(&word, 0, t);
}

// The steps up to the activation, in order:
//   z = round(alpha * (acc * row_scale * col_scale) + beta * C) + bias; aux = z.
// The GLU's up projection takes the same steps with its own acc, bias and aux.
float PreActivation(const EpilogueRow& r, const EpilogueProduct& p, int64_t col) {
  float v = p.acc[col];
  if (const void* s = r.operand[kEpilogueRowScale]) v *= static_cast<const float*>(s)[0];
  if (const void* s = r.operand[kEpilogueColScale]) v *= static_cast<const float*>(s)[col];
  v *= r.alpha;
  if (const void* c = r.operand[kEpilogueC]) v += r.beta * LoadAsFloat(c, col, r.type);
  if (r.round_product) v = RoundTo(v, r.type);
  if (p.bias != nullptr) v += LoadAsFloat(p.bias, col, r.bias_type);
  if (p.aux != nullptr) StoreFromFloat(p.aux, col, v, r.type);
  return v;
}

}  // namespace

// Then: out = act(z) [* z_up] + residual.
void ApplyEpilogue(const EpilogueRow& r) {
  for (int64_t col = 0; col < r.n; ++col) {
    float v = ApplyActivation(r.activation, PreActivation(r, r.z, col));
    if (r.up != nullptr) v *= PreActivation(r, *r.up, col);
    if (const void* residual = r.operand[kEpilogueResidual]) v += LoadAsFloat(residual, col, r.type);
    StoreFromFloat(r.out, col, v, r.type);
  }
}

// z = alpha*acc*row_scale*col_scale + beta*C + bias; D = act(z) + residual; Aux = z.
EpilogueRow GemmEpilogueRow(const GemmProblem& p, int64_t z, int64_t row, const float* acc, char* d) {
  const EpilogueParams& e = p.epilogue;
  const ElementType t = p.out_type;
  const int64_t row_offset = row * p.ldd;  // within this batch index's m x n slab
  EpilogueRow r;
  r.n = p.n;
  r.type = r.bias_type = t;
  r.alpha = e.alpha;
  r.beta = e.beta;
  for (int o = 0; o < kEpilogueOperands; ++o) {
    r.operand[o] = ElementAt(e.operand[o], OperandAtRow(o, p.batch.Offset(z, BatchOperandOf(o)), row, p.ldd),
                             EpilogueOperandType(o, t));
  }
  r.z.acc = acc;
  r.z.bias = r.operand[kEpilogueBias];
  r.z.aux = ElementAt(e.aux, z * p.m * p.n + row_offset, t);
  r.activation = e.activation;
  r.out = ElementAt(d, row_offset, t);
  return r;
}

}  // namespace jaxgemm
