// Reference block-scaled fp8 GEMM on the CPU (gemm/block_scales.h's contract): each block's
// products summed in fp32, then added times the block's row and column scales; then the
// GEMM's epilogue (bias, activation, aux: gemm/cpu_epilogue.h).
#pragma once
#include "gemm/block_scales.h"
#include "gemm/problem.h"

namespace jaxgemm {

void CpuBlockScaledGemm(const GemmProblem& p, const BlockScales& scales);

}  // namespace jaxgemm
