// fp8's blockwise quantization (DeepSeek-V3's recipe) of a matrix into both orientations in
// one pass: for each 128 x 128 tile of s (x, or dy * act'(at), a layer's dz), the amax of
// every row's 128 values (q's 1 x 128 blocks along the columns) and of every column's (qt's
// blocks along the rows), or with `tiles` of the whole tile (weights: one scale per
// 128 x 128 tile, shared by both orientations);
//   q[r, c]  = e4m3(s[r, c] * (1 / q_scale[r, c / 128]))     q (rows, cols)
//   qt[c, r] = e4m3(s[r, c] * (1 / qt_scale[c, r / 128]))    qt (cols, rows)
// scale = amax / 448 (e5m2: / 57344; 1 for an all-zero block, a NaN amax too); a tile's
// scale in `tiles` form stands on each of its rows (the layout scaled_matmul takes). In
// the gradient's form also the column sums of s over each tile's rows, col_partials
// (rows / 128, cols), in a fixed order. Every block lies in one tile, so s is read once.
#pragma once
#include <cstdint>

#include "common/activation.h"
#include "common/element_type.h"

namespace jaxgemm {

inline constexpr int64_t kQuantBlock = 128;

struct Fp8BlockQuantizeProblem {
  int64_t rows = 0, cols = 0;  // multiples of kQuantBlock
  ElementType type = ElementType::kF32;  // of x (dy and at)
  Activation activation = Activation::kNone;
  const void* x = nullptr;   // x, or dy in the gradient's form
  const void* at = nullptr;  // the gradient's form: what act' takes; null: s = x
  bool tiles = false;        // one scale per tile (weights)
  void* q = nullptr;         // (rows, cols) e4m3 (e5m2)
  float* q_scale = nullptr;  // (rows, cols / 128)
  void* qt = nullptr;        // (cols, rows) e4m3 (e5m2)
  float* qt_scale = nullptr;      // (cols, rows / 128)
  float* col_partials = nullptr;  // (rows / 128, cols), or null
  bool e5m2 = false;              // q and qt in float8_e5m2 (a gradient's format), scale amax / 57344
};

void Fp8BlockQuantizeCpu(const Fp8BlockQuantizeProblem& p);

}  // namespace jaxgemm
