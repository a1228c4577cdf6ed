#include "conv/cpu_conv.h"

#include <algorithm>
#include <vector>

#include "conv/implicit_gemm.h"
#include "gemm/cpu_epilogue.h"

namespace jaxgemm {
namespace {

std::vector<float> ToFloats(const void* x, int64_t count, ElementType t) {
  std::vector<float> out(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) out[i] = LoadAsFloat(x, i, t);
  return out;
}

// Input row of output row (p) at tap r, or -1 when it falls in the padding.
int64_t InputRow(int64_t p, int64_t r, int64_t stride, int64_t pad, int64_t dil, int64_t extent) {
  const int64_t i = p * stride - pad + r * dil;
  return i >= 0 && i < extent ? i : -1;
}

// Output row of input row h at tap r (the inverse map, for dgrad), or -1 when none.
int64_t OutputRow(int64_t h, int64_t r, int64_t stride, int64_t pad, int64_t dil, int64_t extent) {
  const int64_t num = h + pad - r * dil;
  if (num < 0 || num % stride != 0 || num / stride >= extent) return -1;
  return num / stride;
}

// The epilogue of one output pixel (row: its first element), the GEMM's without alpha and
// C: z = acc + bias; y = act(z) + residual; aux = z.
EpilogueRow PixelOperands(const ConvProblem& p, int64_t row, const float* acc) {
  const EpilogueParams& e = p.epilogue;
  const ElementType t = p.out_type;
  EpilogueRow r;
  r.n = p.k;
  r.type = r.bias_type = t;
  r.z.acc = acc;
  r.z.bias = e.bias();
  r.z.aux = ElementAt(e.aux, row, t);
  r.activation = e.activation;
  r.operand[kEpilogueResidual] = ElementAt(e.residual(), row, t);
  r.out = ElementAt(p.out, row, t);
  return r;
}

// y[n,p,q,:] for one pixel at a time: acc over (r, s, c) of x * w, contiguous in k.
void Fprop(const ConvProblem& p) {
  const int64_t cg = p.Cg(), kg = p.Kg();
  const std::vector<float> w = ToFloats(p.b, p.r * p.s * cg * p.k, p.in_type);
  std::vector<float> acc(static_cast<size_t>(p.k)), pixel(static_cast<size_t>(p.c));
  for (int64_t n = 0; n < p.n; ++n) {
    for (int64_t op = 0; op < p.p; ++op) {
      for (int64_t oq = 0; oq < p.q; ++oq) {
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int64_t r = 0; r < p.r; ++r) {
          const int64_t ih = InputRow(op, r, p.stride_h, p.pad_h, p.dil_h, p.h);
          if (ih < 0) continue;
          for (int64_t s = 0; s < p.s; ++s) {
            const int64_t iw = InputRow(oq, s, p.stride_w, p.pad_w, p.dil_w, p.w);
            if (iw < 0) continue;
            const int64_t x_off = ((n * p.h + ih) * p.w + iw) * p.c;
            for (int64_t c = 0; c < p.c; ++c) pixel[c] = LoadAsFloat(p.a, x_off + c, p.in_type);
            for (int64_t g = 0; g < p.groups; ++g) {
              for (int64_t c = 0; c < cg; ++c) {
                const float xv = pixel[g * cg + c];
                const float* w_row = w.data() + ((r * p.s + s) * cg + c) * p.k + g * kg;
                float* a = acc.data() + g * kg;
                for (int64_t k = 0; k < kg; ++k) a[k] += xv * w_row[k];
              }
            }
          }
        }
        const int64_t row = ((n * p.p + op) * p.q + oq) * p.k;
        ApplyEpilogue(PixelOperands(p, row, acc.data()));
      }
    }
  }
}

// dx[n,h,w,c] = sum over taps whose output pixel exists of dy[n,p,q,g*Kg:] . w[r,s,c,g*Kg:]
// (b is the forward weight transposed per group to (R, S, Kg, C), rows of k with contiguous
// c, its taps in the kernels' phase order: tap_rows says where each one starts).
void Dgrad(const ConvProblem& p) {
  const int64_t cg = p.Cg(), kg = p.Kg();
  const std::vector<float> wt = ToFloats(p.b, p.r * p.s * kg * p.c, p.in_type);
  const std::vector<int64_t> tap_rows = DgradTapRows(p);
  std::vector<float> acc(static_cast<size_t>(p.c)), pixel(static_cast<size_t>(p.k));
  for (int64_t n = 0; n < p.n; ++n) {
    for (int64_t ih = 0; ih < p.h; ++ih) {
      for (int64_t iw = 0; iw < p.w; ++iw) {
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int64_t r = 0; r < p.r; ++r) {
          const int64_t op = OutputRow(ih, r, p.stride_h, p.pad_h, p.dil_h, p.p);
          if (op < 0) continue;
          for (int64_t s = 0; s < p.s; ++s) {
            const int64_t oq = OutputRow(iw, s, p.stride_w, p.pad_w, p.dil_w, p.q);
            if (oq < 0) continue;
            const int64_t dy_off = ((n * p.p + op) * p.q + oq) * p.k;
            for (int64_t k = 0; k < p.k; ++k) pixel[k] = LoadAsFloat(p.a, dy_off + k, p.in_type);
            for (int64_t g = 0; g < p.groups; ++g) {
              for (int64_t k = 0; k < kg; ++k) {
                const float dv = pixel[g * kg + k];
                const float* w_row = wt.data() + (tap_rows[r * p.s + s] + k) * p.c + g * cg;
                float* a = acc.data() + g * cg;
                for (int64_t c = 0; c < cg; ++c) a[c] += dv * w_row[c];
              }
            }
          }
        }
        const int64_t row = ((n * p.h + ih) * p.w + iw) * p.c;
        for (int64_t c = 0; c < p.c; ++c) StoreFromFloat(p.out, row + c, acc[c], p.out_type);
      }
    }
  }
}

// dw partial of chunk j: sum over its (n, p, q) of x[n, ih, iw, g*Cg + c] * dy[n,p,q,k].
void Wgrad(const ConvProblem& p) {
  const int64_t cg = p.Cg(), kg = p.Kg(), rows = p.n * p.p * p.q, chunk = p.WgradChunk();
  const int64_t slab = p.r * p.s * cg * p.k;
  float* out = static_cast<float*>(p.out);
  std::fill(out, out + p.split * slab, 0.f);
  std::vector<float> dy(static_cast<size_t>(p.k));
  for (int64_t row = 0; row < rows; ++row) {
    float* dw = out + std::min(row / chunk, p.split - 1) * slab;
    const int64_t n = row / (p.p * p.q), op = row / p.q % p.p, oq = row % p.q;
    for (int64_t k = 0; k < p.k; ++k) dy[k] = LoadAsFloat(p.b, row * p.k + k, p.in_type);
    for (int64_t r = 0; r < p.r; ++r) {
      const int64_t ih = InputRow(op, r, p.stride_h, p.pad_h, p.dil_h, p.h);
      if (ih < 0) continue;
      for (int64_t s = 0; s < p.s; ++s) {
        const int64_t iw = InputRow(oq, s, p.stride_w, p.pad_w, p.dil_w, p.w);
        if (iw < 0) continue;
        const int64_t x_off = ((n * p.h + ih) * p.w + iw) * p.c;
        for (int64_t g = 0; g < p.groups; ++g) {
          for (int64_t c = 0; c < cg; ++c) {
            const float xv = LoadAsFloat(p.a, x_off + g * cg + c, p.in_type);
            float* dw_row = dw + ((r * p.s + s) * cg + c) * p.k + g * kg;
            const float* d = dy.data() + g * kg;
            for (int64_t k = 0; k < kg; ++k) dw_row[k] += xv * d[k];
          }
        }
      }
    }
  }
}

}  // namespace

void CpuConv(const ConvProblem& p) {
  switch (p.kind) {
    case ConvKind::kFprop: Fprop(p); break;
    case ConvKind::kDgrad: Dgrad(p); break;
    case ConvKind::kWgrad: Wgrad(p); break;
  }
}

}  // namespace jaxgemm
