#include "gemm/cpu_grouped.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/element_type.h"
#include "gemm/cpu_epilogue.h"
#include "gemm/sm90/grouped_items.h"

namespace jaxgemm {
namespace {

// ends[g]: the end of group g's rows; ends[groups] = m, the end of the rows of no group.
std::vector<int64_t> RowEnds(const GroupedProblem& p) {
  std::vector<int64_t> ends(static_cast<size_t>(p.groups + 1));
  GroupedRowEnds(p.group_sizes, p.groups, p.m, ends.data());
  return ends;
}

// The weight gradient: out[g] (k, n) = lhs[rows of g]^T (k x rows) @ rhs[rows of g] (rows x n).
void Contraction(const GroupedProblem& p, const std::vector<int64_t>& ends) {
  std::vector<float> acc(static_cast<size_t>(p.k * p.n));
  for (int64_t g = 0; g < p.groups; ++g) {
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int64_t r = g == 0 ? 0 : ends[g - 1]; r < ends[g]; ++r) {
      for (int64_t kk = 0; kk < p.k; ++kk) {
        const float a = LoadAsFloat(p.lhs, r * p.k + kk, p.in_type);
        for (int64_t c = 0; c < p.n; ++c) acc[kk * p.n + c] += a * LoadAsFloat(p.rhs, r * p.n + c, p.in_type);
      }
    }
    for (int64_t i = 0; i < p.k * p.n; ++i) StoreFromFloat(p.out, g * p.k * p.n + i, acc[i], p.out_type);
  }
}

// rhs[g] (or rhs_up[g]) as (k, n) floats into w.
void UnpackWeights(const GroupedProblem& p, const void* rhs, int64_t g, std::vector<float>& w) {
  const bool rhs_t = p.mode == GroupedMode::kRowsRhsT;  // rhs (g, n, k)
  for (int64_t kk = 0; kk < p.k; ++kk) {
    for (int64_t c = 0; c < p.n; ++c) {
      w[kk * p.n + c] = LoadAsFloat(rhs, g * p.k * p.n + (rhs_t ? c * p.k + kk : kk * p.n + c), p.in_type);
    }
  }
}

// acc = lhs row r @ w (zeros for a row of no group).
void RowProduct(const GroupedProblem& p, int64_t r, bool in_group, const std::vector<float>& w,
                std::vector<float>& acc) {
  std::fill(acc.begin(), acc.end(), 0.f);
  for (int64_t kk = 0; in_group && kk < p.k; ++kk) {
    const float a = LoadAsFloat(p.lhs, r * p.k + kk, p.in_type);
    for (int64_t c = 0; c < p.n; ++c) acc[c] += a * w[kk * p.n + c];
  }
}

// Group g's bias row where the epilogue runs. The kernel adds a bias of 0 where none is
// given, which turns a -0 product into +0: `zeros` stands in for it. Rows of no group
// (g == groups) add none.
const float* GroupBias(const GroupedProblem& p, const float* bias, int64_t g,
                       const std::vector<float>& zeros) {
  if (g == p.groups) return nullptr;
  return bias != nullptr ? bias + g * p.n : zeros.data();
}

// Row `row` of group g as the epilogue sees it. Without epilogue operands: the product,
// unrounded. Otherwise z = round(product) + bias, aux = z, out = act(z) + residual, or,
// gated (`up`: the up projection's product, bias and aux), out = act(z) * z_up with no
// residual. A row of no group has RowProduct's zero product, no bias and no activation,
// so z = 0 and out = residual (0 gated), as the kernel writes it.
EpilogueRow RowOperands(const GroupedProblem& p, int64_t g, int64_t row, const float* acc,
                        const std::vector<float>& zeros, const EpilogueProduct* up) {
  const ElementType t = p.out_type;
  EpilogueRow r;
  r.n = p.n;
  r.type = t;
  r.z.acc = acc;
  r.out = ElementAt(p.out, row * p.n, t);
  if (up == nullptr && !p.HasEpilogue()) return r;
  r.bias_type = ElementType::kF32;
  r.round_product = true;
  r.z.bias = GroupBias(p, p.bias, g, zeros);
  r.z.aux = ElementAt(p.aux, row * p.n, t);
  r.up = up;
  r.activation = g < p.groups ? p.activation : Activation::kNone;
  if (up == nullptr) r.operand[kEpilogueResidual] = ElementAt(p.residual, row * p.n, t);
  return r;
}

}  // namespace

void CpuGroupedGemm(const GroupedProblem& p) {
  const std::vector<int64_t> ends = RowEnds(p);
  if (p.mode == GroupedMode::kContraction) return Contraction(p, ends);
  const bool gated = p.mode == GroupedMode::kRowsGated;
  std::vector<float> w(static_cast<size_t>(p.k * p.n)), acc(static_cast<size_t>(p.n));
  std::vector<float> w_up(gated ? w.size() : 0), acc_up(gated ? acc.size() : 0);
  const std::vector<float> zeros(acc.size(), 0.f);
  for (int64_t g = 0; g <= p.groups; ++g) {
    if (g < p.groups) {
      UnpackWeights(p, p.rhs, g, w);
      if (gated) UnpackWeights(p, p.rhs_up, g, w_up);
    }
    for (int64_t r = g == 0 ? 0 : ends[g - 1]; r < ends[g]; ++r) {
      RowProduct(p, r, g < p.groups, w, acc);
      EpilogueProduct up;
      if (gated) {
        RowProduct(p, r, g < p.groups, w_up, acc_up);
        up = {acc_up.data(), GroupBias(p, p.bias_up, g, zeros), ElementAt(p.aux_up, r * p.n, p.out_type)};
      }
      ApplyEpilogue(RowOperands(p, g, r, acc.data(), zeros, gated ? &up : nullptr));
    }
  }
}

}  // namespace jaxgemm
