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

// kRowsGated's row: out = act(z_gate) * z_up, z = round(product) + bias (0 on rows of no group).
void StoreGatedRow(const GroupedProblem& p, int64_t g, int64_t row, const std::vector<float>& gate,
                   const std::vector<float>& up) {
  const bool in_group = g < p.groups;
  for (int64_t c = 0; c < p.n; ++c) {
    const int64_t at = row * p.n + c;
    float zg = 0.f, zu = 0.f, y = 0.f;
    if (in_group) {
      zg = RoundTo(gate[c], p.out_type) + (p.bias != nullptr ? p.bias[g * p.n + c] : 0.f);
      zu = RoundTo(up[c], p.out_type) + (p.bias_up != nullptr ? p.bias_up[g * p.n + c] : 0.f);
      y = ApplyActivation(p.activation, zg) * zu;
    }
    if (p.aux != nullptr) StoreFromFloat(p.aux, at, zg, p.out_type);
    if (p.aux_up != nullptr) StoreFromFloat(p.aux_up, at, zu, p.out_type);
    StoreFromFloat(p.out, at, y, p.out_type);
  }
}

}  // namespace

void CpuGroupedGemm(const GroupedProblem& p) {
  const std::vector<int64_t> ends = RowEnds(p);
  if (p.mode == GroupedMode::kContraction) return Contraction(p, ends);
  const bool gated = p.mode == GroupedMode::kRowsGated;
  std::vector<float> w(static_cast<size_t>(p.k * p.n)), acc(static_cast<size_t>(p.n));
  std::vector<float> w_up(gated ? w.size() : 0), acc_up(gated ? acc.size() : 0);
  for (int64_t g = 0; g <= p.groups; ++g) {
    if (g < p.groups) {
      UnpackWeights(p, p.rhs, g, w);
      if (gated) UnpackWeights(p, p.rhs_up, g, w_up);
    }
    for (int64_t r = g == 0 ? 0 : ends[g - 1]; r < ends[g]; ++r) {
      RowProduct(p, r, g < p.groups, w, acc);
      if (!gated) {
        StoreRow(p, g, r, acc);
        continue;
      }
      RowProduct(p, r, g < p.groups, w_up, acc_up);
      StoreGatedRow(p, g, r, acc, acc_up);
    }
  }
}

}  // namespace jaxgemm
