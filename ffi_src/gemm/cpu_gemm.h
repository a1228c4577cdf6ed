// Reference GEMM on the CPU: blocked loops, fp32 accumulation.
#pragma once
#include "gemm/problem.h"

namespace jaxgemm {

void CpuGemm(const GemmProblem& p);

}  // namespace jaxgemm
