// Compile-time shape of a SIMT (FFMA) GEMM: threadblock tile BM x BN x BK; every thread
// owns a kThreadTileM x 8 accumulator laid out as (kThreadTileM / 4) x 2 fragments of 4x4,
// the fragments BM / (kThreadTileM / 4) (BN / 2) apart so that a warp's 128-bit shared
// loads touch consecutive addresses.
#pragma once

namespace jaxgemm {

template <int kBM_, int kBN_, int kBK_ = 8, int kMinBlocksPerSm_ = 0, int kStages_ = 0, int kThreadTileM_ = 8>
struct SimtPolicy {
  static constexpr int kBM = kBM_, kBN = kBN_, kBK = kBK_;
  static constexpr int kThreadTileM = kThreadTileM_, kThreadTileN = 8;
  static constexpr int kFragmentsM = kThreadTileM / 4, kFragmentsN = kThreadTileN / 4;
  static_assert(kThreadTileM == 8 || kThreadTileM == 16, "8x8 or 16x8 accumulators per thread");
  static constexpr int kThreadsM = kBM / kThreadTileM, kThreadsN = kBN / kThreadTileN;
  static constexpr int kThreads = kThreadsM * kThreadsN;
  // A warp is 4 x 8 threads (rows x cols): 4 distinct A vectors (broadcast) and 8
  // consecutive B vectors per shared load.
  // kStages > 0: float32 through a ring of kStages cp.async shared-memory k-tiles;
  // 0: global -> registers -> shared memory, double-buffered (any input type).
  static constexpr int kStages = kStages_;
  static constexpr int kWarpThreadsM = 4, kWarpThreadsN = 8;
  static constexpr int kWarpsN = kThreadsN / kWarpThreadsN;
  // Registers: 64 accumulators + 2x16 fragments + prefetch; by default two 256-thread
  // blocks share an SM (a 128-register cap).
  static constexpr int kMinBlocksPerSm = kMinBlocksPerSm_ > 0 ? kMinBlocksPerSm_ : 512 / kThreads;
  static_assert(kThreadsN % kWarpThreadsN == 0 && kThreadsM % kWarpThreadsM == 0,
                "the tile must hold whole 4x8-thread warps");
};

// Measured on an H200 (tools/simt_variants.cu; the other stage counts and BKs tried are in
// ffi_src/gemm/NOTES.md, rejected ideas, "SIMT"): for float32 the 128x128 tile
// is fastest with BK = 16 and a 3-stage cp.async ring; the smaller tiles and 16-bit
// inputs are fastest with the register-prefetch mainloop and BK = 8.
using SimtPolicy128x128F32 = SimtPolicy<128, 128, 16, 0, 3>;
using SimtPolicy128x128 = SimtPolicy<128, 128>;
using SimtPolicy128x64 = SimtPolicy<128, 64>;
using SimtPolicy64x64 = SimtPolicy<64, 64>;
// cuBLAS's SGEMM shape on the H200 (sm80_xmma_gemm ... 256x128x8, 4x2 warps): one block
// of 8 warps per SM, each thread 16x8 accumulators (128 registers): fewer shared loads
// per FFMA (6 LDS.128 per 128 instead of 4 per 64), and the ILP covers the fewer warps.
using SimtPolicy256x128F32 = SimtPolicy<256, 128, 16, 1, 3, 16>;

}  // namespace jaxgemm
