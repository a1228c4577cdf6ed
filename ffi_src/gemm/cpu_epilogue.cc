#include "gemm/cpu_epilogue.h"

namespace jaxgemm {
namespace {

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

}  // namespace jaxgemm
