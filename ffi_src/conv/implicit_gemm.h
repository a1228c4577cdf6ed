// A convolution as the kernels see it: per group, one GEMM D[m, n] = sum_k A[m, k] B[k, n]
// in which B and D are dense row-major matrices and A is gathered from an NHWC tensor
// (im2col, never materialized). Built once on the host from a ConvProblem, passed to the
// kernel by value; every divisor the loaders need comes as a FastDivmod.
//
//          rows m                 k                     A (gathered)     B            D
//   fprop  (n, p, q) of y         (r, s, c)             x                w            y
//   dgrad  (n, i, j) of a phase   (r, s, k) of its taps dy               w^T, phased  dx rows of the phase
//   wgrad  (r, s, c) of dw        (n, p, q), split      x, transposed    dy           dw partials
//
// dgrad runs one GEMM per output phase (h mod stride_h, w mod stride_w): the taps that
// reach a phase's pixels form an arithmetic progression, and dx[n, ph + stride * i] gathers
// dy[n, i + offset - t * step] over the phase's taps t: a stride-1 fprop-form gather (with
// a negative dilation), so no tap is multiplied only to be discarded.
#pragma once
#include <cstdint>
#include <numeric>
#include <vector>

#include "common/fast_divmod.h"
#include "conv/problem.h"
#include "gemm/problem.h"

namespace jaxgemm {

struct ConvGemm {
  int64_t m = 0, n = 0, k = 0;  // one group's GEMM
  int64_t groups = 1, split = 1, k_chunk = 0;  // k is cut into `split` chunks of k_chunk
  // The gathered tensor: (images, a_h, a_w, a_pitch) with a_cg channels per group.
  const void* a = nullptr;
  int32_t a_h = 0, a_w = 0, a_cg = 0;
  int64_t a_pitch = 0;
  // The image whose pixels index the rows (fprop, dgrad) or the k of wgrad.
  int32_t o_h = 0, o_w = 0;
  int32_t r = 1, s = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1;
  FastDivmod div_cg, div_s;    // (r, s, c) from an index over R*S*a_cg (or Cg)
  FastDivmod div_ohw, div_ow;  // (n, y, x) from a pixel index of the o image
  const void* b = nullptr;
  int64_t ldb = 0;        // B's row pitch; group g's columns start at g * n
  GemmProblem out;        // D and the epilogue: m x n per group, ldd = row pitch
  int64_t out_split_stride = 0;  // elements between wgrad partials
  // dgrad: row (n, i, j) of a phase is dx pixel (n, phase_y + i * step_y, phase_x + j * step_x).
  int32_t dx_h = 0, dx_w = 0, phase_y = 0, phase_x = 0, step_y = 1, step_x = 1;

  // D's row of GEMM row m: a pixel of dx for dgrad, m itself otherwise.
  template <bool kPhased>
  JG_HOST_DEVICE_INLINE int64_t OutRow(int64_t m) const {
    if (!kPhased) return m;
    int n, yx, y, x;
    div_ohw.DivMod(static_cast<int32_t>(m), &n, &yx);
    div_ow.DivMod(yx, &y, &x);
    return (int64_t(n) * dx_h + phase_y + y * step_y) * dx_w + phase_x + x * step_x;
  }
};

// The taps t = first + j * step (j < count) of one dimension whose input rows land on
// output rows of phase `phase` in dgrad: (phase + pad - t * dil) divisible by the stride.
struct PhaseTaps {
  int64_t first = 0, count = 0, step = 1;
};

inline int64_t FloorMod(int64_t a, int64_t b) { return ((a % b) + b) % b; }

inline PhaseTaps TapsOfPhase(int64_t phase, int64_t taps, int64_t stride, int64_t pad, int64_t dil) {
  PhaseTaps t;
  t.step = stride / std::gcd(stride, dil);
  for (int64_t r = 0; r < taps; ++r) {
    if (FloorMod(phase + pad - r * dil, stride) != 0) continue;
    if (t.count++ == 0) t.first = r;
  }
  return t;
}

// dgrad's B is w^T (R, S, Kg, C) with its taps in phase order: phases (y outer, x inner),
// then their taps (r outer, s inner). Returns the first B row (k = 0) of every tap r * S + s;
// jaxgemm/conv.py builds the same order.
inline std::vector<int64_t> DgradTapRows(const ConvProblem& p) {
  std::vector<int64_t> rows(static_cast<size_t>(p.r * p.s), 0);
  int64_t next = 0;
  for (int64_t py = 0; py < p.stride_h; ++py) {
    const PhaseTaps ty = TapsOfPhase(py, p.r, p.stride_h, p.pad_h, p.dil_h);
    for (int64_t px = 0; px < p.stride_w; ++px) {
      const PhaseTaps tx = TapsOfPhase(px, p.s, p.stride_w, p.pad_w, p.dil_w);
      for (int64_t i = 0; i < ty.count; ++i) {
        for (int64_t j = 0; j < tx.count; ++j) {
          rows[(ty.first + i * ty.step) * p.s + tx.first + j * tx.step] = next;
          next += p.Kg();
        }
      }
    }
  }
  return rows;
}

// Sizes the 32-bit index math of the loaders can take.
inline bool ConvFitsInt32(const ConvProblem& p) {
  const int64_t lim = int64_t{1} << 30;
  return p.n * p.h * p.w < lim && p.n * p.p * p.q < lim && p.h < lim && p.w < lim && p.c < lim && p.k < lim &&
         p.r * p.s * p.c < lim && p.r * p.s * p.k < lim && p.r * p.dil_h < lim && p.s * p.dil_w < lim &&
         p.p * p.stride_h < lim && p.q * p.stride_w < lim && p.h + p.pad_h < lim && p.w + p.pad_w < lim &&
         p.pad_h > -lim && p.pad_w > -lim && p.stride_h < lim && p.stride_w < lim;
}

inline ConvGemm MakeConvGemm(const ConvProblem& p) {
  ConvGemm g;
  const int64_t cg = p.Cg(), kg = p.Kg();
  g.groups = p.groups;
  g.r = static_cast<int32_t>(p.r), g.s = static_cast<int32_t>(p.s);
  g.stride_h = static_cast<int32_t>(p.stride_h), g.stride_w = static_cast<int32_t>(p.stride_w);
  g.pad_h = static_cast<int32_t>(p.pad_h), g.pad_w = static_cast<int32_t>(p.pad_w);
  g.dil_h = static_cast<int32_t>(p.dil_h), g.dil_w = static_cast<int32_t>(p.dil_w);
  g.div_s = FastDivmod(g.s);
  g.a = p.a;
  g.b = p.b;
  g.out.out_type = p.out_type;
  g.out.d = p.out;
  switch (p.kind) {
    case ConvKind::kFprop:
      g.m = p.n * p.p * p.q, g.n = kg, g.k = p.r * p.s * cg;
      g.a_h = int32_t(p.h), g.a_w = int32_t(p.w), g.a_cg = int32_t(cg), g.a_pitch = p.c;
      g.o_h = int32_t(p.p), g.o_w = int32_t(p.q);
      g.ldb = p.k;
      g.out.ldd = p.k;
      g.out.epilogue = p.epilogue;
      break;
    case ConvKind::kDgrad:  // the whole dx as one phase; DgradPhases() splits it
      g.m = p.n * p.h * p.w, g.n = cg, g.k = p.r * p.s * kg;
      g.a_h = int32_t(p.p), g.a_w = int32_t(p.q), g.a_cg = int32_t(kg), g.a_pitch = p.k;
      g.o_h = int32_t(p.h), g.o_w = int32_t(p.w);
      g.ldb = p.c;
      g.out.ldd = p.c;
      g.dx_h = int32_t(p.h), g.dx_w = int32_t(p.w);
      break;
    case ConvKind::kWgrad:
      g.m = p.r * p.s * cg, g.n = kg, g.k = p.n * p.p * p.q;
      g.a_h = int32_t(p.h), g.a_w = int32_t(p.w), g.a_cg = int32_t(cg), g.a_pitch = p.c;
      g.o_h = int32_t(p.p), g.o_w = int32_t(p.q);
      g.ldb = p.k;
      g.out.ldd = p.k;
      g.split = p.split;
      g.out_split_stride = g.m * p.k;
      break;
  }
  g.k_chunk = p.kind == ConvKind::kWgrad ? p.WgradChunk() : g.k;
  g.div_cg = FastDivmod(g.a_cg);
  g.div_ohw = FastDivmod(g.o_h * g.o_w);
  g.div_ow = FastDivmod(g.o_w);
  g.out.m = g.m;
  g.out.n = g.n;
  g.out.k = g.k;
  return g;
}

// dgrad's GEMMs, one per output phase with any pixels (see the top of this file).
inline std::vector<ConvGemm> DgradPhases(const ConvProblem& p) {
  const ConvGemm whole = MakeConvGemm(p);
  std::vector<ConvGemm> phases;
  int64_t b_row = 0;
  for (int64_t py = 0; py < p.stride_h; ++py) {
    const PhaseTaps ty = TapsOfPhase(py, p.r, p.stride_h, p.pad_h, p.dil_h);
    for (int64_t px = 0; px < p.stride_w; ++px) {
      const PhaseTaps tx = TapsOfPhase(px, p.s, p.stride_w, p.pad_w, p.dil_w);
      ConvGemm g = whole;
      const int64_t rows_y = py < p.h ? (p.h - py + p.stride_h - 1) / p.stride_h : 0;
      const int64_t rows_x = px < p.w ? (p.w - px + p.stride_w - 1) / p.stride_w : 0;
      g.m = p.n * rows_y * rows_x;
      g.k = ty.count * tx.count * p.Kg();
      g.k_chunk = g.k;
      g.o_h = int32_t(rows_y), g.o_w = int32_t(rows_x);
      g.div_ohw = FastDivmod(g.o_h * g.o_w);
      g.div_ow = FastDivmod(g.o_w);
      g.r = int32_t(ty.count), g.s = int32_t(tx.count);
      g.div_s = FastDivmod(g.s);
      // dy row of phase row i at tap t: i + (py + pad - first * dil) / stride - t * step * dil / stride,
      // i.e. the fprop form with stride 1, pad -offset and dilation -step * dil / stride.
      g.stride_h = 1, g.stride_w = 1;
      g.pad_h = int32_t(-(py + p.pad_h - ty.first * p.dil_h) / p.stride_h);
      g.pad_w = int32_t(-(px + p.pad_w - tx.first * p.dil_w) / p.stride_w);
      g.dil_h = int32_t(-ty.step * p.dil_h / p.stride_h);
      g.dil_w = int32_t(-tx.step * p.dil_w / p.stride_w);
      g.b = static_cast<const char*>(p.b) + b_row * p.c * ElementBytes(p.in_type);
      g.phase_y = int32_t(py), g.phase_x = int32_t(px);
      g.step_y = int32_t(p.stride_h), g.step_x = int32_t(p.stride_w);
      g.out.m = g.m;
      g.out.k = g.k;
      b_row += g.k;
      if (g.m > 0) phases.push_back(g);
    }
  }
  return phases;
}

}  // namespace jaxgemm
