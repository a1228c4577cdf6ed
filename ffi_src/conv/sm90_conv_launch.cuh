// The sm90 conv launchers, included by conv/instances/sm90_*.cu only (each include
// compiles the kernels).
#pragma once
#include "conv/sm90_conv.h"
#include "conv/sm90_conv_loads.cuh"
#include "conv/sm90_conv_wgrad_loads.cuh"

namespace jaxgemm {

// Launches the conv as the persistent sm90 kernel: `p` is the GEMM the consumers see
// (m = N*P*Q, n = K, k = R*S*ceil(C/64)*64, D = y with pitch K and the conv's epilogue).
// tile_n 256: the cooperative 128 x 256 schedule; 128 and 64: the pingpong 128 x 128 and
// 128 x 64 (sm90/schedules.h).
template <class TIn, class TOut>
cudaError_t LaunchSm90ConvFprop(const Sm90ConvFpropLoads& loads, const GemmProblem& p, int tile_n, int sm_count,
                                cudaStream_t stream) {
  constexpr int kBytes = sizeof(TIn);
  if (tile_n == 256) {
    return LaunchSm90Kernel<Sm90TilePolicy<128, 256, kBytes>, TIn, TOut, false, false>(loads, p, sm_count, stream);
  }
  if (tile_n == 128) {
    return LaunchSm90Kernel<Sm90TilePolicy<128, 128, kBytes>, TIn, TOut, false, false>(loads, p, sm_count, stream);
  }
  if (tile_n == 64) {
    return LaunchSm90Kernel<Sm90TilePolicy<128, 64, kBytes>, TIn, TOut, false, false>(loads, p, sm_count, stream);
  }
  return cudaErrorInvalidValue;
}

// tile_n 128 and 64: the pingpong 128 x 128 and 128 x 64 schedules.
template <class TIn>
cudaError_t LaunchSm90ConvWgrad(const Sm90ConvWgradLoads& loads, const GemmProblem& p, int tile_n, int sm_count,
                                cudaStream_t stream) {
  constexpr int kBytes = sizeof(TIn);
  if (tile_n == 128) {
    return LaunchSm90Kernel<Sm90TilePolicy<128, 128, kBytes>, TIn, float, true, false>(loads, p, sm_count, stream);
  }
  if (tile_n == 64) {
    return LaunchSm90Kernel<Sm90TilePolicy<128, 64, kBytes>, TIn, float, true, false>(loads, p, sm_count, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace jaxgemm
