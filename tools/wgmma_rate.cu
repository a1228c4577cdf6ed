// How fast can the tensor cores run for a given split of a tile among warpgroups and wgmma
// shapes? One block per SM runs a bare k-loop (no epilogue, no schedule): consumers issue
// wgmmas on 128-byte-swizzled K-major stages, one group in flight, as sm90/kernel.cuh does.
// With loads on, a producer thread fills a ring of stages with 1-D bulk copies from an
// L2-resident source (the same bytes per k-tile as the tile's TMA loads, full / empty
// mbarriers); with loads off the consumers reuse two preloaded stages, which gives the
// tensor cores' own rate for that instruction mix. Prints bf16 MACs per SM clock (median
// over blocks, from clock64) and the chip's TFLOP/s (CUDA events), per variant.
// The fp8 variants (e4m3, m64nNk32: a 128-byte row is one 128-deep k-tile) run either
// accumulating everything in the wgmmas ("fast") or promoted as fp8 block scaling needs:
// each k-tile's four wgmmas into a temporary accumulator, then, after waiting for them,
// acc += part * scale_a[row] * scale_b with the scales read from the stage (A's rows'
// floats, loaded with it), as DeepGEMM and CUTLASS's blockwise fp8 mainloops do. Their
// MACs per SM clock peak at 4096 (bf16: 2048).
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Iffi_src tools/wgmma_rate.cu -o /tmp/wgmma_rate
//   /tmp/wgmma_rate [k-tiles per block, default 4000] [rounds, default 3]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "common/ptx_sm90.cuh"
#include "gemm/sm90/wgmma.cuh"
#include "cuda_check.h"

using namespace jaxgemm;

constexpr int kRowBytes = 128;       // one k-tile row: 64 16-bit values or 128 fp8 ones
constexpr int kSourceTiles = 64;     // distinct k-tiles in the source buffer
constexpr int kMaxStageBytes = 64 * 1024;

enum class Math { kBf16, kFp8, kFp8Promoted };

// kWarpgroups consumers, each with kChains accumulator blocks of 64 x kN (one wgmma per
// block and k16, or k32 for fp8): the tile is (kWarpgroups * kChains * 64) x kN. A
// promoted fp8 stage also holds a float scale per row of A.
template <int kWarpgroups, int kChains, int kN, bool kLoads, Math kMath = Math::kBf16>
struct Variant {
  static constexpr bool kPromoted = kMath == Math::kFp8Promoted;
  static constexpr int kTileK = kMath == Math::kBf16 ? 64 : 128;
  static constexpr int kRows = kWarpgroups * kChains * 64;
  static constexpr int kScaleOffset = (kRows + kN) * kRowBytes;
  static constexpr int kStageBytes = kScaleOffset + (kPromoted ? kRows * 4 : 0);
  static constexpr int kStages = kLoads ? std::min(6, (200 * 1024) / kStageBytes) : 2;
  // As sm90/kernel.cuh: with two consumers a producer warpgroup hands its registers over
  // (setmaxnreg: 40 + 2 x 232), which 192 promoted accumulators per thread need.
  static constexpr bool kMovesRegisters = kWarpgroups == 2;
  static constexpr int kThreads = 128 * kWarpgroups + (kMovesRegisters ? 128 : 32);
  static constexpr int kSmemBytes = kStages * kStageBytes + 1024 + 1024;  // + alignment, barriers
  static_assert(kChains * kN / 2 * (kPromoted ? 2 : 1) <= 192, "accumulators per thread");
};

template <int kN, Math kMath>
__device__ __forceinline__ void Mma(float (&d)[kN / 2], uint64_t a, uint64_t b, int scale_d) {
  if constexpr (kMath == Math::kBf16) {
    if constexpr (kN == 256) WgmmaM64N256K16Bf16<0, 0>(d, a, b, scale_d);
    if constexpr (kN == 128) WgmmaM64N128K16Bf16<0, 0>(d, a, b, scale_d);
    if constexpr (kN == 64) WgmmaM64N64K16Bf16<0, 0>(d, a, b, scale_d);
  } else {
    if constexpr (kN == 256) WgmmaM64N256K32E4m3E4m3(d, a, b, scale_d);
    if constexpr (kN == 192) WgmmaM64N192K32E4m3E4m3(d, a, b, scale_d);
    if constexpr (kN == 128) WgmmaM64N128K32E4m3E4m3(d, a, b, scale_d);
    if constexpr (kN == 64) WgmmaM64N64K32E4m3E4m3(d, a, b, scale_d);
  }
}

// Promotion: acc += part * scale_a[row] * scale_b for one 64 x kN block, whose rows `row`
// and `row + 8` this thread holds (registers 4i, 4i + 1 and 4i + 2, 4i + 3).
template <int kN>
__device__ __forceinline__ void Promote(float (&acc)[kN / 2], const float (&part)[kN / 2], const float* scales,
                                        int row) {
  const float scale_b = scales[0];
  const float s0 = scales[row] * scale_b, s1 = scales[row + 8] * scale_b;
#pragma unroll
  for (int j = 0; j < kN / 2; ++j) acc[j] = fmaf(part[j], (j & 2) ? s1 : s0, acc[j]);
}

template <int kWarpgroups, int kChains, int kN, bool kLoads, Math kMath>
__global__ void __launch_bounds__(Variant<kWarpgroups, kChains, kN, kLoads, kMath>::kThreads, 1)
    WgmmaRate(const unsigned char* source, int k_tiles, long long* cycles, float* sink) {
#if defined(JG_SM90_ENABLED)
  using V = Variant<kWarpgroups, kChains, kN, kLoads, kMath>;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem =
      reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + V::kStages * V::kStageBytes);
  uint64_t* empty = full + V::kStages;
  const int wg = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < V::kStages; ++s) {
      MbarrierInit(&full[s], 1);
      MbarrierInit(&empty[s], kWarpgroups);
    }
    FenceMbarrierInit();
  }
  if (!kLoads) {  // two stages of real values, loaded once
    for (int i = threadIdx.x; i < V::kStages * V::kStageBytes / 16; i += blockDim.x) {
      reinterpret_cast<uint4*>(smem)[i] = reinterpret_cast<const uint4*>(source)[i];
    }
    FenceProxyAsyncShared();
  }
  __syncthreads();
  if (wg == kWarpgroups) {  // producer warp(group): its first thread loads
    if constexpr (V::kMovesRegisters) SetMaxRegistersDecrease<40>();
    if (kLoads && threadIdx.x == 128 * kWarpgroups) {
      int stage = 0;
      uint32_t phase = 0;
      for (int t = 0; t < k_tiles; ++t) {
        MbarrierWait(&empty[stage], phase ^ 1);
        MbarrierArriveExpectTx(&full[stage], V::kStageBytes);
        const unsigned char* src = source + size_t((t + 7 * blockIdx.x) % kSourceTiles) * kMaxStageBytes;
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                SharedAddress(smem + stage * V::kStageBytes)),
            "l"(src), "r"(V::kStageBytes), "r"(SharedAddress(&full[stage]))
            : "memory");
        if (++stage == V::kStages) stage = 0, phase ^= 1;
      }
    }
    return;
  }
  if constexpr (V::kMovesRegisters) SetMaxRegistersIncrease<232>();
  float acc[kChains][kN / 2];
  [[maybe_unused]] float part[V::kPromoted ? kChains : 1][kN / 2];
  if constexpr (V::kPromoted) {
#pragma unroll
    for (int c = 0; c < kChains; ++c)
#pragma unroll
      for (int j = 0; j < kN / 2; ++j) acc[c][j] = 0.f;
  }
  int stage = 0, previous = -1;
  uint32_t phase = 0;
  long long start = 0;
  constexpr int kWarmup = 16;
  for (int t = 0; t < k_tiles; ++t) {
    if (t == kWarmup) start = clock64();
    if (kLoads) MbarrierWait(&full[stage], phase);
    const uint32_t a = SharedAddress(smem + stage * V::kStageBytes) + wg * kChains * 64 * kRowBytes;
    const uint32_t b = SharedAddress(smem + stage * V::kStageBytes) + V::kRows * kRowBytes;
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint64_t desc_b = SmemDescriptorSw128(b + kk * 32, 16, 1024);
#pragma unroll
      for (int c = 0; c < kChains; ++c) {
        const uint64_t desc_a = SmemDescriptorSw128(a + c * 64 * kRowBytes + kk * 32, 16, 1024);
        if constexpr (V::kPromoted) {
          Mma<kN, kMath>(part[c], desc_a, desc_b, kk != 0);
        } else {
          Mma<kN, kMath>(acc[c], desc_a, desc_b, (t | kk) != 0);
        }
      }
    }
    WgmmaCommitGroup();
    if constexpr (V::kPromoted) {  // the stage's part sums, scaled into acc; then the stage is free
      WgmmaWaitGroup<0>();
      const float* scales = reinterpret_cast<const float*>(smem + stage * V::kStageBytes + V::kScaleOffset);
      const int row = threadIdx.x % 128 / 32 * 16 + threadIdx.x % 32 / 4;
#pragma unroll
      for (int c = 0; c < kChains; ++c) Promote<kN>(acc[c], part[c], scales, (wg * kChains + c) * 64 + row);
      if (kLoads && threadIdx.x % 128 == 0) MbarrierArrive(&empty[stage]);
    } else {
      WgmmaWaitGroup<1>();
      if (kLoads && previous >= 0 && threadIdx.x % 128 == 0) MbarrierArrive(&empty[previous]);
    }
    previous = stage;
    if (++stage == V::kStages) stage = 0, phase ^= 1;
  }
  WgmmaWaitGroup<0>();
  const long long stop = clock64();
  if (threadIdx.x == 0) cycles[blockIdx.x] = stop - start;
  // Keeps the wgmmas. (A sum of the accumulators instead made ptxas serialize the wgmmas
  // of two-chain variants, C7514.)
  if (k_tiles < 0) {
#pragma unroll
    for (int c = 0; c < kChains; ++c)
#pragma unroll
      for (int j = 0; j < kN / 2; ++j) sink[(c * kN / 2 + j) * blockDim.x + threadIdx.x] = acc[c][j];
  }
#endif
}

template <int kWarpgroups, int kChains, int kN, bool kLoads, Math kMath = Math::kBf16>
void Run(const char* name, const unsigned char* source, int k_tiles, int rounds, int sms, long long* cycles,
         float* sink) {
  using V = Variant<kWarpgroups, kChains, kN, kLoads, kMath>;
  auto kernel = WgmmaRate<kWarpgroups, kChains, kN, kLoads, kMath>;
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, V::kSmemBytes));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  std::vector<double> macs_per_clock, tflops;
  for (int r = 0; r < rounds + 1; ++r) {
    CHECK(cudaEventRecord(e0));
    kernel<<<sms, V::kThreads, V::kSmemBytes>>>(source, k_tiles, cycles, sink);
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(e1));
    CHECK(cudaDeviceSynchronize());
    if (r == 0) continue;  // warm-up
    float ms;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    std::vector<long long> c(sms);
    CHECK(cudaMemcpy(c.data(), cycles, sms * sizeof(long long), cudaMemcpyDeviceToHost));
    std::sort(c.begin(), c.end());
    const double tile_macs = double(V::kRows) * kN * V::kTileK;
    macs_per_clock.push_back(tile_macs * (k_tiles - 16) / double(c[sms / 2]));
    tflops.push_back(2.0 * tile_macs * k_tiles * sms / (ms * 1e-3) / 1e12);
  }
  std::sort(macs_per_clock.begin(), macs_per_clock.end());
  std::sort(tflops.begin(), tflops.end());
  std::printf("%-34s stages %d  %7.1f MAC/clk/SM  %6.1f TFLOP/s\n", name, V::kStages,
              macs_per_clock[macs_per_clock.size() / 2], tflops[tflops.size() / 2]);
}

int main(int argc, char** argv) {
  const int k_tiles = argc > 1 ? std::atoi(argv[1]) : 4000;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 3;
  int sms;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  unsigned char* source;
  long long* cycles;
  float* sink;
  const size_t source_bytes = size_t(kSourceTiles) * kMaxStageBytes;
  CHECK(cudaMalloc(&source, source_bytes));
  CHECK(cudaMalloc(&cycles, sms * sizeof(long long)));
  CHECK(cudaMalloc(&sink, 1024 * sizeof(float)));
  {  // bf16 values of a unit normal's spread, so that the math toggles as in a real product
    std::vector<uint16_t> h(source_bytes / 2);
    uint32_t x = 12345;
    for (auto& v : h) {
      x = x * 1664525u + 1013904223u;
      const float f = (float((x >> 8) & 0xffff) / 65536.f - 0.5f) * 3.4f;
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      v = uint16_t(bits >> 16);
    }
    CHECK(cudaMemcpy(source, h.data(), source_bytes, cudaMemcpyHostToDevice));
  }
  unsigned char* source8;
  CHECK(cudaMalloc(&source8, source_bytes));
  {  // e4m3 values of magnitude 1/2 to 4 (finite as e5m2 too); read as floats, the promoted
     // stages' scales are finite as well
    std::vector<uint8_t> h(source_bytes);
    uint32_t x = 54321;
    for (auto& v : h) {
      x = x * 1664525u + 1013904223u;
      v = uint8_t(((x >> 31) << 7) | ((6 + (x >> 16) % 3) << 3) | ((x >> 8) & 7));
    }
    CHECK(cudaMemcpy(source8, h.data(), source_bytes, cudaMemcpyHostToDevice));
  }
  std::printf("%d SMs, %d k-tiles per block, median of %d rounds\n", sms, k_tiles, rounds);
  auto run_all = [&](auto loads) {
    constexpr bool kLoads = decltype(loads)::value;
    std::printf(kLoads ? "-- with loads (bulk copies into a ring)\n" : "-- without loads (two preloaded stages)\n");
    Run<1, 2, 128, kLoads>("1 wg, 2 x m64n128 (pingpong 128x128)", source, k_tiles, rounds, sms, cycles, sink);
    Run<1, 1, 256, kLoads>("1 wg, 1 x m64n256 (64x256)", source, k_tiles, rounds, sms, cycles, sink);
    Run<2, 1, 256, kLoads>("2 wg, 1 x m64n256 (coop 128x256)", source, k_tiles, rounds, sms, cycles, sink);
    Run<2, 2, 128, kLoads>("2 wg, 2 x m64n128 (coop 256x128)", source, k_tiles, rounds, sms, cycles, sink);
    Run<2, 1, 128, kLoads>("2 wg, 1 x m64n128 (coop 128x128)", source, k_tiles, rounds, sms, cycles, sink);
    Run<1, 1, 128, kLoads>("1 wg, 1 x m64n128 (64x128)", source, k_tiles, rounds, sms, cycles, sink);
    constexpr Math kFast = Math::kFp8, kPromoted = Math::kFp8Promoted;
    const unsigned char* s8 = source8;
    Run<2, 1, 256, kLoads, kFast>("fp8 2 wg, 1 x m64n256 (128x256)", s8, k_tiles, rounds, sms, cycles, sink);
    Run<2, 2, 128, kLoads, kFast>("fp8 2 wg, 2 x m64n128 (256x128)", s8, k_tiles, rounds, sms, cycles, sink);
    Run<2, 1, 192, kLoads, kFast>("fp8 2 wg, 1 x m64n192 (128x192)", s8, k_tiles, rounds, sms, cycles, sink);
    Run<2, 1, 128, kLoads, kFast>("fp8 2 wg, 1 x m64n128 (128x128)", s8, k_tiles, rounds, sms, cycles, sink);
    Run<2, 1, 192, kLoads, kPromoted>("fp8 promoted, 2 wg, 1 x m64n192", s8, k_tiles, rounds, sms, cycles, sink);
    Run<2, 1, 128, kLoads, kPromoted>("fp8 promoted, 2 wg, 1 x m64n128", s8, k_tiles, rounds, sms, cycles, sink);
    Run<2, 2, 64, kLoads, kPromoted>("fp8 promoted, 2 wg, 2 x m64n64", s8, k_tiles, rounds, sms, cycles, sink);
    Run<1, 1, 192, kLoads, kPromoted>("fp8 promoted, 1 wg, 1 x m64n192", s8, k_tiles, rounds, sms, cycles, sink);
  };
  run_all(std::false_type{});
  run_all(std::true_type{});
  return 0;
}
