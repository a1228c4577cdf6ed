// Global -> registers -> shared memory for the A operand of the implicit GEMM on CUDA cores
// (float32, and 16-bit inputs whose channels do not come in 16-byte chunks). Same thread
// map and shared layout as SimtTileLoader ([kBK][kExtent + 4] floats), so the SIMT
// mainloop's fragments read them unchanged. Any channel count works: without kVec each of
// a thread's 4 elements finds its own (r, s, c) or pixel with FastDivmods; with kVec
// (channels per group and pitch multiples of 4, 16-byte aligned) the 4 elements share one
// tap and move as one vector.
#pragma once
#include <cstdint>

#include "common/device_numeric.cuh"
#include "conv/implicit_gemm.h"
#include "gemm/simt_tile_loader.cuh"

namespace jaxgemm {

template <class T>
__device__ __forceinline__ T LoadOrZero(const T* p, bool ok) {
  return ok ? __ldg(p) : FromFloat<T>(0.f);
}

// fprop / dgrad: the tile is kExtent rows (pixels) by kBK k = (r, s, c), k-contiguous.
template <class T, int kExtent, int kBK, int kThreads, bool kDgrad, bool kVec>
struct SimtIm2colLoader {
  using Map = SimtTileMap<kExtent, kBK, kThreads, true>;
  static_assert(Map::kVecsPerThread == 1, "one 4-element vector (one row) per thread");
  static constexpr int kSmemStride = Map::kSmemStride;

  const ConvGemm& g;  // the kernel's __grid_constant__ parameter: read in place, no registers
  const T* image;     // the row's image at its group's first channel
  int oy, ox;         // as in Sm80Im2colLoader
  bool row_ok;
  int next_k;         // k of element 0 in the next k-tile
  T regs[4];

  __device__ __forceinline__ SimtIm2colLoader(const ConvGemm& gemm, int64_t group, int64_t m0) : g(gemm) {
    const int a_h = g.a_h, a_w = g.a_w;
    const int64_t pitch = g.a_pitch;
    int i, k;
    Map::Coord(0, &i, &k);
    const int64_t m = m0 + i;
    row_ok = m < g.m;
    int n = 0, yx = 0, y = 0, x = 0;
    if (row_ok) {
      g.div_ohw.DivMod(static_cast<int32_t>(m), &n, &yx);
      g.div_ow.DivMod(yx, &y, &x);
    }
    image = static_cast<const T*>(g.a) + int64_t(n) * a_h * a_w * pitch + group * g.a_cg;
    oy = kDgrad ? y + g.pad_h : y * g.stride_h - g.pad_h;
    ox = kDgrad ? x + g.pad_w : x * g.stride_w - g.pad_w;
    next_k = k;
  }

  // Element offset of tap-and-channel index kk of this row, or -1 in the padding.
  __device__ __forceinline__ int64_t Offset(int kk) const {
    int rs, c, r, s, iy, ix;
    g.div_cg.DivMod(kk, &rs, &c);
    g.div_s.DivMod(rs, &r, &s);
    bool ok;
    if (!kDgrad) {
      iy = oy + r * g.dil_h;
      ix = ox + s * g.dil_w;
      ok = static_cast<unsigned>(iy) < static_cast<unsigned>(g.a_h) &&
           static_cast<unsigned>(ix) < static_cast<unsigned>(g.a_w);
    } else {
      const int ny = oy - r * g.dil_h, nx = ox - s * g.dil_w;
      int rem_y, rem_x;
      g.div_stride_h.DivMod(ny < 0 ? 0 : ny, &iy, &rem_y);
      g.div_stride_w.DivMod(nx < 0 ? 0 : nx, &ix, &rem_x);
      ok = ny >= 0 && nx >= 0 && rem_y == 0 && rem_x == 0 && iy < g.a_h && ix < g.a_w;
    }
    return ok ? (int64_t(iy) * g.a_w + ix) * g.a_pitch + c : -1;
  }

  __device__ __forceinline__ void LoadNext() {
    if (kVec) {  // k_size and channels are multiples of 4: the vector is wholly in or out
      const int64_t off = row_ok && next_k < g.k ? Offset(next_k) : -1;
      Vec4<T> x;
      if (off >= 0) {
        x = *reinterpret_cast<const Vec4<T>*>(image + off);
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) x.v[j] = FromFloat<T>(0.f);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) regs[j] = x.v[j];
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t off = row_ok && next_k + j < g.k ? Offset(next_k + j) : -1;
        regs[j] = LoadOrZero(image + (off < 0 ? 0 : off), off >= 0);
      }
    }
    next_k += kBK;
  }

  __device__ __forceinline__ void Store(float* smem) const {
    int i, k;
    Map::Coord(0, &i, &k);
#pragma unroll
    for (int j = 0; j < 4; ++j) smem[(k + j) * kSmemStride + i] = ToFloat(regs[j]);
  }
};

// wgrad: the tile is kExtent rows m = (r, s, c) by kBK k = pixels of y, m-contiguous. A
// thread's 4 rows are fixed (their taps found once); each k-tile locates its pixel.
template <class T, int kExtent, int kBK, int kThreads, bool kVec>
struct SimtWgradLoader {
  using Map = SimtTileMap<kExtent, kBK, kThreads, false>;
  static_assert(Map::kVecsPerThread == 1, "one 4-element vector (one k) per thread");
  static constexpr int kSmemStride = Map::kSmemStride;

  const ConvGemm& g;  // the kernel's __grid_constant__ parameter
  const T* base;      // x at image 0, pixel 0, the group's first channel
  // Per row: r * dil - pad (kOutside for rows past M: no pixel is then in range), channel.
  int off_y[4], off_x[4], chan[4];
  static constexpr int kOutside = -(1 << 30);
  int next_k, k_end;
  T regs[4];

  __device__ __forceinline__ SimtWgradLoader(const ConvGemm& gemm, int64_t group, int64_t m0, int64_t k_begin,
                                             int64_t k_size)
      : g(gemm) {
    base = static_cast<const T*>(g.a) + group * g.a_cg;
    int i, k;
    Map::Coord(0, &i, &k);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t m = m0 + i + j;
      const bool m_ok = m < g.m;
      int rs = 0, c = 0, r = 0, s = 0;
      if (m_ok) {
        g.div_cg.DivMod(static_cast<int32_t>(m), &rs, &c);
        g.div_s.DivMod(rs, &r, &s);
      }
      off_y[j] = m_ok ? r * g.dil_h - g.pad_h : kOutside;
      off_x[j] = s * g.dil_w - g.pad_w;
      chan[j] = c;
    }
    next_k = static_cast<int>(k_begin) + k;
    k_end = static_cast<int>(k_begin + k_size);
  }

  __device__ __forceinline__ void LoadNext() {
    int n, yx, y, x;
    g.div_ohw.DivMod(next_k, &n, &yx);
    g.div_ow.DivMod(yx, &y, &x);
    const int a_h = g.a_h, a_w = g.a_w;
    const int64_t pitch = g.a_pitch;
    const T* image = base + int64_t(n) * a_h * a_w * pitch;
    const bool k_ok = next_k < k_end;
    const int py = y * g.stride_h, px = x * g.stride_w;
    if (kVec) {  // the 4 rows are 4 channels of one tap
      const int iy = py + off_y[0], ix = px + off_x[0];
      const bool ok = k_ok && static_cast<unsigned>(iy) < static_cast<unsigned>(a_h) &&
                      static_cast<unsigned>(ix) < static_cast<unsigned>(a_w);
      Vec4<T> v;
      if (ok) {
        v = *reinterpret_cast<const Vec4<T>*>(image + (int64_t(iy) * a_w + ix) * pitch + chan[0]);
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) v.v[j] = FromFloat<T>(0.f);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) regs[j] = v.v[j];
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int iy = py + off_y[j], ix = px + off_x[j];
        const bool ok = k_ok && static_cast<unsigned>(iy) < static_cast<unsigned>(a_h) &&
                        static_cast<unsigned>(ix) < static_cast<unsigned>(a_w);
        regs[j] = LoadOrZero(image + (ok ? (int64_t(iy) * a_w + ix) * pitch + chan[j] : 0), ok);
      }
    }
    next_k += kBK;
  }

  __device__ __forceinline__ void Store(float* smem) const {
    int i, k;
    Map::Coord(0, &i, &k);
    *reinterpret_cast<float4*>(smem + k * kSmemStride + i) =
        make_float4(ToFloat(regs[0]), ToFloat(regs[1]), ToFloat(regs[2]), ToFloat(regs[3]));
  }
};

}  // namespace jaxgemm
