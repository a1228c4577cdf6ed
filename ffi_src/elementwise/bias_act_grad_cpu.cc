#include <algorithm>
#include <vector>

#include "elementwise/bias_act_grad.h"

namespace jaxgemm {

void BiasActGradCpu(const BiasActGradProblem& p) {
  std::vector<float> sum(static_cast<size_t>(p.cols));
  const int64_t per_chunk = p.RowsPerChunk();
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t chunk = 0; chunk < p.chunks; ++chunk) {
      std::fill(sum.begin(), sum.end(), 0.f);
      const int64_t end = std::min(p.rows, (chunk + 1) * per_chunk);
      for (int64_t r = chunk * per_chunk; r < end; ++r) {
        for (int64_t c = 0; c < p.cols; ++c) {
          const int64_t i = (b * p.rows + r) * p.cols + c;
          float v = LoadAsFloat(p.dy, i, p.type) * ActivationGrad(p.activation, LoadAsFloat(p.z, i, p.type));
          if (p.extra) v += LoadAsFloat(p.extra, i, p.type);
          StoreFromFloat(p.dz, i, v, p.type);
          sum[c] += v;
        }
      }
      std::copy(sum.begin(), sum.end(), p.dbias_partials + (b * p.chunks + chunk) * p.cols);
    }
  }
}

}  // namespace jaxgemm
