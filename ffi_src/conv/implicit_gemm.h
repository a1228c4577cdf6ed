// A convolution as the kernels see it: per group, one GEMM D[m, n] = sum_k A[m, k] B[k, n]
// in which B and D are dense row-major matrices and A is gathered from an NHWC tensor
// (im2col, never materialized). Built once on the host from a ConvProblem, passed to the
// kernel by value; every divisor the loaders need comes as a FastDivmod.
//
//          rows m                 k                     A (gathered)     B            D
//   fprop  (n, p, q) of y         (r, s, c)             x                w            y
//   dgrad  (n, h, w) of dx        (r, s, k)             dy               w^T (R,S,Kg,C) dx
//   wgrad  (r, s, c) of dw        (n, p, q), split      x, transposed    dy           dw partials
#pragma once
#include <cstdint>

#include "conv/fast_divmod.h"
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
  FastDivmod div_stride_h, div_stride_w;  // dgrad: which output pixel a tap comes from
  FastDivmod div_cg, div_s;               // (r, s, c) from an index over R*S*a_cg (or Cg)
  FastDivmod div_ohw, div_ow;             // (n, y, x) from a pixel index of the o image
  const void* b = nullptr;
  int64_t ldb = 0;        // B's row pitch; group g's columns start at g * n
  GemmProblem out;        // D and the epilogue: m x n per group, ldd = row pitch
  int64_t out_split_stride = 0;  // elements between wgrad partials
};

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
  g.div_stride_h = FastDivmod(g.stride_h);
  g.div_stride_w = FastDivmod(g.stride_w);
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
    case ConvKind::kDgrad:
      g.m = p.n * p.h * p.w, g.n = cg, g.k = p.r * p.s * kg;
      g.a_h = int32_t(p.p), g.a_w = int32_t(p.q), g.a_cg = int32_t(kg), g.a_pitch = p.k;
      g.o_h = int32_t(p.h), g.o_w = int32_t(p.w);
      g.ldb = p.c;
      g.out.ldd = p.c;
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

}  // namespace jaxgemm
