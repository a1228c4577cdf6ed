// Host-side entry to the sm90 (TMA im2col + wgmma) implicit-GEMM fprop; the loads are in
// conv/sm90_conv_loads.cuh, the kernels instantiated in conv/instances/sm90_*.cu.
#pragma once
#include <cuda_runtime.h>

#include "conv/problem.h"
#include "gemm/problem.h"

namespace jaxgemm {

struct Sm90ConvFpropLoads;

// Whether the sm90 fprop can take the conv: 16-bit fprop with groups = 1; C and K multiples
// of 8 (16-byte TMA rows); 16-byte aligned x and w; 32-bit sizes; strides <= 8 and a
// bounding box and filter offsets within the 4-D im2col map's 8-bit corner range.
bool Sm90ConvSupports(const ConvProblem& p);

// Whether the heuristic prefers it to the sm80 kernel (given Sm90ConvSupports): k-tiles
// hold 64 channels of one tap, so C < 32 would multiply mostly padding.
bool Sm90ConvPreferred(const ConvProblem& p);

// Encodes the tensor maps and launches. *encoded is false (and nothing launched) when the
// driver rejected a map.
cudaError_t RunSm90ConvFprop(const ConvProblem& p, int sm_count, cudaStream_t stream, bool* encoded);

template <class TIn, class TOut>
cudaError_t LaunchSm90ConvFprop(const Sm90ConvFpropLoads& loads, const GemmProblem& p, int tile_n, int sm_count,
                                cudaStream_t stream);

}  // namespace jaxgemm
