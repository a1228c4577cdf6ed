// fp8 training's quantization of one matrix into both orientations, in two passes:
//   source s = x, or in the gradient's form s = dy * act'(at) (dz of a layer's backward);
//   amax pass:     row_amax[r] = max_c |s[r, c]|, col_amax[c] = max_r |s[r, c]| (NaN wins,
//                  as in jnp.max), and in the gradient's form the column sums of s in
//                  fixed-order partials, col_partials[chunk, c] over chunks of kAmaxRows rows;
//   quantize pass: q[r, c] = e4m3(s[r, c] * (1 / row_scale[r])), qt[c, r] = e4m3(s[r, c] * (1 / col_scale[c]))
//                  (rounded to nearest, saturated to +-448; or both in e5m2, saturated to
//                  +-57344: TransformerEngine's gradients' format; the caller makes the
//                  scales from the amax, so both passes read s and nothing in between
//                  holds it). A scale vector of one value serves every row (column):
//                  per-tensor scaling. It
//                  may also write the whole tensor's amax and the column sums, as the amax
//                  pass does: delayed scaling's single pass, whose scales come from earlier
//                  steps' amax and which records this step's.
// q is the operand of the product that contracts the columns, qt (K-major, transposed) of
// the one that contracts the rows: the forward's x and x^T, the weights w and w^T, the
// backward's dz and dz^T. A pass reads s (x, or dy and at) once.
#pragma once
#include <cstdint>

#include "common/activation.h"
#include "common/element_type.h"

namespace jaxgemm {

// Rows per chunk of the amax pass's column sums (and per block of its GPU kernel).
inline constexpr int64_t kAmaxRows = 128;

struct Fp8QuantizeProblem {
  int64_t rows = 0, cols = 0;
  ElementType type = ElementType::kF32;  // of x (dy and at)
  Activation activation = Activation::kNone;
  const void* x = nullptr;   // x, or dy in the gradient's form
  const void* at = nullptr;  // the gradient's form: what act' takes (z, or y for relu); null: s = x
  // amax pass (any of them null: not wanted)
  float* row_amax = nullptr;      // (rows,)
  float* col_amax = nullptr;      // (cols,)
  float* col_partials = nullptr;  // (AmaxChunks(), cols): either pass's column sums
  // quantize pass
  const float* row_scale = nullptr;  // (rows,), or one value (row_scale_stride 0)
  const float* col_scale = nullptr;  // (cols,), or one value (col_scale_stride 0)
  int64_t row_scale_stride = 1, col_scale_stride = 1;
  void* q = nullptr;                 // (rows, cols) e4m3 (e5m2), or null
  void* qt = nullptr;                // (cols, rows) e4m3 (e5m2), or null
  bool e5m2 = false;                 // q and qt in float8_e5m2 (a gradient's range), saturated to +-57344
  float* amax = nullptr;             // (1,): max |s| over the tensor, or null (col_partials too)

  int64_t AmaxChunks() const { return (rows + kAmaxRows - 1) / kAmaxRows; }
};

void Fp8AmaxCpu(const Fp8QuantizeProblem& p);
void Fp8QuantizeCpu(const Fp8QuantizeProblem& p);

}  // namespace jaxgemm
