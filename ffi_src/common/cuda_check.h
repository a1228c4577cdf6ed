// CUDA status -> ffi::Error, so a failing call or launch is reported to JAX, never aborts.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "xla/ffi/api/ffi.h"

namespace jaxgemm {

inline xla::ffi::Error CudaErrorToFfi(cudaError_t status, const char* what) {
  return xla::ffi::Error::Internal(std::string("jaxgemm: ") + what + " failed: " +
                                   cudaGetErrorName(status) + ": " + cudaGetErrorString(status));
}

}  // namespace jaxgemm

#define JG_RETURN_IF_CUDA_ERROR(expr)                                        \
  do {                                                                       \
    cudaError_t jg_status_ = (expr);                                         \
    if (jg_status_ != cudaSuccess) return ::jaxgemm::CudaErrorToFfi(jg_status_, #expr); \
  } while (0)
