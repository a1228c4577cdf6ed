// CUDA version of fp8_block_quantize.h's pass: 128 x 128 tiles (QuantizeTile), 256 threads
// a block, thread t holding rows 8 (t / 16).. and columns 8 (t % 16).. of a tile (64 values,
// one 16-byte load a row for 16-bit inputs); a 16-bit x alone staged through shared memory
// by a persistent grid (Fp8BlockQuantizeRingKernel), other sources a block a tile. A row's
// amax is reduced across the 16 lanes that share its rows (shuffles), a column's across
// the warp's two row groups (a shuffle) and the 8 warps (shared memory), as are the
// gradient form's column sums (fixed order). Values convert by pairs (Fp8Word: e4m3, or
// e5m2 for a gradient); q's rows leave as 8-byte stores; qt through a shared tile written
// by 8-row words and read as 16-byte runs (its chunks swizzled, QtTileChunk).
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>

#include "common/ptx.cuh"
#include "quantize/fp8_block_quantize.cuh"
#include "quantize/source.cuh"

namespace jaxgemm {
namespace {

constexpr int kThreads = 256, kB = static_cast<int>(kQuantBlock), kPitch = kB + 16;  // qt tile row: 16-byte aligned

// amax * (1 / 448) (e5m2: 1 / 57344) but at least float32's smallest normal (whose
// reciprocal is finite: a smaller scale made 1 / scale infinite and a block's zeros NaN),
// or 1 where amax is not positive (all zeros, or NaN's bits), as quantize.scales_of.
template <__nv_fp8_interpretation_t kFormat>
__device__ __forceinline__ float ScaleOfBits(unsigned amax_bits) {
  const float amax = __uint_as_float(amax_bits);
  return amax > 0.f ? fmaxf(__fmul_rn(amax, 1.f / kFp8Largest<kFormat>), FLT_MIN) : 1.f;
}

// A tile's scratch: the column reductions across the warps, and qt's block.
struct TileShared {
  unsigned col_bits[kThreads / 32][kB];
  float col_sums[kThreads / 32][kB];
  alignas(16) uint8_t tile[kB][kPitch];  // qt's block: a row per column of the tile
};

// Tile (tr, tc): its values from x (and at) at the tile's first value, `pitch` values a
// row (the matrix's, or a staged tile's in shared memory). Every thread of the block
// takes part; the caller's barrier orders `sh` between consecutive tiles' last reads and
// first writes (here: the first __syncthreads below).
template <class T, Activation kAct, __nv_fp8_interpretation_t kFormat>
__device__ __forceinline__ void QuantizeTile(const Fp8BlockQuantizeProblem& p, int64_t tr, int64_t tc, const T* x,
                                             const T* at, int64_t pitch, TileShared& sh) {
  auto& col_bits = sh.col_bits;
  auto& col_sums = sh.col_sums;
  auto& tile = sh.tile;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = threadIdx.x % 16, rg = threadIdx.x / 16;
  const int64_t row0 = tr * kB + 8 * rg, col0 = tc * kB + 8 * g;
  float v[8][8];
  unsigned row_bits[8], col_bits_mine[8] = {};
  float col_sum[8] = {};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    LoadSource<T, kAct>(x, at, (8 * rg + i) * pitch + 8 * g, v[i]);
    row_bits[i] = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      row_bits[i] = max(row_bits[i], AbsBits(v[i][j]));
      col_bits_mine[j] = max(col_bits_mine[j], AbsBits(v[i][j]));
      col_sum[j] += v[i][j];
    }
  }
  // Rows: across the 16 lanes of the row group. Columns: the other row group of the warp,
  // then the warps.
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int offset = 8; offset > 0; offset /= 2) row_bits[i] = max(row_bits[i], __shfl_xor_sync(~0u, row_bits[i], offset));
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    col_bits_mine[j] = max(col_bits_mine[j], __shfl_xor_sync(~0u, col_bits_mine[j], 16));
    const float other = __shfl_xor_sync(~0u, col_sum[j], 16);
    col_sum[j] = lane < 16 ? col_sum[j] + other : other + col_sum[j];  // (the same order in both halves)
  }
  if (lane < 16) {
#pragma unroll
    for (int j = 0; j < 8; ++j) col_bits[warp][8 * g + j] = col_bits_mine[j], col_sums[warp][8 * g + j] = col_sum[j];
  }
  __syncthreads();
  unsigned tile_bits = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    col_bits_mine[j] = 0;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) col_bits_mine[j] = max(col_bits_mine[j], col_bits[w][8 * g + j]);
    tile_bits = max(tile_bits, col_bits_mine[j]);
  }
#pragma unroll
  for (int offset = 8; offset > 0; offset /= 2) tile_bits = max(tile_bits, __shfl_xor_sync(~0u, tile_bits, offset));
  // The scales, written by the threads of the first column group (q's) and row group (qt's).
  float row_inverse[8], col_inverse[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const float row_scale = ScaleOfBits<kFormat>(p.tiles ? tile_bits : row_bits[k]);
    const float col_scale = ScaleOfBits<kFormat>(p.tiles ? tile_bits : col_bits_mine[k]);
    row_inverse[k] = __frcp_rn(row_scale);
    col_inverse[k] = __frcp_rn(col_scale);
    if (g == 0) p.q_scale[(row0 + k) * (p.cols / kB) + tc] = row_scale;
    if (rg == 0) p.qt_scale[(col0 + k) * (p.rows / kB) + tr] = col_scale;
  }
  if (p.col_partials != nullptr && threadIdx.x < kB) {
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) sum += col_sums[w][threadIdx.x];
    p.col_partials[tr * p.cols + tc * kB + threadIdx.x] = sum;
  }
  // q by rows; qt's bytes of column j, rows 8 rg.., as two words into the shared tile.
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint2 packed{Fp8Word<kFormat>(v[i][0], v[i][1], v[i][2], v[i][3], row_inverse[i]),
                       Fp8Word<kFormat>(v[i][4], v[i][5], v[i][6], v[i][7], row_inverse[i])};
    *reinterpret_cast<uint2*>(static_cast<uint8_t*>(p.q) + (row0 + i) * p.cols + col0) = packed;
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const uint2 column{Fp8Word<kFormat>(v[0][j], v[1][j], v[2][j], v[3][j], col_inverse[j]),
                       Fp8Word<kFormat>(v[4][j], v[5][j], v[6][j], v[7][j], col_inverse[j])};
    *reinterpret_cast<uint2*>(&tile[8 * g + j][QtTileChunk(8 * g + j, rg / 2) + 8 * (rg % 2)]) = column;
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < kB * kB / 16 / kThreads; ++k) {
    const int u = threadIdx.x + k * kThreads, c = u / (kB / 16), seg = u % (kB / 16);
    *reinterpret_cast<uint4*>(static_cast<uint8_t*>(p.qt) + (tc * kB + c) * p.rows + tr * kB + 16 * seg) =
        *reinterpret_cast<const uint4*>(&tile[c][QtTileChunk(c, seg)]);
  }
}

template <class T, Activation kAct, __nv_fp8_interpretation_t kFormat>
__global__ void __launch_bounds__(kThreads, 2) Fp8BlockQuantizeKernel(const Fp8BlockQuantizeProblem p) {
  __shared__ TileShared sh;
  const int64_t tr = blockIdx.y, tc = blockIdx.x, first = tr * kB * p.cols + tc * kB;
  QuantizeTile<T, kAct, kFormat>(p, tr, tc, static_cast<const T*>(p.x) + first,
                        p.at != nullptr ? static_cast<const T*>(p.at) + first : nullptr, p.cols, sh);
}

// A 16-bit x without a gradient's second source: a persistent grid, each block walking
// tiles blockIdx.x, + gridDim.x, ... with the next tile copied into shared memory (cp.async,
// two stages) while it quantizes the current one, so that its loads stay in flight through
// the reductions and stores. On an H100 x's pass at 32768 x 4096 went 0.332 -> 0.246 ms;
// with dy and z staged too (one block an SM) dz's went 0.819 -> 1.164, so it stays direct.
template <class T, __nv_fp8_interpretation_t kFormat>
__global__ void __launch_bounds__(kThreads) Fp8BlockQuantizeRingKernel(const Fp8BlockQuantizeProblem p) {
  extern __shared__ __align__(16) unsigned char staged[];  // [stage][kB * kB] of T
  __shared__ TileShared sh;
  constexpr int kTileValues = kB * kB;
  const int64_t tile_cols = p.cols / kB, tiles = p.rows / kB * tile_cols;
  auto stage = [&](int s) { return reinterpret_cast<T*>(staged) + s * kTileValues; };
  auto fetch = [&](int64_t t, int s) {  // tile t into stage s, one commit group
    const T* src = static_cast<const T*>(p.x) + t / tile_cols * kB * p.cols + t % tile_cols * kB;
    T* dst = stage(s);
#pragma unroll
    for (int k = 0; k < kTileValues / 8 / kThreads; ++k) {  // 16-byte runs, 8 a thread
      const int run = threadIdx.x + k * kThreads, row = run / (kB / 8), col = 8 * (run % (kB / 8));
      CpAsync16(dst + row * kB + col, src + row * p.cols + col, true);
    }
    CpAsyncCommitGroup();
  };
  int s = 0;
  if (blockIdx.x < tiles) fetch(blockIdx.x, 0);
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x, s ^= 1) {
    if (t + gridDim.x < tiles) {
      fetch(t + gridDim.x, s ^ 1);  // (its stage was read by the previous tile, before the barrier below)
      CpAsyncWaitGroup<1>();
    } else {
      CpAsyncWaitGroup<0>();
    }
    __syncthreads();  // every thread's copies of tile t are in place
    QuantizeTile<T, Activation::kNone, kFormat>(p, t / tile_cols, t % tile_cols, stage(s), nullptr, kB, sh);
    __syncthreads();  // stage s is read before a later fetch refills it
  }
}

// Blocks of the ring kernel the device holds at once (its shared memory bounds them).
template <class T, __nv_fp8_interpretation_t kFormat>
cudaError_t LaunchRing(const Fp8BlockQuantizeProblem& p, cudaStream_t stream) {
  const size_t smem = 2 * kB * kB * sizeof(T);
  auto* kernel = Fp8BlockQuantizeRingKernel<T, kFormat>;
  cudaError_t status =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  int device = 0, sms = 0, per_sm = 0;
  if (status == cudaSuccess) status = cudaGetDevice(&device);
  if (status == cudaSuccess) status = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (status == cudaSuccess) status = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem);
  if (status != cudaSuccess) return status;
  const int64_t tiles = p.rows / kB * (p.cols / kB);
  const int64_t blocks = std::min<int64_t>(tiles, int64_t{std::max(per_sm, 1)} * sms);
  kernel<<<static_cast<unsigned>(blocks), kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchFp8BlockQuantize(const Fp8BlockQuantizeProblem& p, cudaStream_t stream) {
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  const bool fits = p.rows % kB == 0 && p.cols % kB == 0 && p.rows / kB < 65536 && IsAligned(p.x, 16) &&
                    IsAligned(p.at, 16) && IsAligned(p.q, 16) && IsAligned(p.qt, 16);
  if (!fits) return cudaErrorInvalidValue;
  return WithQuantizeSource(p.type, p.at, p.activation, [&](auto t, auto act) {
    return WithFp8Format(p.e5m2, [&](auto format) {
      using T = decltype(t);
      constexpr Activation kAct = decltype(act)::value;
      constexpr __nv_fp8_interpretation_t kFormat = decltype(format)::value;
      if constexpr (sizeof(T) == 2 && kAct == Activation::kNone) {
        return LaunchRing<T, kFormat>(p, stream);
      } else {
        const dim3 grid(static_cast<unsigned>(p.cols / kB), static_cast<unsigned>(p.rows / kB));
        Fp8BlockQuantizeKernel<T, kAct, kFormat><<<grid, kThreads, 0, stream>>>(p);
        return cudaGetLastError();
      }
    });
  });
}

}  // namespace jaxgemm
