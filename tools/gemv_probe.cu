// Can a CUDA-core GEMV stream B at the L2's rate? (issue 69: decode M <= 8, where the sm90
// few-row schedules take 10.3-10.7 us at 1 x 4096^2 bf16 against XLA's 8.1, and the decode
// kernel's per-warp cp.async rings reached only 18-33 GB/s an SM; ffi_src/gemm/NOTES.md.)
// D (M, N) = A (M, K) @ B (K, N), bf16 in, float32 sums, bf16 out, B stored (k, n) (NN):
//   - a block owns 256 columns and a slice of K; each warp reads 512 contiguous bytes of B a
//     k row (a lane 8 columns: one 16-byte load), its rows k = warp, warp + 8, ... of the
//     slice, kUnroll rows in flight a thread; A's slice sits in shared memory as float32;
//   - the warps' sums meet in shared memory, each block writes its slice's partial sums
//     (float32) and the last block of a column strip (a counter) adds the slices in order
//     and writes D: deterministic, one launch, a workspace of splits x M x N floats.
// Prints each shape's median time a launch (cudaEvents around 40 launches back to back; B
// resident in L2 and, with 8 copies of B rotated, from DRAM), its rate over B's bytes, and the error against a
// float64 reference (exits 1 past 1e-2).
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Itools tools/gemv_probe.cu -o /tmp/gemv_probe
//   /tmp/gemv_probe [splits ...]      (default: 8 16 32 64)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda_check.h"

constexpr int kThreads = 256, kWarps = kThreads / 32, kCols = 256, kUnroll = 4;

struct Problem {
  const __nv_bfloat16* a;  // (m, k)
  const __nv_bfloat16* b;  // (k, n)
  __nv_bfloat16* d;        // (m, n)
  float* partial;          // (splits, m, n)
  unsigned* arrived;       // (n / kCols,), zero between launches
  int m, n, k, splits;
};

template <int M>
__global__ void __launch_bounds__(kThreads) GemvKernel(const Problem p) {
  extern __shared__ float a_slice[];  // [M][slice]
  __shared__ float sums[M][kCols];
  __shared__ bool last;
  const int strip = blockIdx.x, split = blockIdx.y, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int slice = p.k / p.splits, k0 = split * slice, col = strip * kCols + 8 * lane;
  for (int i = threadIdx.x; i < M * slice; i += kThreads) {
    a_slice[i] = __bfloat162float(p.a[(i / slice) * p.k + k0 + i % slice]);
  }
  for (int i = threadIdx.x; i < M * kCols; i += kThreads) sums[i / kCols][i % kCols] = 0.f;
  __syncthreads();
  float acc[M][8] = {};
  for (int r = warp; r < slice; r += kWarps * kUnroll) {
    uint4 words[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {  // the loads first: kUnroll in flight
      const int kr = r + u * kWarps;
      words[u] = kr < slice ? __ldg(reinterpret_cast<const uint4*>(p.b + int64_t(k0 + kr) * p.n + col)) : uint4{};
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int kr = r + u * kWarps;
      if (kr >= slice) break;
      const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&words[u]);
#pragma unroll
      for (int mi = 0; mi < M; ++mi) {
        const float av = a_slice[mi * slice + kr];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float2 bv = __bfloat1622float2(pairs[j]);
          acc[mi][2 * j] = fmaf(av, bv.x, acc[mi][2 * j]);
          acc[mi][2 * j + 1] = fmaf(av, bv.y, acc[mi][2 * j + 1]);
        }
      }
    }
  }
  // The warps' sums, in warp order (deterministic).
  for (int w = 0; w < kWarps; ++w) {
    if (warp == w) {
#pragma unroll
      for (int mi = 0; mi < M; ++mi) {
#pragma unroll
        for (int j = 0; j < 8; ++j) sums[mi][8 * lane + j] += acc[mi][j];
      }
    }
    __syncthreads();
  }
  for (int i = threadIdx.x; i < M * kCols; i += kThreads) {
    p.partial[(int64_t(split) * p.m + i / kCols) * p.n + strip * kCols + i % kCols] = sums[i / kCols][i % kCols];
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&p.arrived[strip], 1u) == unsigned(p.splits - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int i = threadIdx.x; i < M * kCols; i += kThreads) {
    const int64_t at = int64_t(i / kCols) * p.n + strip * kCols + i % kCols;
    float v = 0.f;
    for (int s = 0; s < p.splits; ++s) v += __ldcg(p.partial + s * int64_t(p.m) * p.n + at);
    p.d[at] = __float2bfloat16(v);
  }
  if (threadIdx.x == 0) p.arrived[strip] = 0;
}

template <int M>
void Launch(const Problem& p, cudaStream_t stream) {
  const size_t smem = size_t(M) * (p.k / p.splits) * sizeof(float);
  CHECK(cudaFuncSetAttribute(GemvKernel<M>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  GemvKernel<M><<<dim3(p.n / kCols, p.splits), kThreads, smem, stream>>>(p);
}

void Run(const Problem& p, cudaStream_t stream) {
  switch (p.m) {
    case 1: return Launch<1>(p, stream);
    case 2: return Launch<2>(p, stream);
    case 4: return Launch<4>(p, stream);
    case 8: return Launch<8>(p, stream);
  }
  std::printf("m = %d: 1, 2, 4 or 8\n", p.m);
  std::exit(1);
}

float Median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main(int argc, char** argv) {
  std::vector<int> splits_list;
  for (int i = 1; i < argc; ++i) splits_list.push_back(std::atoi(argv[i]));
  if (splits_list.empty()) splits_list = {8, 16, 32, 64};
  const int n = 4096, k = 4096, copies = 8, rounds = 15, launches = 40;
  const size_t b_elems = size_t(k) * n;
  std::vector<__nv_bfloat16> hb(b_elems), ha(8 * k);
  std::vector<double> fb(b_elems), fa(8 * k);
  uint32_t seed = 1;
  auto uniform = [&] { return (seed = seed * 1664525u + 1013904223u) / 4294967296.0 - 0.5; };
  for (size_t i = 0; i < b_elems; ++i) fb[i] = __bfloat162float(hb[i] = __float2bfloat16(float(uniform())));
  for (int i = 0; i < 8 * k; ++i) fa[i] = __bfloat162float(ha[i] = __float2bfloat16(float(uniform())));
  __nv_bfloat16 *a, *b, *d;
  float* partial;
  unsigned* arrived;
  CHECK(cudaMalloc(&a, ha.size() * 2));
  CHECK(cudaMalloc(&b, copies * b_elems * 2));
  CHECK(cudaMalloc(&d, size_t(8) * n * 2));
  CHECK(cudaMalloc(&partial, size_t(64) * 8 * n * 4));
  CHECK(cudaMalloc(&arrived, n / kCols * sizeof(unsigned)));
  CHECK(cudaMemset(arrived, 0, n / kCols * sizeof(unsigned)));
  CHECK(cudaMemcpy(a, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice));
  for (int c = 0; c < copies; ++c) CHECK(cudaMemcpy(b + c * b_elems, hb.data(), b_elems * 2, cudaMemcpyHostToDevice));
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  int bad = 0;
  std::printf("%4s %6s %10s %10s %10s %10s %9s\n", "m", "splits", "L2 us", "L2 TB/s", "DRAM us", "DRAM TB/s", "error");
  for (int m : {1, 2, 4, 8}) {
    for (int splits : splits_list) {
      if (k % splits || (k / splits) % kWarps) continue;
      Problem p{a, b, d, partial, arrived, m, n, k, splits};
      Run(p, stream);
      CHECK(cudaGetLastError());
      CHECK(cudaStreamSynchronize(stream));
      std::vector<__nv_bfloat16> hd(size_t(m) * n);
      CHECK(cudaMemcpy(hd.data(), d, hd.size() * 2, cudaMemcpyDeviceToHost));
      double num = 0, den = 0;
      for (int i = 0; i < m; ++i) {
        for (int j = 0; j < n; ++j) {
          double ref = 0;
          for (int kk = 0; kk < k; ++kk) ref += fa[size_t(i) * k + kk] * fb[size_t(kk) * n + j];
          const double diff = __bfloat162float(hd[size_t(i) * n + j]) - ref;
          num += diff * diff;
          den += ref * ref;
        }
      }
      const double error = std::sqrt(num / den);
      bad |= error > 1e-2;
      float times[2];  // microseconds a launch, launches back to back (as a benchmark loop's)
      for (int rotate = 0; rotate < 2; ++rotate) {
        std::vector<float> ms;
        for (int r = 0; r < rounds; ++r) {
          CHECK(cudaEventRecord(start, stream));
          for (int l = 0; l < launches; ++l) {
            p.b = b + (rotate ? (l % copies) * b_elems : 0);
            Run(p, stream);
          }
          CHECK(cudaEventRecord(stop, stream));
          CHECK(cudaEventSynchronize(stop));
          float t;
          CHECK(cudaEventElapsedTime(&t, start, stop));
          ms.push_back(t / launches);
        }
        times[rotate] = Median(ms) * 1e3f;
      }
      const double gb = b_elems * 2 / 1e3;  // bytes / 1e3: TB/s from microseconds
      std::printf("%4d %6d %10.2f %10.2f %10.2f %10.2f %9.1e\n", m, splits, times[0], gb / times[0] / 1e3, times[1],
                  gb / times[1] / 1e3, error);
    }
  }
  return bad;
}
