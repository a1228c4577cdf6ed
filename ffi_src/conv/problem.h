// One 2-D convolution (NHWC activations, HWIO weights) as the handlers decode it and every
// kernel (CPU and GPU) reads it. The forward geometry is always that of
//   y[n,p,q,k] = sum_{r,s,c} x[n, p*sh - ph + r*dh, q*sw - pw + s*dw, g*Cg + c] * w[r,s,c,k]
// (g = k / Kg, Cg = C / groups, Kg = K / groups; out-of-range pixels read as zero). Each
// kind computes one implicit GEMM per group:
//   kFprop: y = act(conv(x, w) + bias) + residual, aux = pre-activation.  a = x, b = w.
//   kDgrad: dx = conv^T(dy, w).  a = dy, b = w transposed per group to (R, S, Kg, C), its
//           taps in phase order (DgradTapRows in conv/implicit_gemm.h).
//   kWgrad: dw partials (split, R, S, Cg, K) in fp32, one per chunk of N*P*Q.  a = x, b = dy.
#pragma once
#include <cstdint>

#include "common/activation.h"
#include "common/element_type.h"
#include "gemm/problem.h"

namespace jaxgemm {

// Ids are part of the FFI contract (the nanobind module's conv_kinds).
enum class ConvKind : int { kFprop = 0, kDgrad = 1, kWgrad = 2 };

struct ConvProblem {
  ConvKind kind = ConvKind::kFprop;
  int64_t n = 0, h = 0, w = 0, c = 0;  // x
  int64_t k = 0, r = 0, s = 0;         // w: (r, s, c / groups, k)
  int64_t p = 0, q = 0;                // y: (n, p, q, k)
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1;  // pads: top / left
  int64_t groups = 1;
  int64_t split = 1;  // kWgrad: chunks of N*P*Q, each writing its own fp32 partial
  ElementType in_type = ElementType::kF32;
  ElementType out_type = ElementType::kF32;
  const void* a = nullptr;
  const void* b = nullptr;
  void* out = nullptr;
  EpilogueParams epilogue;  // kFprop: bias (K), residual (like y), aux (like y), activation

  int64_t Cg() const { return c / groups; }
  int64_t Kg() const { return k / groups; }
  // N*P*Q rows per wgrad chunk, a multiple of 64 (whole k-tiles of every kernel).
  int64_t WgradChunk() const {
    const int64_t rows = n * p * q, per = (rows + split - 1) / split;
    return (per + 63) / 64 * 64;
  }
};

}  // namespace jaxgemm
