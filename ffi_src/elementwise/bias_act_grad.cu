// CUDA version of BiasActGradCpu: one block per (64 columns, row chunk, batch index); each
// column's partial sum is reduced across the block's 4 row lanes in a fixed order.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/device_numeric.cuh"
#include "elementwise/bias_act_grad.cuh"

namespace jaxgemm {
namespace {

constexpr int kCols = 64, kRowLanes = 4;

template <class T>
__global__ void __launch_bounds__(kCols* kRowLanes) BiasActGradKernel(const BiasActGradProblem p) {
  __shared__ float partial[kRowLanes][kCols];
  const int lane_col = threadIdx.x % kCols, lane_row = threadIdx.x / kCols;
  const int64_t col = int64_t(blockIdx.x) * kCols + lane_col;
  const int64_t chunk = blockIdx.y, b = blockIdx.z;
  const int64_t per_chunk = p.RowsPerChunk();
  const int64_t begin = chunk * per_chunk;
  const int64_t end = begin + per_chunk < p.rows ? begin + per_chunk : p.rows;
  float sum = 0.f;
  if (col < p.cols) {
    const T* dy = static_cast<const T*>(p.dy);
    const T* z = static_cast<const T*>(p.z);
    const T* extra = static_cast<const T*>(p.extra);
    T* dz = static_cast<T*>(p.dz);
    for (int64_t r = begin + lane_row; r < end; r += kRowLanes) {
      const int64_t i = (b * p.rows + r) * p.cols + col;
      float v = ToFloat(dy[i]) * ActivationGrad(p.activation, ToFloat(z[i]));
      if (extra) v += ToFloat(extra[i]);
      dz[i] = FromFloat<T>(v);
      sum += v;
    }
  }
  partial[lane_row][lane_col] = sum;
  __syncthreads();
  if (lane_row == 0 && col < p.cols) {
    float total = 0.f;
#pragma unroll
    for (int l = 0; l < kRowLanes; ++l) total += partial[l][lane_col];
    p.dbias_partials[(b * p.chunks + chunk) * p.cols + col] = total;
  }
}

}  // namespace

cudaError_t LaunchBiasActGrad(const BiasActGradProblem& p, cudaStream_t stream) {
  if (p.batch == 0 || p.cols == 0) return cudaSuccess;
  if (p.batch > 65535 || p.chunks > 65535) return cudaErrorInvalidConfiguration;
  const dim3 grid(static_cast<unsigned>((p.cols + kCols - 1) / kCols), static_cast<unsigned>(p.chunks),
                  static_cast<unsigned>(p.batch));
  switch (p.type) {
    case ElementType::kF32: BiasActGradKernel<float><<<grid, kCols * kRowLanes, 0, stream>>>(p); break;
    case ElementType::kF16: BiasActGradKernel<__half><<<grid, kCols * kRowLanes, 0, stream>>>(p); break;
    case ElementType::kBF16: BiasActGradKernel<__nv_bfloat16><<<grid, kCols * kRowLanes, 0, stream>>>(p); break;
  }
  return cudaGetLastError();
}

}  // namespace jaxgemm
