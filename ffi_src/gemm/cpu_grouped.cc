#include "gemm/cpu_grouped.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/element_type.h"
#include "gemm/sm90/grouped_items.h"

namespace jaxgemm {
namespace {

// ends[g]: the end of group g's rows; ends[groups] = m, the end of the rows of no group.
std::vector<int64_t> RowEnds(const GroupedProblem& p) {
  std::vector<int64_t> ends(static_cast<size_t>(p.groups + 1));
  GroupedRowEnds(p.group_sizes, p.groups, p.m, ends.data());
  return ends;
}

// v rounded to t, as the kernel's epilogue rounds the product before it adds the bias.
float RoundTo(float v, ElementType t) {
  uint32_t word = 0;
  StoreFromFloat(&word, 0, v, t);
  return LoadAsFloat(&word, 0, t);
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

// Row `row` of group g (g == groups: a row of no group, whose product is zero) from its
// product acc: the plain output, or the epilogue's out and aux.
void StoreRow(const GroupedProblem& p, int64_t g, int64_t row, const std::vector<float>& acc) {
  const bool in_group = g < p.groups;
  for (int64_t c = 0; c < p.n; ++c) {
    const int64_t at = row * p.n + c;
    if (!p.HasEpilogue()) {
      StoreFromFloat(p.out, at, in_group ? acc[c] : 0.f, p.out_type);
      continue;
    }
    float z = 0.f, y = 0.f;
    if (in_group) {
      z = RoundTo(acc[c], p.out_type) + (p.bias != nullptr ? p.bias[g * p.n + c] : 0.f);
      y = ApplyActivation(p.activation, z);
    }
    if (p.residual != nullptr) y += LoadAsFloat(p.residual, at, p.out_type);
    if (p.aux != nullptr) StoreFromFloat(p.aux, at, z, p.out_type);
    StoreFromFloat(p.out, at, y, p.out_type);
  }
}

}  // namespace

void CpuGroupedGemm(const GroupedProblem& p) {
  const std::vector<int64_t> ends = RowEnds(p);
  if (p.mode == GroupedMode::kContraction) return Contraction(p, ends);
  const bool rhs_t = p.mode == GroupedMode::kRowsRhsT;  // rhs (g, n, k)
  std::vector<float> w(static_cast<size_t>(p.k * p.n)), acc(static_cast<size_t>(p.n));
  for (int64_t g = 0; g <= p.groups; ++g) {
    if (g < p.groups) {  // rhs[g] as (k, n) floats
      for (int64_t kk = 0; kk < p.k; ++kk) {
        for (int64_t c = 0; c < p.n; ++c) {
          w[kk * p.n + c] = LoadAsFloat(p.rhs, g * p.k * p.n + (rhs_t ? c * p.k + kk : kk * p.n + c), p.in_type);
        }
      }
    }
    for (int64_t r = g == 0 ? 0 : ends[g - 1]; r < ends[g]; ++r) {
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t kk = 0; g < p.groups && kk < p.k; ++kk) {
        const float a = LoadAsFloat(p.lhs, r * p.k + kk, p.in_type);
        for (int64_t c = 0; c < p.n; ++c) acc[c] += a * w[kk * p.n + c];
      }
      StoreRow(p, g, r, acc);
    }
  }
}

}  // namespace jaxgemm
