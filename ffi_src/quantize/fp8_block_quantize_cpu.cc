// The CPU reference of fp8_block_quantize.h's pass.
#include <algorithm>
#include <vector>

#include "quantize/e4m3_host.h"
#include "quantize/fp8_block_quantize.h"

namespace jaxgemm {

void Fp8BlockQuantizeCpu(const Fp8BlockQuantizeProblem& p) {
  constexpr int64_t B = kQuantBlock;
  std::vector<float> s(B * B), row_scale(B), col_scale(B);
  auto* q = static_cast<uint8_t*>(p.q);
  auto* qt = static_cast<uint8_t*>(p.qt);
  const Fp8Format& format = p.e5m2 ? kE5m2 : kE4m3;
  for (int64_t tr = 0; tr < p.rows / B; ++tr) {
    for (int64_t tc = 0; tc < p.cols / B; ++tc) {
      std::vector<float> row_amax(B, 0.f), col_amax(B, 0.f), col_sum(B, 0.f);
      float tile_amax = 0.f;
      for (int64_t i = 0; i < B; ++i) {
        for (int64_t j = 0; j < B; ++j) {
          const float v = SourceValue(p.x, p.at, p.type, p.activation, (tr * B + i) * p.cols + tc * B + j);
          s[i * B + j] = v;
          row_amax[i] = AbsMax(row_amax[i], v);
          col_amax[j] = AbsMax(col_amax[j], v);
          tile_amax = AbsMax(tile_amax, v);
          col_sum[j] += v;
        }
      }
      for (int64_t k = 0; k < B; ++k) {
        row_scale[k] = Fp8ScaleOf(p.tiles ? tile_amax : row_amax[k], format);
        col_scale[k] = Fp8ScaleOf(p.tiles ? tile_amax : col_amax[k], format);
        p.q_scale[(tr * B + k) * (p.cols / B) + tc] = row_scale[k];
        p.qt_scale[(tc * B + k) * (p.rows / B) + tr] = col_scale[k];
      }
      for (int64_t i = 0; i < B; ++i) {
        for (int64_t j = 0; j < B; ++j) {
          const int64_t r = tr * B + i, c = tc * B + j;
          q[r * p.cols + c] = FloatToFp8Bits(s[i * B + j] * (1.f / row_scale[i]), format);
          qt[c * p.rows + r] = FloatToFp8Bits(s[i * B + j] * (1.f / col_scale[j]), format);
        }
      }
      if (p.col_partials) std::copy(col_sum.begin(), col_sum.end(), p.col_partials + tr * p.cols + tc * B);
    }
  }
}

}  // namespace jaxgemm
