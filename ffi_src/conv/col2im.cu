// CUDA col2im: one thread per dx element, consecutive threads on consecutive channels and
// pixels, so a warp reads neighbouring taps of neighbouring cols rows (L1 and L2 hits).
// Memory bound: each cols element is read once, each dx element written once.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "common/device_numeric.cuh"
#include "conv/col2im.cuh"
#include "common/fast_divmod.h"

namespace jaxgemm {
namespace {

struct Col2imGrid {
  FastDivmod c, w, h;  // element index -> (n, h, w, c)
  int32_t total;
};

template <class T>
__global__ void __launch_bounds__(256) Col2imKernel(const Col2imProblem p, const Col2imGrid g) {
  const T* cols = static_cast<const T*>(p.cols);
  T* dx = static_cast<T*>(p.dx);
  auto load = [&](int32_t i) { return ToFloat(cols[i]); };
  // 64-bit stride: the last step may pass 2^31.
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < g.total; e += int64_t(gridDim.x) * blockDim.x) {
    const int32_t i = static_cast<int32_t>(e);
    int32_t pixel, c, row, w, n, h;
    g.c.DivMod(i, &pixel, &c);
    g.w.DivMod(pixel, &row, &w);
    g.h.DivMod(row, &n, &h);
    dx[i] = FromFloat<T>(Col2imSum<int32_t>(p, n, h, w, c, load));
  }
}

}  // namespace

cudaError_t LaunchCol2im(const Col2imProblem& p, cudaStream_t stream) {
  const int64_t total = p.n * p.h * p.w * p.c;
  if (total == 0) return cudaSuccess;
  const Col2imGrid g{FastDivmod(int32_t(p.c)), FastDivmod(int32_t(p.w)), FastDivmod(int32_t(p.h)),
                     static_cast<int32_t>(total)};
  constexpr int kThreads = 256;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((total + kThreads - 1) / kThreads, 1 << 20));
  switch (p.type) {
    case ElementType::kF32: Col2imKernel<float><<<blocks, kThreads, 0, stream>>>(p, g); break;
    case ElementType::kF16: Col2imKernel<__half><<<blocks, kThreads, 0, stream>>>(p, g); break;
    case ElementType::kBF16: Col2imKernel<__nv_bfloat16><<<blocks, kThreads, 0, stream>>>(p, g); break;
    case ElementType::kF8E4M3:
    case ElementType::kF8E5M2: return cudaErrorInvalidValue;  // (GEMM inputs only)
  }
  return cudaGetLastError();
}

}  // namespace jaxgemm
