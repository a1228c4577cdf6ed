// The fused backward of a GEMM epilogue's element-wise part: for each batch index,
//   dz = dy * act'(z) (+ extra),   dbias_partial[chunk] = sum of dz over the chunk's rows,
// with rows split into `chunks` equal ranges so the GPU has enough blocks; the caller sums
// the few partials (fixed order, deterministic).
#pragma once
#include <cstdint>

#include "common/activation.h"
#include "common/element_type.h"
#include "common/host_device.h"

namespace jaxgemm {

struct BiasActGradProblem {
  int64_t batch = 1, rows = 0, cols = 0, chunks = 1;
  ElementType type = ElementType::kF32;  // of dy, z, extra and dz
  Activation activation = Activation::kNone;
  const void* dy = nullptr;
  const void* z = nullptr;
  const void* extra = nullptr;  // optional: added to dz (the cotangent of an aux output)
  void* dz = nullptr;
  float* dbias_partials = nullptr;  // (batch, chunks, cols) fp32

  JG_HOST_DEVICE int64_t RowsPerChunk() const { return (rows + chunks - 1) / chunks; }
};

void BiasActGradCpu(const BiasActGradProblem& p);

}  // namespace jaxgemm
