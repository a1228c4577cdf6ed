// The grouped (ragged) GEMM's problem: plain C++, so that CPU-only builds export its modes
// and limits to Python (the nanobind module) too.
#pragma once
#include <cstdint>

#include "common/element_type.h"

namespace jaxgemm {

// What is grouped:
//   kRows:            out[rows of g] = lhs[rows of g] @ rhs[g]      rhs (g, k, n); out (m, n)
//   kRowsRhsT:        out[rows of g] = lhs[rows of g] @ rhs[g]^T    rhs (g, n, k); out (m, n)
//   kContraction:     out[g] = lhs[rows of g]^T @ rhs[rows of g]    lhs (m, k), rhs (m, n); out (g, k, n)
// Group g's rows follow group g - 1's; rows past sum(group_sizes) belong to no group (their
// outputs are zero in the row modes). Negative sizes count as 0, rows past m are cut off.
enum class GroupedMode : int { kRows = 0, kRowsRhsT = 1, kContraction = 2 };

struct GroupedProblem {
  GroupedMode mode;
  const void* lhs;
  const void* rhs;
  const int32_t* group_sizes;  // device memory, `groups` of them
  void* out;
  ElementType in_type, out_type;
  int64_t m, k, n, groups;
};

// The most groups one launch takes (the kernel keeps their row and item offsets in shared
// memory).
inline constexpr int64_t kMaxGroupedGroups = 1024;

}  // namespace jaxgemm
