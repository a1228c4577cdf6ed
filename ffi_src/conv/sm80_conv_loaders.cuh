// Global -> shared copiers for the A operand of the implicit GEMM on the sm80 mainloop:
// same stage layout as Sm80Tile (16-byte chunks, XOR swizzle), so Sm80Mainloop multiplies
// them unchanged. A chunk is 8 consecutive channels of one pixel, copied by one cp.async,
// or zero-filled (src-size 0) when the pixel falls in the padding: this needs channels per
// group and the channel pitch to be multiples of 8 and a 16-byte aligned tensor (checked on
// the host). Index math per k-tile is adds, multiplies and FastDivmods; no divisions.
#pragma once
#include <cstdint>

#include "common/ptx.cuh"
#include "conv/implicit_gemm.h"

namespace jaxgemm {

// fprop and dgrad (one phase of it, as a stride-1 gather with a negative dilation: see
// conv/implicit_gemm.h): the tile is [rows m][k], k-contiguous. Every chunk of a thread is
// at the same k (chunk column tid % 4 of a 32-deep tile), so one (r, s, c) cursor serves
// them all; each chunk's row keeps its pixel from setup.
template <class T, class Tile>
struct Sm80Im2colLoader {
  static constexpr int kV = Tile::kChunksPerThread, kBK = Tile::kRowElems;
  static_assert(Tile::kChunksPerRow * 8 == kBK && 256 % Tile::kChunksPerRow == 0, "k-contiguous tile");

  const T* image[kV];  // the row's image, at its group's first channel
  int oy[kV], ox[kV];  // input pixel of the row at tap (0, 0)
  bool row_ok[kV];
  const T* safe;       // any valid address (ignored by a zero-size cp.async)
  int r, s, c;         // tap and channel of this thread's chunks in the next k-tile
  int k_left;          // K minus that k
  // Copies of the geometry, kept in registers.
  int a_h, a_w, a_cg, taps_s, dil_h, dil_w;
  int64_t pitch;

  __device__ __forceinline__ Sm80Im2colLoader(const ConvGemm& g, int64_t group, int64_t m0) {
    a_h = g.a_h, a_w = g.a_w, a_cg = g.a_cg, taps_s = g.s, dil_h = g.dil_h, dil_w = g.dil_w;
    pitch = g.a_pitch;
    safe = static_cast<const T*>(g.a);
#pragma unroll
    for (int v = 0; v < kV; ++v) {
      const int row = (v * 256 + static_cast<int>(threadIdx.x)) / Tile::kChunksPerRow;
      const int64_t m = m0 + row;
      row_ok[v] = m < g.m;
      int n = 0, y = 0, x = 0, yx = 0;
      if (row_ok[v]) {
        g.div_ohw.DivMod(static_cast<int32_t>(m), &n, &yx);
        g.div_ow.DivMod(yx, &y, &x);
      }
      image[v] = safe + int64_t(n) * a_h * a_w * pitch + group * a_cg;
      oy[v] = y * g.stride_h - g.pad_h;
      ox[v] = x * g.stride_w - g.pad_w;
    }
    const int k0 = static_cast<int>(threadIdx.x) % Tile::kChunksPerRow * 8;
    int rs;
    g.div_cg.DivMod(k0, &rs, &c);
    g.div_s.DivMod(rs, &r, &s);
    k_left = static_cast<int>(g.k) - k0;
  }

  __device__ __forceinline__ void IssueNext(T* smem) {
    const int chunk = static_cast<int>(threadIdx.x) % Tile::kChunksPerRow;
#pragma unroll
    for (int v = 0; v < kV; ++v) {
      const int row = (v * 256 + static_cast<int>(threadIdx.x)) / Tile::kChunksPerRow;
      const int iy = oy[v] + r * dil_h, ix = ox[v] + s * dil_w;
      const bool ok = row_ok[v] && k_left > 0 && static_cast<unsigned>(iy) < static_cast<unsigned>(a_h) &&
                      static_cast<unsigned>(ix) < static_cast<unsigned>(a_w);
      const T* src = image[v] + (int64_t(iy) * a_w + ix) * pitch + c;
      CpAsync16(smem + Tile::Offset(row, chunk), ok ? src : safe, ok);
    }
    k_left -= kBK;
    c += kBK;
    while (c >= a_cg) {  // at most kBK / 8 taps per tile
      c -= a_cg;
      if (++s == taps_s) {
        s = 0;
        ++r;
      }
    }
  }
};

// wgrad: the tile is [k][rows m], m-contiguous: a thread's chunks share their m (8
// channels of one tap, fixed for the whole loop) and take k rows (pixels of y) 256 / 16
// apart; each k-tile locates its pixels with two FastDivmods.
template <class T, class Tile>
struct Sm80WgradLoader {
  static constexpr int kV = Tile::kChunksPerThread, kBK = Tile::kRows;
  static constexpr int kRowStep = 256 / Tile::kChunksPerRow;
  static_assert(kV * kRowStep == kBK, "the thread's rows cover the tile's k");

  const T* channel;  // x at image 0, pixel 0, this thread's 8 channels
  const T* safe;
  int off_y, off_x;  // r * dil - pad: input pixel = output pixel * stride + offset
  bool m_ok;
  int next_k, k_end;  // the thread's first pixel index in the next k-tile; chunk end
  int a_h, a_w, stride_h, stride_w;
  int64_t pitch;
  FastDivmod div_ohw, div_ow;

  __device__ __forceinline__ Sm80WgradLoader(const ConvGemm& g, int64_t group, int64_t m0, int64_t k_begin,
                                             int64_t k_size) {
    a_h = g.a_h, a_w = g.a_w, stride_h = g.stride_h, stride_w = g.stride_w;
    pitch = g.a_pitch;
    div_ohw = g.div_ohw, div_ow = g.div_ow;
    safe = static_cast<const T*>(g.a);
    const int chunk = static_cast<int>(threadIdx.x) % Tile::kChunksPerRow;
    const int64_t m = m0 + chunk * 8;
    m_ok = m < g.m;
    int rs = 0, c = 0, r = 0, s = 0;
    if (m_ok) {
      g.div_cg.DivMod(static_cast<int32_t>(m), &rs, &c);
      g.div_s.DivMod(rs, &r, &s);
    }
    channel = safe + group * g.a_cg + c;
    off_y = r * g.dil_h - g.pad_h;
    off_x = s * g.dil_w - g.pad_w;
    next_k = static_cast<int>(k_begin) + static_cast<int>(threadIdx.x) / Tile::kChunksPerRow;
    k_end = static_cast<int>(k_begin + k_size);
  }

  __device__ __forceinline__ void IssueNext(T* smem) {
    const int chunk = static_cast<int>(threadIdx.x) % Tile::kChunksPerRow;
#pragma unroll
    for (int v = 0; v < kV; ++v) {
      const int row = v * kRowStep + static_cast<int>(threadIdx.x) / Tile::kChunksPerRow;
      const int j = next_k + v * kRowStep;
      int n, yx, y, x;
      div_ohw.DivMod(j, &n, &yx);
      div_ow.DivMod(yx, &y, &x);
      const int iy = y * stride_h + off_y, ix = x * stride_w + off_x;
      const bool ok = m_ok && j < k_end && static_cast<unsigned>(iy) < static_cast<unsigned>(a_h) &&
                      static_cast<unsigned>(ix) < static_cast<unsigned>(a_w);
      const T* src = channel + ((int64_t(n) * a_h + iy) * a_w + ix) * pitch;
      CpAsync16(smem + Tile::Offset(row, chunk), ok ? src : safe, ok);
    }
    next_k += kBK;
  }
};

}  // namespace jaxgemm
