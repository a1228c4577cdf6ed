// The grouped GEMM's reference on the CPU (GroupedProblem's modes, the gated one included,
// and the row modes' epilogue): float32 accumulation, the semantics the grouped Hopper
// kernel implements.
#pragma once
#include "gemm/sm90/grouped_problem.h"

namespace jaxgemm {

void CpuGroupedGemm(const GroupedProblem& p);

}  // namespace jaxgemm
