// Launcher of the CUDA bias/activation backward (see bias_act_grad.h).
#pragma once
#include <cuda_runtime.h>

#include "elementwise/bias_act_grad.h"

namespace jaxgemm {

cudaError_t LaunchBiasActGrad(const BiasActGradProblem& p, cudaStream_t stream);

}  // namespace jaxgemm
