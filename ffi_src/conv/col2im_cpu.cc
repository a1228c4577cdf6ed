#include "conv/col2im.h"

namespace jaxgemm {

void Col2imCpu(const Col2imProblem& p) {
  auto load = [&](int64_t i) { return LoadAsFloat(p.cols, i, p.type); };
  int64_t i = 0;
  for (int64_t n = 0; n < p.n; ++n)
    for (int64_t h = 0; h < p.h; ++h)
      for (int64_t w = 0; w < p.w; ++w)
        for (int64_t c = 0; c < p.c; ++c) StoreFromFloat(p.dx, i++, Col2imSum<int64_t>(p, n, h, w, c, load), p.type);
}

}  // namespace jaxgemm
