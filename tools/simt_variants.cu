// Times SIMT GEMM policy variants against each other on one problem, outside JAX, so that
// a policy change can be measured before it is wired into the library:
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Iffi_src tools/simt_variants.cu -o /tmp/simt_variants
//   /tmp/simt_variants 4096 4096 4096
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "gemm/simt_kernel.cuh"
#include "gemm/simt_policy.h"

using namespace jaxgemm;

#define CHECK(x)                                                             \
  do {                                                                       \
    cudaError_t e = (x);                                                     \
    if (e != cudaSuccess) {                                                  \
      std::printf("%s: %s\n", #x, cudaGetErrorString(e));                    \
      std::exit(1);                                                          \
    }                                                                        \
  } while (0)

__global__ void FillNormalish(float* x, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
    x[i] = (float(h & 0xffffff) / float(0x1000000) - 0.5f) * 3.4f;  // mean 0, var ~1
  }
}

template <class Policy>
float TimeMs(const GemmProblem& p, int iters) {
  for (int i = 0; i < 3; ++i) CHECK((LaunchSimtGemm<Policy, float, float>(p, nullptr)));
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int i = 0; i < iters; ++i) {
    CHECK(cudaEventRecord(a));
    CHECK((LaunchSimtGemm<Policy, float, float>(p, nullptr)));
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float t;
    CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

template <class Policy>
void Run(const char* name, GemmProblem p, const std::vector<float>& ref) {
  const size_t n = size_t(p.m * p.n);
  CHECK(cudaMemset(p.d, 0xff, n * 4));
  const float ms = TimeMs<Policy>(p, 20);
  std::vector<float> out(n);
  CHECK(cudaMemcpy(out.data(), p.d, n * 4, cudaMemcpyDeviceToHost));
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num += (double(out[i]) - ref[i]) * (double(out[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  std::printf("%-28s %8.3f ms %7.1f TFLOP/s  rel diff vs baseline %.1e\n", name, ms,
              2.0 * p.m * p.n * p.k / ms / 1e9, std::sqrt(num / den));
}

int main(int argc, char** argv) {
  GemmProblem p;
  p.m = argc > 1 ? std::atoll(argv[1]) : 4096;
  p.n = argc > 2 ? std::atoll(argv[2]) : 4096;
  p.k = argc > 3 ? std::atoll(argv[3]) : 4096;
  float *a, *b, *d;
  CHECK(cudaMalloc(&a, p.m * p.k * 4));
  CHECK(cudaMalloc(&b, p.k * p.n * 4));
  CHECK(cudaMalloc(&d, p.m * p.n * 4));
  FillNormalish<<<1024, 256>>>(a, p.m * p.k, 1);
  FillNormalish<<<1024, 256>>>(b, p.k * p.n, 2);
  p.a = a;
  p.b = b;
  p.d = d;
  p.ldd = p.n;
  // Every layout of the same buffers; the reference is the register-prefetch 128x128 policy.
  for (int layout = 0; layout < 4; ++layout) {
    p.trans_a = layout & 2;
    p.trans_b = layout & 1;
    p.lda = p.trans_a ? p.m : p.k;
    p.ldb = p.trans_b ? p.k : p.n;
    CHECK((LaunchSimtGemm<SimtPolicy<128, 128>, float, float>(p, nullptr)));
    std::vector<float> ref(size_t(p.m * p.n));
    CHECK(cudaMemcpy(ref.data(), d, ref.size() * 4, cudaMemcpyDeviceToHost));
    std::printf("== M=%lld N=%lld K=%lld, %s\n", (long long)p.m, (long long)p.n, (long long)p.k,
                layout == 0 ? "NN" : layout == 1 ? "NT" : layout == 2 ? "TN" : "TT");
    Run<SimtPolicy<128, 128>>("128x128x8 registers", p, ref);
    Run<SimtPolicy<128, 128, 16, 0, 3>>("128x128x16 3 stages", p, ref);
    Run<SimtPolicy<128, 128, 16, 0, 4>>("128x128x16 4 stages", p, ref);
    Run<SimtPolicy<128, 128, 32, 0, 2>>("128x128x32 2 stages", p, ref);
    Run<SimtPolicy<128, 128, 32, 0, 3>>("128x128x32 3 stages", p, ref);
  }
  return 0;
}
