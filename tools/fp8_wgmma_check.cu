// Is the fp8 wgmma (m64nNk32, tools/gen_wgmma.py) used as the fp8 kernels will use it?
// One warpgroup multiplies a 64 x 256 A by a 128 x 256 B^T (both K-major, e4m3 x e4m3 and
// e5m2 x e4m3) from shared memory in the kernels' layout (128-byte rows, one 128-deep k-tile
// each, 128 B swizzle, the descriptor advanced 32 bytes per k32), and reads the fragment
// out as the epilogues do. Two ways, each against a float64 reference on the host:
//   fast:     every wgmma into one accumulator (no scales);
//   promoted: each k-tile's four wgmmas into a temporary accumulator, then
//             acc += part * scale_a[row, k-tile] * scale_b[k-tile] (block scaling's
//             1 x 128 and 128 x 128 scales; B's one block per k-tile here).
// Prints each relative Frobenius error (the tensor cores' fp8 accumulation, measured) and
// exits 1 past a bound that only a wrong layout would cross.
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Iffi_src tools/fp8_wgmma_check.cu -o /tmp/fp8_check
//   /tmp/fp8_check
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "common/ptx_sm90.cuh"
#include "cuda_check.h"
#include "gemm/sm90/wgmma.cuh"

using namespace jaxgemm;

constexpr int kM = 64, kN = 128, kTiles = 2, kTileK = 128, kK = kTiles * kTileK;
constexpr int kRowBytes = 128;
constexpr int kTileBytes = (kM + kN) * kRowBytes;  // one k-tile: A's 64 rows, then B's 128

// The byte of row r, column c (< 128) of a k-tile in the 128 B swizzle: 16-byte chunks
// permuted within each 8-row, 1 KB atom (the tile starts 1 KB aligned).
int SwizzledOffset(int r, int c) { return r * kRowBytes + (((c / 16) ^ (r % 8)) * 16) + c % 16; }

double DecodeE4m3(uint8_t v) {
  const int sign = v >> 7, exponent = (v >> 3) & 15, mantissa = v & 7;
  const double magnitude = exponent == 0 ? std::ldexp(mantissa / 8.0, -6) : std::ldexp(1 + mantissa / 8.0, exponent - 7);
  return sign ? -magnitude : magnitude;
}

double DecodeE5m2(uint8_t v) {
  const int sign = v >> 7, exponent = (v >> 2) & 31, mantissa = v & 3;
  const double magnitude = exponent == 0 ? std::ldexp(mantissa / 4.0, -14) : std::ldexp(1 + mantissa / 4.0, exponent - 15);
  return sign ? -magnitude : magnitude;
}

// A random finite value of magnitude about 2^-3 to 2^3 (in both formats' encodings).
uint8_t RandomFp8(uint32_t& x, bool e5m2) {
  x = x * 1664525u + 1013904223u;
  const uint32_t sign = (x >> 31) << 7;
  if (e5m2) return uint8_t(sign | ((12 + (x >> 16) % 7) << 2) | ((x >> 8) & 3));
  return uint8_t(sign | ((4 + (x >> 16) % 7) << 3) | ((x >> 8) & 7));
}

template <bool kE5m2A>
__device__ __forceinline__ void Mma(float (&d)[kN / 2], uint64_t a, uint64_t b, int scale_d) {
  if constexpr (kE5m2A) {
    WgmmaM64N128K32E5m2E4m3(d, a, b, scale_d);
  } else {
    WgmmaM64N128K32E4m3E4m3(d, a, b, scale_d);
  }
}

// out: the fast product, then the promoted one, each kM x kN row-major.
template <bool kE5m2A>
__global__ void __launch_bounds__(128, 1)
    Fp8Check(const unsigned char* tiles, const float* scale_a, const float* scale_b, float* out) {
#if defined(JG_SM90_ENABLED)
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem =
      reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  for (int i = threadIdx.x; i < kTiles * kTileBytes / 16; i += blockDim.x) {
    reinterpret_cast<uint4*>(smem)[i] = reinterpret_cast<const uint4*>(tiles)[i];
  }
  FenceProxyAsyncShared();
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = warp * 16 + lane / 4;  // and row + 8
  float fast[kN / 2], part[kN / 2], acc[kN / 2];
  for (int j = 0; j < kN / 2; ++j) acc[j] = 0.f;
  for (int t = 0; t < kTiles; ++t) {
    const uint32_t a = SharedAddress(smem + t * kTileBytes), b = a + kM * kRowBytes;
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint64_t desc_a = SmemDescriptorSw128(a + kk * 32, 16, 1024);
      const uint64_t desc_b = SmemDescriptorSw128(b + kk * 32, 16, 1024);
      Mma<kE5m2A>(fast, desc_a, desc_b, (t | kk) != 0);
      Mma<kE5m2A>(part, desc_a, desc_b, kk != 0);
    }
    WgmmaCommitGroup();
    WgmmaWaitGroup<0>();
    const float s0 = scale_a[row * kTiles + t] * scale_b[t], s1 = scale_a[(row + 8) * kTiles + t] * scale_b[t];
    for (int j = 0; j < kN / 2; ++j) acc[j] = fmaf(part[j], (j & 2) ? s1 : s0, acc[j]);
  }
  // Register j holds row (row or row + 8 by bit 1) and column 8 (j / 4) + 2 (lane % 4) + j % 2.
  for (int j = 0; j < kN / 2; ++j) {
    const int r = row + ((j & 2) ? 8 : 0), c = 8 * (j / 4) + 2 * (lane % 4) + (j & 1);
    out[r * kN + c] = fast[j];
    out[kM * kN + r * kN + c] = acc[j];
  }
#endif
}

// Runs one operand pairing; returns whether both errors are within `bound`.
template <bool kE5m2A>
bool Check(const char* name, double bound) {
  uint32_t x = kE5m2A ? 777u : 12345u;
  std::vector<uint8_t> a(kM * kK), b(kN * kK);  // row-major M x K and N x K: both K-major
  for (auto& v : a) v = RandomFp8(x, kE5m2A);
  for (auto& v : b) v = RandomFp8(x, false);
  std::vector<float> scale_a(kM * kTiles), scale_b(kTiles);
  for (auto& s : scale_a) x = x * 1664525u + 1013904223u, s = std::ldexp(1.0f + (x >> 20) / 4096.f, int(x % 5) - 2);
  for (auto& s : scale_b) x = x * 1664525u + 1013904223u, s = std::ldexp(1.0f + (x >> 20) / 4096.f, int(x % 3) - 1);
  std::vector<unsigned char> tiles(kTiles * kTileBytes);
  for (int t = 0; t < kTiles; ++t) {
    for (int c = 0; c < kTileK; ++c) {
      for (int r = 0; r < kM; ++r) tiles[t * kTileBytes + SwizzledOffset(r, c)] = a[r * kK + t * kTileK + c];
      for (int n = 0; n < kN; ++n) {
        tiles[t * kTileBytes + kM * kRowBytes + SwizzledOffset(n, c)] = b[n * kK + t * kTileK + c];
      }
    }
  }
  unsigned char* d_tiles;
  float *d_scale_a, *d_scale_b, *d_out;
  CHECK(cudaMalloc(&d_tiles, tiles.size()));
  CHECK(cudaMalloc(&d_scale_a, scale_a.size() * 4));
  CHECK(cudaMalloc(&d_scale_b, scale_b.size() * 4));
  CHECK(cudaMalloc(&d_out, 2 * kM * kN * 4));
  CHECK(cudaMemcpy(d_tiles, tiles.data(), tiles.size(), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_scale_a, scale_a.data(), scale_a.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_scale_b, scale_b.data(), scale_b.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(d_out, 0xff, 2 * kM * kN * 4));  // NaN: an element not written fails
  const int smem_bytes = kTiles * kTileBytes + 1024;
  CHECK(cudaFuncSetAttribute(Fp8Check<kE5m2A>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
  Fp8Check<kE5m2A><<<1, 128, smem_bytes>>>(d_tiles, d_scale_a, d_scale_b, d_out);
  CHECK(cudaGetLastError());
  std::vector<float> out(2 * kM * kN);
  CHECK(cudaMemcpy(out.data(), d_out, out.size() * 4, cudaMemcpyDeviceToHost));
  double err[2] = {0, 0}, norm[2] = {0, 0};
  for (int r = 0; r < kM; ++r) {
    for (int n = 0; n < kN; ++n) {
      double plain = 0, scaled = 0;
      for (int t = 0; t < kTiles; ++t) {
        double sum = 0;
        for (int c = 0; c < kTileK; ++c) {
          const int k = t * kTileK + c;
          sum += (kE5m2A ? DecodeE5m2(a[r * kK + k]) : DecodeE4m3(a[r * kK + k])) * DecodeE4m3(b[n * kK + k]);
        }
        plain += sum;
        scaled += sum * double(scale_a[r * kTiles + t]) * double(scale_b[t]);
      }
      const double want[2] = {plain, scaled};
      for (int i = 0; i < 2; ++i) {
        const double got = out[i * kM * kN + r * kN + n];
        err[i] += (got - want[i]) * (got - want[i]);  // (NaN stays NaN)
        norm[i] += want[i] * want[i];
      }
    }
  }
  bool ok = true;
  for (int i = 0; i < 2; ++i) {
    const double rel = std::sqrt(err[i] / norm[i]);
    ok = ok && rel <= bound;
    std::printf("%-12s %-9s relative error %.3g (bound %.0e)%s\n", name, i ? "promoted" : "fast", rel, bound,
                rel <= bound ? "" : "  FAILED");
  }
  CHECK(cudaFree(d_tiles));
  CHECK(cudaFree(d_scale_a));
  CHECK(cudaFree(d_scale_b));
  CHECK(cudaFree(d_out));
  return ok;
}

int main() {
  // A wrong layout or descriptor gives errors of order 1. The products of fp8 values are
  // exact in fp32; what is left is the tensor cores' sums (DeepSeek-V3: ~14 bits kept in
  // fp8 wgmma's accumulation, ~2 % relative error at K = 4096 without promotion), which
  // the printed errors measure: the bound only separates those from a wrong layout.
  constexpr double kBound = 1e-2;
  const bool ok = Check<false>("e4m3 x e4m3", kBound) & Check<true>("e5m2 x e4m3", kBound);
  return ok ? 0 : 1;
}
