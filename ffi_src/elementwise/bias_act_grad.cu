// CUDA version of BiasActGradCpu. Each block covers a range of columns for one row chunk
// and batch index; its row lanes walk the chunk's rows, and each column's partial sum is
// reduced across the lanes in a fixed order (deterministic).
// - vector kernel (columns a multiple of 16 bytes' worth of elements, aligned buffers):
//   kColThreads x kVec columns per row (32 threads, or 16 / 8 where the row is narrower:
//   a 128-column bf16 row left half of 32 column threads idle), 256 / kColThreads row
//   lanes; 16-byte loads and stores.
// - scalar kernel otherwise: 64 columns x 4 row lanes.
// 16-bit types use the hardware tanh / exp approximations in act' (relative error ~5e-4,
// below the output's rounding); float32 gets the exact functions. One kernel instance per
// activation (common/with_activation.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "common/device_numeric.cuh"
#include "common/with_activation.h"
#include "elementwise/bias_act_grad.cuh"
#include "gemm/epilogue.cuh"

namespace jaxgemm {
namespace {

template <bool kApprox, Activation kAct>
__device__ __forceinline__ float Grad(float z) {
  if constexpr (kApprox) {
    return ActivationGradWith(kAct, z, [](float x) { return TanhApprox(x); }, [](float x) { return SigmoidApprox(x); });
  } else {
    return ActivationGrad(kAct, z);
  }
}

// Rows [begin, end) of chunk blockIdx.y and batch blockIdx.z.
struct ChunkRows {
  int64_t begin, end;
  __device__ __forceinline__ static ChunkRows Of(const BiasActGradProblem& p) {
    const int64_t per_chunk = p.RowsPerChunk();
    const int64_t begin = blockIdx.y * per_chunk;
    return {begin, begin + per_chunk < p.rows ? begin + per_chunk : p.rows};
  }
};

constexpr int kScalarCols = 64, kScalarLanes = 4;

template <class T, Activation kAct>
__global__ void __launch_bounds__(kScalarCols* kScalarLanes) BiasActGradKernel(const BiasActGradProblem p) {
  constexpr bool kApprox = !std::is_same_v<T, float>;
  __shared__ float partial[kScalarLanes][kScalarCols];
  const int lane_col = threadIdx.x % kScalarCols, lane_row = threadIdx.x / kScalarCols;
  const int64_t col = int64_t(blockIdx.x) * kScalarCols + lane_col;
  const int64_t chunk = blockIdx.y, b = blockIdx.z;
  const ChunkRows rows = ChunkRows::Of(p);
  float sum = 0.f;
  if (col < p.cols) {
    const T* dy = static_cast<const T*>(p.dy);
    const T* z = static_cast<const T*>(p.z);
    const T* extra = static_cast<const T*>(p.extra);
    T* dz = static_cast<T*>(p.dz);
    for (int64_t r = rows.begin + lane_row; r < rows.end; r += kScalarLanes) {
      const int64_t i = (b * p.rows + r) * p.cols + col;
      float v = ToFloat(dy[i]) * Grad<kApprox, kAct>(ToFloat(z[i]));
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
    for (int l = 0; l < kScalarLanes; ++l) total += partial[l][lane_col];
    p.dbias_partials[(b * p.chunks + chunk) * p.cols + col] = total;
  }
}

constexpr int kVecBlock = 256;  // threads of a vector kernel's block

template <class T, Activation kAct, int kVecThreads>
__global__ void __launch_bounds__(kVecBlock) BiasActGradVecKernel(const BiasActGradProblem p) {
  constexpr bool kApprox = !std::is_same_v<T, float>;
  constexpr int kVec = 16 / sizeof(T), kVecLanes = kVecBlock / kVecThreads;
  using V = Vec<T, kVec>;
  __shared__ float partial[kVecLanes][kVecThreads * kVec];
  const int lane_col = threadIdx.x % kVecThreads, lane_row = threadIdx.x / kVecThreads;
  const int64_t col = (int64_t(blockIdx.x) * kVecThreads + lane_col) * kVec;
  const int64_t chunk = blockIdx.y, b = blockIdx.z;
  const ChunkRows rows = ChunkRows::Of(p);
  float sum[kVec] = {};
  if (col < p.cols) {  // cols % kVec == 0: the whole vector is in range
#pragma unroll 2
    for (int64_t r = rows.begin + lane_row; r < rows.end; r += kVecLanes) {
      const int64_t i = (b * p.rows + r) * p.cols + col;
      const V dy = *reinterpret_cast<const V*>(static_cast<const T*>(p.dy) + i);
      const V z = *reinterpret_cast<const V*>(static_cast<const T*>(p.z) + i);
      V extra;
      if (p.extra) extra = *reinterpret_cast<const V*>(static_cast<const T*>(p.extra) + i);
      V dz;
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        float v = ToFloat(dy.v[j]) * Grad<kApprox, kAct>(ToFloat(z.v[j]));
        if (p.extra) v += ToFloat(extra.v[j]);
        dz.v[j] = FromFloat<T>(v);
        sum[j] += v;
      }
      *reinterpret_cast<V*>(static_cast<T*>(p.dz) + i) = dz;
    }
  }
#pragma unroll
  for (int j = 0; j < kVec; ++j) partial[lane_row][lane_col * kVec + j] = sum[j];
  __syncthreads();
  // Thread t of the first kVecThreads * kVec sums column t of the block over the lanes.
  const int t = threadIdx.x;
  const int64_t out_col = int64_t(blockIdx.x) * kVecThreads * kVec + t;
  if (t < kVecThreads * kVec && out_col < p.cols) {
    float total = 0.f;
#pragma unroll
    for (int l = 0; l < kVecLanes; ++l) total += partial[l][t];
    p.dbias_partials[(b * p.chunks + chunk) * p.cols + out_col] = total;
  }
}

template <class T, Activation kAct, int kVecThreads>
void LaunchVec(const BiasActGradProblem& p, cudaStream_t stream) {
  constexpr int kBlockCols = kVecThreads * (16 / sizeof(T));
  static_assert(kBlockCols <= kVecBlock, "one summing thread per column of the block");
  const dim3 grid(static_cast<unsigned>((p.cols + kBlockCols - 1) / kBlockCols), static_cast<unsigned>(p.chunks),
                  static_cast<unsigned>(p.batch));
  BiasActGradVecKernel<T, kAct, kVecThreads><<<grid, kVecBlock, 0, stream>>>(p);
}

template <class T, Activation kAct>
cudaError_t Launch(const BiasActGradProblem& p, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const bool vector_ok = p.cols % kVec == 0 && IsAligned(p.dy, 16) && IsAligned(p.z, 16) && IsAligned(p.dz, 16) &&
                         (p.extra == nullptr || IsAligned(p.extra, 16));
  const unsigned chunks = static_cast<unsigned>(p.chunks), batch = static_cast<unsigned>(p.batch);
  if (vector_ok) {
    // As few column threads as cover the row's vectors (8 at least), the rest as row lanes.
    const int64_t vectors = p.cols / kVec;
    if (vectors <= 8) {
      LaunchVec<T, kAct, 8>(p, stream);
    } else if (vectors <= 16) {
      LaunchVec<T, kAct, 16>(p, stream);
    } else {
      LaunchVec<T, kAct, 32>(p, stream);
    }
  } else {
    const dim3 grid(static_cast<unsigned>((p.cols + kScalarCols - 1) / kScalarCols), chunks, batch);
    BiasActGradKernel<T, kAct><<<grid, kScalarCols * kScalarLanes, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchBiasActGrad(const BiasActGradProblem& p, cudaStream_t stream) {
  if (p.batch == 0 || p.cols == 0) return cudaSuccess;
  if (p.batch > 65535 || p.chunks > 65535) return cudaErrorInvalidConfiguration;
  return WithActivation(p.activation, [&](auto act) {
    constexpr Activation kAct = decltype(act)::value;
    switch (p.type) {
      case ElementType::kF32: return Launch<float, kAct>(p, stream);
      case ElementType::kF16: return Launch<__half, kAct>(p, stream);
      case ElementType::kBF16: return Launch<__nv_bfloat16, kAct>(p, stream);
      case ElementType::kF8E4M3:
      case ElementType::kF8E5M2: break;  // (GEMM inputs only)
    }
    return cudaErrorInvalidValue;
  });
}

}  // namespace jaxgemm
