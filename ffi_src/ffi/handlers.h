// The FFI handler symbols the nanobind module exports.
#pragma once
#include "xla/ffi/api/ffi.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxgemmGemmCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxgemmBiasActGradCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxgemmConvCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxgemmCol2imCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxgemmRaggedDotCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxgemmRaggedEpilogueCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxgemmRaggedGluCpu);
#if defined(JAXGEMM_WITH_CUDA)
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxgemmGemmCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxgemmBiasActGradCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxgemmConvCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxgemmCol2imCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxgemmRaggedDotCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxgemmRaggedEpilogueCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxgemmRaggedGluCuda);
#endif
