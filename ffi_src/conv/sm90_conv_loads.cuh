// Implicit-GEMM fprop on the sm90 GEMM kernel: operand loads for Sm90GemmKernel whose A
// tiles are im2col gathers of x made by TMA itself, so the consumers (wgmma + epilogue) run
// unchanged on y = [N*P*Q, K] row-major.
//
// GEMM k runs over (filter tap r * S + s, 64-channel block): one k-tile is one tap times
// 64 channels, k = R * S * ceil(C / 64) * 64.
//   A (K-major, 128 x 64): one im2col load, 128 output pixels from the tile's first row
//     (the walk crosses rows and images), the tap as the (w, h) offset, channels >= C and
//     pixels in the padding read as zeros.
//   B (MN-major, 64 x kBN): w as a (K, C, R*S) tiled map, 64 x 64 boxes like the GEMM's
//     NN layout; channels >= C read as zeros, so padded k-tiles add nothing.
//
// One output phase of a strided dgrad is such a forward conv too (conv/sm90_conv.cu):
// x = dy, stride 1, the phase's taps as the filter (their dy offsets fall as the tap
// index rises, so the loads walk them in reverse: B's taps reversed, offsets rising), and
// GEMM row (n, i, j) of the phase's pixel grid stored at dx pixel
// (n, phase_y + i * step_y, phase_x + j * step_x).
#pragma once
#include <cuda.h>

#include <cstdint>

#include "common/ptx_sm90.cuh"
#include "common/fast_divmod.h"
#include "gemm/problem.h"
#include "gemm/sm90/launch.cuh"

namespace jaxgemm {

struct Sm90ConvFpropLoads {
  CUtensorMap x;  // im2col over (C, W, H, N): 128 pixels x 64 channels per load
  CUtensorMap w;  // tiled over (K, C, R*S), or (K, C) when R*S = 1
  FastDivmod div_pq, div_q;  // output pixel (n, p, q) of a GEMM row
  int32_t stride_h, stride_w, pad_h, pad_w, dil_h, dil_w;
  int32_t s;         // filter width
  int32_t taps;      // R * S
  int32_t c_blocks;  // ceil(C / 64) k-tiles per tap
  bool w_3d;
  bool reverse_taps = false;  // dgrad: B's tap t is the loads' tap taps - 1 - t
  bool phased = false;        // dgrad: GEMM rows are a phase's pixels (OutputRow)
  int32_t dx_h = 0, dx_w = 0, phase_y = 0, phase_x = 0, step_y = 1, step_x = 1;

  static constexpr bool kMapsRows = true;
  bool MapsRows() const { return phased; }

  // D's row of GEMM row m: m itself, or the dx pixel of a dgrad phase's row.
  __device__ __forceinline__ int64_t OutputRow(int64_t m) const {
    if (!phased) return m;
    int image, yx, y, x;
    div_pq.DivMod(static_cast<int32_t>(m), &image, &yx);
    div_q.DivMod(yx, &y, &x);
    return (int64_t{image} * dx_h + phase_y + y * step_y) * dx_w + phase_x + x * step_x;
  }

  __device__ __forceinline__ void Prefetch() const {
#if defined(JG_SM90_ENABLED)
    PrefetchTensorMap(&x);
    PrefetchTensorMap(&w);
#endif
  }

  // Called by one thread: fills stage after stage in the consumers' tile order (the same
  // ring walk as Sm90MatrixLoads::Produce). Only the NN layout exists for convolutions.
  template <class P, bool kTransA, bool kTransB>
  __device__ __forceinline__ void Produce(const GemmProblem& p, const Sm90Schedule<P>& schedule,
                                          unsigned char* tiles_a, unsigned char* tiles_b, uint64_t* full,
                                          uint64_t* empty) const {
    static_assert(!kTransA && !kTransB, "conv fprop loads are K-major A and MN-major B");
    static_assert(P::kBK == 64 && P::kBM == 128, "one load is 128 pixels x 64 channels");
    static_assert(P::kClusterM == 1, "no multicast: one block per work item");
#if defined(JG_SM90_ENABLED)
    Sm90ProducerRing<P> ring(full, empty);
    Sm90Work work;
    for (Sm90Cursor cursor = schedule.Start(); schedule.Next(p, cursor, &work);) {
      // Where the walk starts: the tile's first output pixel, in padded input coordinates.
      int image, pq, oy, ox;
      div_pq.DivMod(static_cast<int32_t>(work.m0), &image, &pq);
      div_q.DivMod(pq, &oy, &ox);
      const int h0 = oy * stride_h - pad_h, w0 = ox * stride_w - pad_w;
      const int n0 = static_cast<int>(work.n0);
      int cb = 0, fr = 0, fs = 0;  // k-tile = (tap (fr, fs), channel block cb)
      for (int kt = 0; kt < work.k_tiles; ++kt) {
        uint64_t* const bar = ring.Acquire();
        TmaLoadIm2col4d(tiles_a + ring.stage * P::kTileABytes, &x, bar, 64 * cb, w0, h0, image,
                        static_cast<uint16_t>(fs * dil_w), static_cast<uint16_t>(fr * dil_h));
        unsigned char* sb = tiles_b + ring.stage * P::kTileBBytes;
        const int tap = reverse_taps ? taps - 1 - (fr * s + fs) : fr * s + fs;
#pragma unroll
        for (int j = 0; j < P::kBN / 64; ++j) {
          if (w_3d) {
            TmaLoad3d(sb + j * P::kMnBlockBytes, &w, bar, n0 + 64 * j, 64 * cb, tap);
          } else {
            TmaLoad2d(sb + j * P::kMnBlockBytes, &w, bar, n0 + 64 * j, 64 * cb);
          }
        }
        if (++cb == c_blocks) {
          cb = 0;
          if (++fs == s) {
            fs = 0;
            ++fr;
          }
        }
        ring.Advance();
      }
    }
#endif
  }
};

}  // namespace jaxgemm
