// Implicit-GEMM wgrad on the sm90 GEMM kernel: operand loads for Sm90GemmKernel that make
// dw = im2col(x)^T * dy, so the consumers (wgmma + the fp32 epilogue) run unchanged on the
// partials [split][R*S*C][K] (rows of dw in HWIO order).
//
// GEMM rows m = (tap r * S + s, channel c), columns n = K, k = the output pixels (n, p, q),
// split into chunks (one fp32 partial each, summed by the caller).
//   A (MN-major, stored [k][m]): per 64-row block of m (C % 64 == 0, so one tap), one
//     im2col load of 64 output pixels x 64 channels with the tap as the (w, h) offset: the
//     same gather as fprop, read with its other dimension as the GEMM's k.
//   B (MN-major, stored [k][n]): dy as an (N*P*Q) x K matrix in 64 x 64 boxes.
// Pixels past N*P*Q read as zeros in both operands (images >= N; rows >= N*P*Q).
#pragma once
#include <cuda.h>

#include <cstdint>

#include "common/ptx_sm90.cuh"
#include "common/fast_divmod.h"
#include "gemm/problem.h"
#include "gemm/sm90/launch.cuh"

namespace jaxgemm {

struct Sm90ConvWgradLoads {
  CUtensorMap x;   // im2col over (C, W, H, N): 64 pixels x 64 channels per load
  CUtensorMap dy;  // (N*P*Q) x K, 64 x 64 boxes
  FastDivmod div_pq, div_q;  // output pixel (n, p, q) of a GEMM k index
  FastDivmod div_c, div_s;   // tap and channel of a GEMM row; (r, s) of a tap
  int32_t taps;              // R * S
  int32_t stride_h, stride_w, pad_h, pad_w, dil_h, dil_w;
  static constexpr bool kMapsRows = false;

  __device__ __forceinline__ void Prefetch() const {
#if defined(JG_SM90_ENABLED)
    PrefetchTensorMap(&x);
    PrefetchTensorMap(&dy);
#endif
  }

  // Called by one thread: fills stage after stage in the consumers' tile order (the same
  // ring walk as Sm90MatrixLoads::Produce).
  template <class P, bool kTransA, bool kTransB>
  __device__ __forceinline__ void Produce(const GemmProblem& p, const Sm90Schedule<P>& schedule,
                                          unsigned char* tiles_a, unsigned char* tiles_b, uint64_t* full,
                                          uint64_t* empty) const {
    static_assert(kTransA && !kTransB, "conv wgrad loads are MN-major A and B");
    static_assert(P::kBK == 64, "one load is 64 pixels");
    static_assert(P::kClusterM == 1, "no multicast: one block per work item");
#if defined(JG_SM90_ENABLED)
    constexpr int kBlocksA = P::kBM / 64, kBlocksB = P::kBN / 64;
    Sm90ProducerRing<P> ring(full, empty);
    Sm90Work work;
    for (Sm90Cursor cursor = schedule.Start(); schedule.Next(p, cursor, &work);) {
      // Each 64-row block of A: one channel block of one tap. Blocks past the last row
      // (not stored) load the last tap again, so every stage receives its full byte count.
      int channel[kBlocksA];
      uint16_t off_w[kBlocksA], off_h[kBlocksA];
#pragma unroll
      for (int j = 0; j < kBlocksA; ++j) {
        int tap, c, fr, fs;
        div_c.DivMod(static_cast<int32_t>(work.m0) + 64 * j, &tap, &c);
        if (tap >= taps) tap = taps - 1;
        div_s.DivMod(tap, &fr, &fs);
        channel[j] = c;
        off_w[j] = static_cast<uint16_t>(fs * dil_w);
        off_h[j] = static_cast<uint16_t>(fr * dil_h);
      }
      const int n0 = static_cast<int>(work.n0);
      for (int kt = 0; kt < work.k_tiles; ++kt) {
        const int pixel = static_cast<int>(work.k_begin) + kt * P::kBK;
        int image, pq, oy, ox;
        div_pq.DivMod(pixel, &image, &pq);
        div_q.DivMod(pq, &oy, &ox);
        const int h0 = oy * stride_h - pad_h, w0 = ox * stride_w - pad_w;
        uint64_t* const bar = ring.Acquire();
        unsigned char* sa = tiles_a + ring.stage * P::kTileABytes;
        unsigned char* sb = tiles_b + ring.stage * P::kTileBBytes;
#pragma unroll
        for (int j = 0; j < kBlocksA; ++j) {
          TmaLoadIm2col4d(sa + j * P::kMnBlockBytes, &x, bar, channel[j], w0, h0, image, off_w[j], off_h[j]);
        }
#pragma unroll
        for (int j = 0; j < kBlocksB; ++j) TmaLoad2d(sb + j * P::kMnBlockBytes, &dy, bar, n0 + 64 * j, pixel);
        ring.Advance();
      }
    }
#endif
  }
};

}  // namespace jaxgemm
