// Times SIMT GEMM policy variants against each other on one problem and layout, outside
// JAX, so that a policy change can be measured before it is wired into the library. The
// variants run in alternating rounds (each round times every variant once, median of 20
// launches); per variant the median over rounds is printed, with its result's relative
// difference from the register-prefetch 128x128 kernel's.
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Iffi_src tools/simt_variants.cu -o /tmp/simt_variants
//   /tmp/simt_variants 4096 4096 4096 [layout NN|NT|TN|TT, default TN] [rounds, default 5]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gemm/simt_kernel.cuh"
#include "gemm/simt_policy.h"
#include "cuda_check.h"

using namespace jaxgemm;

__global__ void FillNormalish(float* x, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
    x[i] = (float(h & 0xffffff) / float(0x1000000) - 0.5f) * 3.4f;  // mean 0, var ~1
  }
}

// One kernel instance (layout and vectorization fixed), launched as LaunchSimtGemm would.
template <class Policy, bool kTransA, bool kTransB>
void Launch(const GemmProblem& p) {
  auto* kernel = SimtGemmKernel<Policy, float, float, kTransA, kTransB, true>;
  constexpr int kSmemBytes = sizeof(SimtSharedStorage<Policy, float, kTransA, kTransB, true>);
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  const int64_t tiles = ((p.m + Policy::kBM - 1) / Policy::kBM) * ((p.n + Policy::kBN - 1) / Policy::kBN);
  kernel<<<dim3(unsigned(tiles), 1), Policy::kThreads, kSmemBytes>>>(p);
  CHECK(cudaGetLastError());
}

using LaunchFn = void (*)(const GemmProblem&);

float TimeMs(LaunchFn launch, const GemmProblem& p, int iters) {
  for (int i = 0; i < 3; ++i) launch(p);
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int i = 0; i < iters; ++i) {
    CHECK(cudaEventRecord(a));
    launch(p);
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float t;
    CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

double RelDiff(const GemmProblem& p, const std::vector<float>& ref) {
  std::vector<float> out(ref.size());
  CHECK(cudaMemcpy(out.data(), p.d, out.size() * 4, cudaMemcpyDeviceToHost));
  double num = 0, den = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    num += (double(out[i]) - ref[i]) * (double(out[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
}

struct Variant {
  const char* name;
  LaunchFn launch[4];  // by layout: NN, NT, TN, TT
};

template <class Policy>
constexpr Variant Make(const char* name) {
  return {name, {Launch<Policy, false, false>, Launch<Policy, false, true>, Launch<Policy, true, false>,
                 Launch<Policy, true, true>}};
}

int main(int argc, char** argv) {
  GemmProblem p;
  p.m = argc > 1 ? std::atoll(argv[1]) : 4096;
  p.n = argc > 2 ? std::atoll(argv[2]) : 4096;
  p.k = argc > 3 ? std::atoll(argv[3]) : 4096;
  const char* names[] = {"NN", "NT", "TN", "TT"};
  int layout = 2;
  for (int l = 0; l < 4 && argc > 4; ++l) {
    if (std::string(argv[4]) == names[l]) layout = l;
  }
  const int rounds = argc > 5 ? std::atoi(argv[5]) : 5;
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
  p.trans_a = layout & 2;
  p.trans_b = layout & 1;
  p.lda = p.trans_a ? p.m : p.k;
  p.ldb = p.trans_b ? p.k : p.n;

  const Variant variants[] = {
      Make<SimtPolicy<128, 128>>("128x128x8 registers"),
      Make<SimtPolicy<128, 128, 16, 0, 3>>("128x128x16 3 st (flagship)"),
      Make<SimtPolicy<128, 128, 16, 2, 3, 16>>("128x128x16 3 st, 128 thr"),
      Make<SimtPolicy<128, 128, 16, 2, 4, 16>>("128x128x16 4 st, 128 thr"),
      Make<SimtPolicy<128, 128, 32, 2, 3, 16>>("128x128x32 3 st, 128 thr"),
      Make<SimtPolicy<128, 128, 32, 2, 2, 16>>("128x128x32 2 st, 128 thr"),
      Make<SimtPolicy<256, 128, 16, 1, 3, 16>>("256x128x16 3 st, 256 thr"),
  };
  constexpr int kVariants = sizeof(variants) / sizeof(variants[0]);
  variants[0].launch[layout](p);
  std::vector<float> ref(size_t(p.m * p.n));
  CHECK(cudaMemcpy(ref.data(), d, ref.size() * 4, cudaMemcpyDeviceToHost));
  std::vector<std::vector<float>> ms(kVariants);
  std::vector<double> diff(kVariants);
  for (int r = 0; r < rounds; ++r) {
    for (int v = 0; v < kVariants; ++v) {
      CHECK(cudaMemset(p.d, 0xff, ref.size() * 4));  // poison: unwritten elements show
      ms[v].push_back(TimeMs(variants[v].launch[layout], p, 20));
      if (r == 0) diff[v] = RelDiff(p, ref);
    }
  }
  std::printf("== M=%lld N=%lld K=%lld %s, %d rounds\n", (long long)p.m, (long long)p.n, (long long)p.k,
              names[layout], rounds);
  for (int v = 0; v < kVariants; ++v) {
    std::sort(ms[v].begin(), ms[v].end());
    const float med = ms[v][ms[v].size() / 2];
    std::printf("%-30s %8.3f ms (%.3f-%.3f) %6.1f TFLOP/s  rel diff %.1e\n", variants[v].name, med, ms[v].front(),
                ms[v].back(), 2.0 * p.m * p.n * p.k / med / 1e9, diff[v]);
  }
  return 0;
}
