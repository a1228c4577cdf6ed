#include "gemm/cpu_block_scaled.h"

#include <vector>

#include "common/element_type.h"
#include "gemm/cpu_epilogue.h"

namespace jaxgemm {

void CpuBlockScaledGemm(const GemmProblem& p, const BlockScales& s) {
  std::vector<float> a_row(p.k), b_rows(p.n * p.k), acc(p.n);
  for (int64_t z = 0; z < p.batch.count; ++z) {
    const float* sa = s.a + z * s.blocks * s.pitch_a;
    const float* sb = s.b + z * s.blocks * s.pitch_b;
    for (int64_t i = 0; i < p.n * p.k; ++i) b_rows[i] = LoadAsFloat(p.b, z * p.n * p.k + i, p.BType());
    for (int64_t row = 0; row < p.m; ++row) {
      for (int64_t i = 0; i < p.k; ++i) a_row[i] = LoadAsFloat(p.a, (z * p.m + row) * p.k + i, p.in_type);
      for (int64_t col = 0; col < p.n; ++col) {
        float sum = 0.f;
        for (int64_t j = 0; j < s.blocks; ++j) {
          float part = 0.f;
          for (int64_t i = j * s.block_k; i < (j + 1) * s.block_k; ++i) part += a_row[i] * b_rows[col * p.k + i];
          sum += part * (sa[j * s.pitch_a + row] * sb[j * s.pitch_b + col / s.b_rows]);
        }
        acc[col] = sum;
      }
      char* d = static_cast<char*>(p.d) + z * p.m * p.n * ElementBytes(p.out_type);
      ApplyEpilogue(GemmEpilogueRow(p, z, row, acc.data(), d));
    }
  }
}

}  // namespace jaxgemm
