// Host side of TMA: encodes the tensor maps (copy descriptors) the sm90 kernel loads its
// operand tiles with. The driver's encoder is looked up once through the runtime, so the
// library needs no link-time dependency on libcuda.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/element_type.h"

namespace jaxgemm {

// A row-major matrix (16-bit or float32 elements), possibly one per batch index.
struct TmaMatrix {
  const void* base;
  ElementType type;
  int64_t cols, rows, ld;   // elements; ld is the row pitch
  int64_t batch = 1;        // > 1: a third dim with `batch_stride` elements between matrices
  int64_t batch_stride = 0;
  // float32 operands of tf32 wgmmas: TMA rounds each element to tf32 on the way to shared
  // memory. Otherwise float32 moves unchanged (e.g. a float32 output stored with TMA).
  bool tf32 = false;
};

// A map whose box is box_cols x box_rows (x 1 batch), 128-byte swizzled in shared memory
// (box_cols elements must span <= 128 bytes), zeros outside the matrix. Unswizzled, a box
// row may span up to 256 elements (a multiple of 16 bytes): e.g. a tile's block scales.
// Returns cudaErrorInvalidValue when the driver rejects the geometry.
cudaError_t EncodeTmaMap(CUtensorMap* map, const TmaMatrix& m, int box_cols, int box_rows, bool swizzled = true);

// An NHWC tensor of 16-bit elements read in TMA im2col mode. One load walks `pixels`
// positions, w fastest, then h, then n, stepping by the traversal strides through the
// bounding box [lower, dim - 1 + upper] of each spatial dim (wrapping to its lower corner
// and the next row / image at the upper one), and reads `channels` channels of the pixel
// at each position plus the load's (w, h) offsets: one output pixel's filter tap per row of
// the box. Pixels or channels outside the tensor read as zeros. Corners must lie in
// [-128, 127] (4-D maps), strides in [1, 8], channels * 2 bytes <= 128 (the swizzle span).
struct TmaIm2col {
  const void* base;
  ElementType type;
  int64_t n, h, w, c;
  int lower_h, lower_w, upper_h, upper_w;
  int stride_h, stride_w;
  int channels, pixels;
};

// The im2col map, 128-byte swizzled rows of `channels` elements (one per pixel).
cudaError_t EncodeIm2colTmaMap(CUtensorMap* map, const TmaIm2col& t);

}  // namespace jaxgemm
