// Host-side entry to the sm90 (TMA im2col + wgmma) implicit-GEMM fprop; the loads are in
// conv/sm90_conv_loads.cuh, the kernels instantiated in conv/instances/sm90_*.cu.
#pragma once
#include <cuda_runtime.h>

#include "conv/problem.h"
#include "gemm/problem.h"

namespace jaxgemm {

struct Sm90ConvFpropLoads;
struct Sm90ConvWgradLoads;

// Whether an sm90 kernel can take the conv: 16-bit operands with groups = 1; C and K
// multiples of 8 (16-byte TMA rows), and of 64 for C of wgrad; 16-byte aligned operands;
// 32-bit sizes; strides <= 8 and a bounding box and filter offsets within the 4-D im2col
// map's 8-bit corner range (for dgrad: of every output phase's forward conv, and every
// phase with pixels has taps).
bool Sm90ConvSupports(const ConvProblem& p);

// Whether the heuristic prefers it to the sm80 kernel (given Sm90ConvSupports): k-tiles
// hold 64 channels of one tap, so fewer than 32 gathered channels (C; K for dgrad) would
// multiply mostly padding; dgrad also wants C >= 64 output columns.
bool Sm90ConvPreferred(const ConvProblem& p);

// Encodes the tensor maps and launches. *encoded is false (and nothing launched) when the
// driver rejected a map.
cudaError_t RunSm90ConvFprop(const ConvProblem& p, int sm_count, cudaStream_t stream, bool* encoded);
// Strided dgrad: one fprop launch per output phase (dy gathered at stride 1, the phase's
// taps reversed, rows stored at the phase's dx pixels through the general epilogue).
cudaError_t RunSm90ConvDgrad(const ConvProblem& p, int sm_count, cudaStream_t stream, bool* encoded);
// The same for wgrad: p.split fp32 partials of dw, chunks of N*P*Q (the GEMM's split-K).
cudaError_t RunSm90ConvWgrad(const ConvProblem& p, int sm_count, cudaStream_t stream, bool* encoded);

template <class TIn, class TOut>
cudaError_t LaunchSm90ConvFprop(const Sm90ConvFpropLoads& loads, const GemmProblem& p, int tile_n, int sm_count,
                                cudaStream_t stream);

// The wgrad GEMM (m = R*S*C rows of dw, n = K, k = N*P*Q split into p.split_k chunks) on
// the pingpong schedule with 128 x tile_n tiles (128, or 64 for K <= 64), fp32 partials.
template <class TIn>
cudaError_t LaunchSm90ConvWgrad(const Sm90ConvWgradLoads& loads, const GemmProblem& p, int tile_n, int sm_count,
                                cudaStream_t stream);

}  // namespace jaxgemm
