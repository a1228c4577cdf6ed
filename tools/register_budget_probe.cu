// Which register budget ptxas compiles a warp-specialized consumer for (docs/kernels.md,
// section 5.1; ffi_src/gemm/NOTES.md, "ptxas lessons"). A producer warpgroup lowers its
// registers and kThreads / 128 - 1 consumer warpgroups raise theirs with setmaxnreg, then
// multiply into 64 x 256 fp32 accumulators per thread, either with one m64n256k16 wgmma
// (128 accumulator operands in one instruction) or with two m64n128k16 (64 each). Compile
// only, no GPU needed:
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Iffi_src -DJG_SM90_ENABLED \
//        -Xptxas -v -c tools/register_budget_probe.cu -o /tmp/probe.o [-DONE_WIDE_WGMMA]
//   cuobjdump -sass /tmp/probe.o | grep -o '\bR[0-9]*' | sort -uV | tail -1   # highest register
// With 512 threads the one-instruction form fails ("Insufficient registers (128)"): each
// instruction must fit the entry budget (65536 / threads), even after setmaxnreg raised it.
#include <cstdint>

#include "common/ptx_sm90.cuh"
#include "gemm/sm90/wgmma.cuh"

namespace jaxgemm {

template <int kThreads, int kProducerRegisters, int kConsumerRegisters>
__global__ void __launch_bounds__(kThreads, 1) RegisterBudgetProbe(float* out, int k_tiles, uint64_t desc) {
  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    SetMaxRegistersDecrease<kProducerRegisters>();
    if (threadIdx.x == 0) out[0] = 1.f;
    return;
  }
  SetMaxRegistersIncrease<kConsumerRegisters>();
  float acc[2][64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[0][i] = acc[1][i] = 0.f;
  for (int t = 0; t < k_tiles; ++t) {
    WgmmaFence();
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      // Descriptors only have to differ per step for the probe; nothing is read.
      const uint64_t desc_a = desc + t * 64 + s * 2 + warpgroup, desc_b = desc + s * 2 + t;
#if defined(ONE_WIDE_WGMMA)
      WgmmaM64N256K16Bf16<0, 0>(reinterpret_cast<float(&)[128]>(acc), desc_a, desc_b, 1);
#else
      WgmmaM64N128K16Bf16<0, 0>(acc[0], desc_a, desc_b, 1);
      WgmmaM64N128K16Bf16<0, 0>(acc[1], desc_a, desc_b + 512, 1);
#endif
    }
    WgmmaCommitGroup();
    WgmmaWaitGroup<0>();
  }
#pragma unroll
  for (int i = 0; i < 128; ++i) out[(blockIdx.x * kThreads + threadIdx.x) * 128 + i] = acc[i / 64][i % 64];
}

// Three consumers (192 x 256 per block): 24 x 128 + 160 x 384 registers fit 64 K.
template __global__ void RegisterBudgetProbe<512, 24, 160>(float*, int, uint64_t);

}  // namespace jaxgemm
