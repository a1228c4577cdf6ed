// Compile-time shape of a SIMT (FFMA) GEMM: threadblock tile BM x BN x BK; every thread
// owns an 8x8 accumulator laid out as 2x2 fragments of 4x4, the fragments BM/2 (BN/2)
// apart so that a warp's 128-bit shared loads touch consecutive addresses.
#pragma once

namespace jaxgemm {

template <int kBM_, int kBN_, int kBK_ = 8, int kMinBlocksPerSm_ = 0, int kStages_ = 0>
struct SimtPolicy {
  static constexpr int kBM = kBM_, kBN = kBN_, kBK = kBK_;
  static constexpr int kThreadTile = 8;
  static constexpr int kThreadsM = kBM / kThreadTile, kThreadsN = kBN / kThreadTile;
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

// Measured on an H200 (tools/simt_variants.cu, NOTES.md): for float32 the 128x128 tile
// is fastest with BK = 16 and a 3-stage cp.async ring; the smaller tiles and 16-bit
// inputs are fastest with the register-prefetch mainloop and BK = 8.
using SimtPolicy128x128F32 = SimtPolicy<128, 128, 16, 0, 3>;
using SimtPolicy128x128 = SimtPolicy<128, 128>;
using SimtPolicy128x64 = SimtPolicy<128, 64>;
using SimtPolicy64x64 = SimtPolicy<64, 64>;

}  // namespace jaxgemm
