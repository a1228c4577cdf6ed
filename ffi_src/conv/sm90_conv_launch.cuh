// The sm90 conv launchers, included by conv/instances/sm90_*.cu only (each include
// compiles the kernels).
#pragma once
#include "conv/sm90_conv.h"
#include "conv/sm90_conv_loads.cuh"
#include "conv/sm90_conv_wgrad_loads.cuh"

namespace jaxgemm {

// Launches the conv as the persistent sm90 kernel with the 128 x tile_n schedule of
// kSm90Schedules that is built for it (kBuilt: the table's conv_fprop or conv_wgrad);
// `p` is the GEMM the consumers see (fprop: m = N*P*Q, n = K, k = R*S*ceil(C/64)*64, D = y
// with pitch K and the conv's epilogue; wgrad: A read MN-major, fp32 partials).
template <class TIn, class TOut, bool kTransA, bool Sm90ScheduleRow::*kBuilt, class Loads>
cudaError_t LaunchSm90ConvRow(const Loads& loads, const GemmProblem& p, int tile_n, int sm_count, cudaStream_t stream) {
  cudaError_t status = cudaErrorInvalidValue;
  ForEachSm90Schedule([&](auto row) {
    constexpr int kRow = decltype(row)::value;
    if constexpr (kSm90Schedules[kRow].*kBuilt) {
      if (kSm90Schedules[kRow].Is(128, tile_n)) {
        status = LaunchSm90Kernel<Sm90RowPolicy<kRow, sizeof(TIn)>, TIn, TOut, kTransA, false>(loads, p, sm_count,
                                                                                              stream);
      }
    }
  });
  return status;
}

template <class TIn, class TOut>
cudaError_t LaunchSm90ConvFprop(const Sm90ConvFpropLoads& loads, const GemmProblem& p, int tile_n, int sm_count,
                                cudaStream_t stream) {
  return LaunchSm90ConvRow<TIn, TOut, false, &Sm90ScheduleRow::conv_fprop>(loads, p, tile_n, sm_count, stream);
}

template <class TIn>
cudaError_t LaunchSm90ConvWgrad(const Sm90ConvWgradLoads& loads, const GemmProblem& p, int tile_n, int sm_count,
                                cudaStream_t stream) {
  return LaunchSm90ConvRow<TIn, float, true, &Sm90ScheduleRow::conv_wgrad>(loads, p, tile_n, sm_count, stream);
}

}  // namespace jaxgemm
