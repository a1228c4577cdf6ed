// The FFI handler symbols the nanobind module exports.
#pragma once
#include "xla/ffi/api/ffi.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxgemmGemmCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxgemmBiasActGradCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxgemmConvCpu);
#if defined(JAXGEMM_WITH_CUDA)
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxgemmGemmCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxgemmBiasActGradCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxgemmConvCuda);
#endif
