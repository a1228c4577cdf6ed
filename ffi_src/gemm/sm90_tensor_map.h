// Host side of TMA: encodes the tensor maps (copy descriptors) the sm90 kernel loads its
// operand tiles with. The driver's encoder is looked up once through the runtime, so the
// library needs no link-time dependency on libcuda.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/element_type.h"

namespace jaxgemm {

// A row-major matrix of 16-bit elements, possibly one per batch index.
struct TmaMatrix {
  const void* base;
  ElementType type;
  int64_t cols, rows, ld;   // elements; ld is the row pitch
  int64_t batch = 1;        // > 1: a third dim with `batch_stride` elements between matrices
  int64_t batch_stride = 0;
};

// A map whose box is box_cols x box_rows (x 1 batch), 128-byte swizzled in shared memory
// (box_cols * 2 bytes must be <= 128), zeros outside the matrix. Returns
// cudaErrorInvalidValue when the driver rejects the geometry.
cudaError_t EncodeTmaMap(CUtensorMap* map, const TmaMatrix& m, int box_cols, int box_rows);

}  // namespace jaxgemm
