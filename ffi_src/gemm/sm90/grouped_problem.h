// The grouped (ragged) GEMM's problem: plain C++, so that CPU-only builds export its modes
// and limits to Python (the nanobind module) too.
#pragma once
#include <cstdint>

#include "common/activation.h"
#include "common/element_type.h"

namespace jaxgemm {

// What is grouped:
//   kRows:            out[rows of g] = lhs[rows of g] @ rhs[g]      rhs (g, k, n); out (m, n)
//   kRowsRhsT:        out[rows of g] = lhs[rows of g] @ rhs[g]^T    rhs (g, n, k); out (m, n)
//   kContraction:     out[g] = lhs[rows of g]^T @ rhs[rows of g]    lhs (m, k), rhs (m, n); out (g, k, n)
//   kRowsGated:       out[rows of g] = act(lhs[rows of g] @ rhs[g] + bias[g])
//                                      * (lhs[rows of g] @ rhs_up[g] + bias_up[g])
//                     rhs, rhs_up (g, k, n); out (m, n) (a gated linear unit: SwiGLU experts)
// Group g's rows follow group g - 1's; rows past sum(group_sizes) belong to no group (their
// outputs are zero in the row modes). Negative sizes count as 0, rows past m are cut off.
enum class GroupedMode : int { kRows = 0, kRowsRhsT = 1, kContraction = 2, kRowsGated = 3 };

struct GroupedProblem {
  GroupedMode mode;
  const void* lhs;
  const void* rhs;
  const int32_t* group_sizes;  // device memory, `groups` of them
  void* out;
  ElementType in_type, out_type;
  int64_t m, k, n, groups;
  // The row modes' epilogue (16-bit outputs of the inputs' type), per row of group j:
  //   z = round(product) + bias[j],  out = act(z) + residual,  aux = round(z)
  // rows of no group: out = residual, aux = 0. Each is optional (null: none).
  const float* bias = nullptr;     // (groups, n)
  const void* residual = nullptr;  // (m, n), the output's type
  void* aux = nullptr;             // (m, n), the output's type
  Activation activation = Activation::kNone;
  // kRowsGated: the second product's weights, bias and aux (its pre-activation up values,
  // where aux holds the gate's; gate and up rounded as z above). The epilogue is the gated
  // one: out = act(z_gate) * z_up; rows of no group 0; no residual.
  const void* rhs_up = nullptr;   // (groups, k, n), the inputs' type
  const float* bias_up = nullptr;  // (groups, n)
  void* aux_up = nullptr;          // (m, n), the output's type

  bool HasEpilogue() const {
    return bias != nullptr || residual != nullptr || aux != nullptr || activation != Activation::kNone;
  }
};

// The most groups one launch takes (the kernel keeps their row and item offsets in shared
// memory).
inline constexpr int64_t kMaxGroupedGroups = 1024;

}  // namespace jaxgemm
