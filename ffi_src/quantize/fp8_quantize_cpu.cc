// The CPU reference of fp8_quantize.h's two passes.
#include <algorithm>
#include <vector>

#include "quantize/e4m3_host.h"
#include "quantize/fp8_quantize.h"

namespace jaxgemm {
namespace {

float Source(const Fp8QuantizeProblem& p, int64_t i) { return SourceValue(p.x, p.at, p.type, p.activation, i); }

}  // namespace

void Fp8AmaxCpu(const Fp8QuantizeProblem& p) {
  std::vector<float> rows(p.rows, 0.f), cols(p.cols, 0.f), sums(p.cols, 0.f);
  for (int64_t r = 0; r < p.rows; ++r) {
    for (int64_t c = 0; c < p.cols; ++c) {
      const float s = Source(p, r * p.cols + c);
      rows[r] = AbsMax(rows[r], s);
      cols[c] = AbsMax(cols[c], s);
      sums[c] += s;
    }
    if (p.col_partials && ((r + 1) % kAmaxRows == 0 || r + 1 == p.rows)) {
      std::copy(sums.begin(), sums.end(), p.col_partials + r / kAmaxRows * p.cols);
      std::fill(sums.begin(), sums.end(), 0.f);
    }
  }
  if (p.row_amax) std::copy(rows.begin(), rows.end(), p.row_amax);
  if (p.col_amax) std::copy(cols.begin(), cols.end(), p.col_amax);
}

void Fp8QuantizeCpu(const Fp8QuantizeProblem& p) {
  auto* q = static_cast<uint8_t*>(p.q);
  auto* qt = static_cast<uint8_t*>(p.qt);
  const Fp8Format& format = p.e5m2 ? kE5m2 : kE4m3;
  float amax = 0.f;
  std::vector<float> sums(p.cols, 0.f);
  for (int64_t r = 0; r < p.rows; ++r) {
    for (int64_t c = 0; c < p.cols; ++c) {
      const float s = Source(p, r * p.cols + c);
      if (q) q[r * p.cols + c] = FloatToFp8Bits(s * (1.f / p.row_scale[r * p.row_scale_stride]), format);
      if (qt) qt[c * p.rows + r] = FloatToFp8Bits(s * (1.f / p.col_scale[c * p.col_scale_stride]), format);
      amax = AbsMax(amax, s);
      sums[c] += s;
    }
    if (p.col_partials && ((r + 1) % kAmaxRows == 0 || r + 1 == p.rows)) {
      std::copy(sums.begin(), sums.end(), p.col_partials + r / kAmaxRows * p.cols);
      std::fill(sums.begin(), sums.end(), 0.f);
    }
  }
  if (p.amax) *p.amax = amax;
}

}  // namespace jaxgemm
