// col2im: the second half of a data gradient computed as a GEMM plus a gather, for
// convolutions with few input channels (first layers, C = 3). The GEMM
//   cols[n, p, q, (r*S + s)*C + c] = sum_k dy[n, p, q, k] * w[r, s, c, k]
// has R*S*C output columns instead of C, so it fills the tiles the phase-split dgrad kernels
// leave mostly empty; col2im then sums, for every dx element, the cols entries whose window
// tap lands on it:
//   dx[n, h, w, c] = sum over (r, s, p, q) with h = p*sh - ph + r*dh, w = q*sw - pw + s*dw
// of cols[n, p, q, (r*S + s)*C + c], in a fixed order (r, then s): deterministic.
#pragma once
#include <cstdint>

#include "common/element_type.h"
#include "common/host_device.h"

namespace jaxgemm {

struct Col2imProblem {
  int64_t n = 0, h = 0, w = 0, c = 0;  // dx
  int64_t p = 0, q = 0, r = 0, s = 0;  // cols rows (n, p, q); window taps
  int64_t pitch = 0;                   // cols row length, >= r*s*c
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1;
  ElementType type = ElementType::kF32;  // of cols and dx
  const void* cols = nullptr;
  void* dx = nullptr;
};

// The sum for dx[n, h, w, c]; `load(i)` reads cols element i as float. Index math in I
// (int32_t on the GPU, where the launcher checked the sizes fit). Host and device.
template <class I, class Load>
JG_HOST_DEVICE_INLINE float Col2imSum(const Col2imProblem& p, I n, I h, I w, I c, Load load) {
  const I sh = I(p.stride_h), sw = I(p.stride_w), rows = I(p.p), cols = I(p.q), taps_s = I(p.s);
  float sum = 0.f;
  for (I r = 0; r < I(p.r); ++r) {
    const I ih = h + I(p.pad_h) - r * I(p.dil_h);  // = y * sh for a contributing row y
    if (ih < 0) break;                            // falls as r grows
    const I y = ih / sh;
    if (y * sh != ih || y >= rows) continue;
    for (I s = 0; s < taps_s; ++s) {
      const I iw = w + I(p.pad_w) - s * I(p.dil_w);
      if (iw < 0) break;
      const I x = iw / sw;
      if (x * sw != iw || x >= cols) continue;
      sum += load(((n * rows + y) * cols + x) * I(p.pitch) + (r * taps_s + s) * I(p.c) + c);
    }
  }
  return sum;
}

// Whether every cols and dx index fits the GPU kernel's 32-bit index math.
inline bool Col2imFitsInt32(const Col2imProblem& p) {
  constexpr int64_t kMax = 0x7fffffff;
  return p.n * p.h * p.w * p.c <= kMax && p.n * p.p * p.q * p.pitch <= kMax;
}

void Col2imCpu(const Col2imProblem& p);

}  // namespace jaxgemm
