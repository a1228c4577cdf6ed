// Reference convolutions on the CPU (fprop, dgrad, wgrad): fp32 accumulation, the GEMM's
// epilogue math; run by CI through the whole JAX/FFI path.
#pragma once
#include "conv/problem.h"

namespace jaxgemm {

void CpuConv(const ConvProblem& p);

}  // namespace jaxgemm
