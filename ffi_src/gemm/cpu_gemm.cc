#include "gemm/cpu_gemm.h"

#include <algorithm>
#include <vector>

#include "gemm/cpu_epilogue.h"

namespace jaxgemm {
namespace {

constexpr int64_t kRowBlock = 64;

// Packs op(X) rows [r0, r0+rows) x cols [0, cols) into a dense float panel, undoing the
// transpose, so the inner loop is a contiguous axpy whatever the layout.
void PackPanel(const void* x, ElementType t, bool trans, int64_t ld, int64_t r0, int64_t rows,
               int64_t cols, float* panel) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      int64_t idx = trans ? c * ld + (r0 + r) : (r0 + r) * ld + c;
      panel[r * cols + c] = LoadAsFloat(x, idx, t);
    }
  }
}

}  // namespace

void CpuGemm(const GemmProblem& p) {
  const int64_t m = p.m, n = p.n;
  const int64_t in_bytes = ElementBytes(p.in_type), out_bytes = ElementBytes(p.out_type);
  std::vector<float> b_panel, a_panel, acc(static_cast<size_t>(n));
  int64_t packed_b = -1;  // offset of the B chunk in b_panel: a broadcast B is packed once
  for (int64_t z = 0; z < p.batch.count; ++z) {
    const int64_t off_a = p.batch.Offset(z, kOperandA), off_b = p.batch.Offset(z, kOperandB);
    for (int64_t s = 0; s < p.split_k; ++s) {
      const int64_t k = p.split_k > 1 ? p.ChunkK(s) : p.k;
      const int64_t chunk_a = p.split_k > 1 ? p.ChunkOffsetA(s) : 0;
      const int64_t chunk_b = p.split_k > 1 ? p.ChunkOffsetB(s) : 0;
      const char* a = static_cast<const char*>(p.a) + (off_a + chunk_a) * in_bytes;
      const char* b = static_cast<const char*>(p.b) + (off_b + chunk_b) * in_bytes;
      char* d = static_cast<char*>(p.d) + (z * p.split_k + s) * m * n * out_bytes;
      if (off_b + chunk_b != packed_b || p.split_k > 1) {
        b_panel.resize(static_cast<size_t>(k * n));
        PackPanel(b, p.BType(), p.trans_b, p.ldb, 0, k, n, b_panel.data());
        packed_b = off_b + chunk_b;
      }
      a_panel.resize(static_cast<size_t>(std::min(m, kRowBlock) * k));
      for (int64_t r0 = 0; r0 < m; r0 += kRowBlock) {
        const int64_t rows = std::min(kRowBlock, m - r0);
        PackPanel(a, p.in_type, p.trans_a, p.lda, r0, rows, k, a_panel.data());
        for (int64_t r = 0; r < rows; ++r) {
          std::fill(acc.begin(), acc.end(), 0.f);
          const float* a_row = a_panel.data() + r * k;
          for (int64_t kk = 0; kk < k; ++kk) {
            const float av = a_row[kk];
            const float* b_row = b_panel.data() + kk * n;
            for (int64_t c = 0; c < n; ++c) acc[c] += av * b_row[c];
          }
          ApplyEpilogue(GemmEpilogueRow(p, z, r0 + r, acc.data(), d));
        }
      }
    }
  }
}

}  // namespace jaxgemm
