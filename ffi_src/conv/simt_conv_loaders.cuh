// Global -> registers -> shared memory for the A operand of the implicit GEMM on CUDA cores
// (float32, and 16-bit inputs whose channels do not come in 16-byte chunks). Same thread
// map and shared layout as SimtTileLoader ([kBK][kExtent + 4] floats), so the SIMT
// mainloop's fragments read them unchanged. Any channel count works: without kVec each of
// a vector's 4 elements finds its own (r, s, c) or pixel with FastDivmods; with kVec
// (channels per group and pitch multiples of 4, 16-byte aligned) the 4 elements share one
// tap and move as one vector. The geometry is read from the kernel's __grid_constant__
// parameter in place (no register copies).
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

template <class T>
__device__ __forceinline__ Vec4<T> LoadVec4OrZero(const T* p, bool ok) {
  Vec4<T> x;
  if (ok) {
    x = *reinterpret_cast<const Vec4<T>*>(p);
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) x.v[j] = FromFloat<T>(0.f);
  }
  return x;
}

// fprop and dgrad (one phase of it: see conv/implicit_gemm.h): the tile is kExtent rows
// (pixels) by kBK k = (r, s, c), k-contiguous. A thread's vectors are in different rows at
// the same k.
template <class T, int kExtent, int kBK, int kThreads, bool kVec>
struct SimtIm2colLoader {
  using Map = SimtTileMap<kExtent, kBK, kThreads, true>;
  static constexpr int kV = Map::kVecsPerThread, kSmemStride = Map::kSmemStride;

  // oy of rows past M: every tap then falls outside the image (|r * dil| < 2^30).
  static constexpr int kOutside = -(1 << 30);

  const ConvGemm& g;
  const T* group_base;  // the gathered tensor at the group's first channel
  int image[kV];        // first pixel of the row's image (N*H*W < 2^30 is checked on the host)
  int oy[kV], ox[kV];   // input pixel of the row at tap (0, 0)
  int next_k;           // k of element 0 in the next k-tile
  T regs[kV][4];

  __device__ __forceinline__ SimtIm2colLoader(const ConvGemm& gemm, int64_t group, int64_t m0) : g(gemm) {
    group_base = static_cast<const T*>(g.a) + group * g.a_cg;
    int i, k;
#pragma unroll
    for (int v = 0; v < kV; ++v) {
      Map::Coord(v, &i, &k);
      const int64_t m = m0 + i;
      const bool row_ok = m < g.m;
      int n = 0, yx = 0, y = 0, x = 0;
      if (row_ok) {
        g.div_ohw.DivMod(static_cast<int32_t>(m), &n, &yx);
        g.div_ow.DivMod(yx, &y, &x);
      }
      image[v] = n * g.a_h * g.a_w;
      oy[v] = row_ok ? y * g.stride_h - g.pad_h : kOutside;
      ox[v] = x * g.stride_w - g.pad_w;
    }
    next_k = k;  // the same for every vector
  }

  // Element offset (from group_base) of tap (r, s) channel c for row v, or -1 in the padding.
  __device__ __forceinline__ int64_t Offset(int v, int r, int s, int c) const {
    const int iy = oy[v] + r * g.dil_h, ix = ox[v] + s * g.dil_w;
    const bool ok = static_cast<unsigned>(iy) < static_cast<unsigned>(g.a_h) &&
                    static_cast<unsigned>(ix) < static_cast<unsigned>(g.a_w);
    return ok ? int64_t(image[v] + iy * g.a_w + ix) * g.a_pitch + c : -1;
  }

  __device__ __forceinline__ void Tap(int kk, int* r, int* s, int* c) const {
    int rs;
    g.div_cg.DivMod(kk, &rs, c);
    g.div_s.DivMod(rs, r, s);
  }

  __device__ __forceinline__ void LoadNext() {
    if (kVec) {  // k and channels are multiples of 4: the vector is wholly in or out
      int r, s, c;
      Tap(next_k, &r, &s, &c);
      const bool k_ok = next_k < g.k;
#pragma unroll
      for (int v = 0; v < kV; ++v) {
        const int64_t off = k_ok ? Offset(v, r, s, c) : -1;
        const Vec4<T> x = LoadVec4OrZero(group_base + (off < 0 ? 0 : off), off >= 0);
#pragma unroll
        for (int j = 0; j < 4; ++j) regs[v][j] = x.v[j];
      }
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        int r, s, c;
        Tap(next_k + j, &r, &s, &c);
        const bool k_ok = next_k + j < g.k;
#pragma unroll
        for (int v = 0; v < kV; ++v) {
          const int64_t off = k_ok ? Offset(v, r, s, c) : -1;
          regs[v][j] = LoadOrZero(group_base + (off < 0 ? 0 : off), off >= 0);
        }
      }
    }
    next_k += kBK;
  }

  __device__ __forceinline__ void Store(float* smem) const {
#pragma unroll
    for (int v = 0; v < kV; ++v) {
      int i, k;
      Map::Coord(v, &i, &k);
#pragma unroll
      for (int j = 0; j < 4; ++j) smem[(k + j) * kSmemStride + i] = ToFloat(regs[v][j]);
    }
  }
};

// wgrad: the tile is kExtent rows m = (r, s, c) by kBK k = pixels of y, m-contiguous. A
// thread's 4 rows are the same for all its vectors (found once); each vector is one k.
template <class T, int kExtent, int kBK, int kThreads, bool kVec>
struct SimtWgradLoader {
  using Map = SimtTileMap<kExtent, kBK, kThreads, false>;
  static constexpr int kV = Map::kVecsPerThread, kSmemStride = Map::kSmemStride;
  static constexpr int kOutside = -(1 << 30);  // off_y of rows past M: no pixel is in range

  const ConvGemm& g;
  const T* base;  // x at image 0, pixel 0, the group's first channel
  int off_y[4], off_x[4], chan[4];  // per row: r * dil - pad, and its channel
  int next_k, k_end;  // k of vector 0 in the next k-tile; the chunk's end
  T regs[kV][4];

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
#pragma unroll
    for (int v = 0; v < kV; ++v) {
      const int kk = next_k + v * Map::kVecStepK;
      int n, yx, y, x;
      g.div_ohw.DivMod(kk, &n, &yx);
      g.div_ow.DivMod(yx, &y, &x);
      const T* image = base + int64_t(n) * g.a_h * g.a_w * g.a_pitch;
      const bool k_ok = kk < k_end;
      const int py = y * g.stride_h, px = x * g.stride_w;
      if (kVec) {  // the 4 rows are 4 channels of one tap
        const int iy = py + off_y[0], ix = px + off_x[0];
        const bool ok = k_ok && static_cast<unsigned>(iy) < static_cast<unsigned>(g.a_h) &&
                        static_cast<unsigned>(ix) < static_cast<unsigned>(g.a_w);
        const Vec4<T> x4 = LoadVec4OrZero(image + (ok ? (int64_t(iy) * g.a_w + ix) * g.a_pitch + chan[0] : 0), ok);
#pragma unroll
        for (int j = 0; j < 4; ++j) regs[v][j] = x4.v[j];
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int iy = py + off_y[j], ix = px + off_x[j];
          const bool ok = k_ok && static_cast<unsigned>(iy) < static_cast<unsigned>(g.a_h) &&
                          static_cast<unsigned>(ix) < static_cast<unsigned>(g.a_w);
          regs[v][j] = LoadOrZero(image + (ok ? (int64_t(iy) * g.a_w + ix) * g.a_pitch + chan[j] : 0), ok);
        }
      }
    }
    next_k += kBK;
  }

  __device__ __forceinline__ void Store(float* smem) const {
#pragma unroll
    for (int v = 0; v < kV; ++v) {
      int i, k;
      Map::Coord(v, &i, &k);
      *reinterpret_cast<float4*>(smem + k * kSmemStride + i) =
          make_float4(ToFloat(regs[v][0]), ToFloat(regs[v][1]), ToFloat(regs[v][2]), ToFloat(regs[v][3]));
    }
  }
};

}  // namespace jaxgemm
