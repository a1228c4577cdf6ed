// CUDA version of fp8_quantize.h's two passes, for matrices whose columns are a multiple
// of 8 and rows a multiple of 16 (the launchers refuse others; Python sends them to XLA):
// - amax: a block covers 256 columns (8 a lane, one 16-byte load of 16-bit values) of
//   kAmaxRows rows, a warp every 8th row; a row's max is reduced across its warp, a
//   column's across the warps in shared memory; both reach global memory through
//   atomicMax on the bits of |s| (order-free, and NaN's bits exceed every number's), the
//   column sums as the chunk's fixed-order partial;
// - quantize: a block covers 128 rows x 64 columns, a thread 4 rows x 8 columns (loaded
//   first, then converted by pairs into e4m3, or e5m2 for a gradient); q rows leave as
//   8-byte stores, qt through a shared tile transposed by 4-byte words (4 rows of one
//   column; chunks swizzled, QtTileChunk) and written as 16-byte runs of qt's rows.
//   Where asked, the same block also reduces its values into the tensor's amax (one
//   atomicMax a block) and its 128 rows' column sums (a fixed-order partial, as above).
// (The source, |s|'s bits and e4m3: source.cuh.)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <type_traits>

#include "common/device_numeric.cuh"
#include "quantize/fp8_quantize.cuh"
#include "quantize/source.cuh"

namespace jaxgemm {
namespace {

constexpr int kAmaxThreads = 256, kAmaxCols = 256, kAmaxWarps = kAmaxThreads / 32;

template <class T, Activation kAct>
__global__ void __launch_bounds__(kAmaxThreads) Fp8AmaxKernel(const Fp8QuantizeProblem p) {
  __shared__ unsigned col_bits[kAmaxWarps][kAmaxCols];
  __shared__ float col_sums[kAmaxWarps][kAmaxCols];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t col = int64_t(blockIdx.x) * kAmaxCols + 8 * lane;
  const int64_t row0 = int64_t(blockIdx.y) * kAmaxRows;
  const bool inside = col < p.cols;  // (cols % 8 == 0: all 8 or none)
  unsigned cmax[8] = {};
  float csum[8] = {};
#pragma unroll 4
  for (int64_t r = row0 + warp; r < row0 + kAmaxRows && r < p.rows; r += kAmaxWarps) {
    float s[8] = {};
    if (inside) LoadSource<T, kAct>(p.x, p.at, r * p.cols + col, s);
    unsigned rmax = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      rmax = max(rmax, AbsBits(s[j]));
      cmax[j] = max(cmax[j], AbsBits(s[j]));
      csum[j] += s[j];
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) rmax = max(rmax, __shfl_xor_sync(0xffffffffu, rmax, offset));
    if (lane == 0 && p.row_amax != nullptr) atomicMax(reinterpret_cast<unsigned*>(p.row_amax) + r, rmax);
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) col_bits[warp][8 * lane + j] = cmax[j], col_sums[warp][8 * lane + j] = csum[j];
  __syncthreads();
  const int64_t c = int64_t(blockIdx.x) * kAmaxCols + threadIdx.x;
  if (c >= p.cols) return;
  unsigned bits = 0;
  float sum = 0.f;
#pragma unroll
  for (int w = 0; w < kAmaxWarps; ++w) bits = max(bits, col_bits[w][threadIdx.x]), sum += col_sums[w][threadIdx.x];
  if (p.col_amax != nullptr) atomicMax(reinterpret_cast<unsigned*>(p.col_amax) + c, bits);
  if (p.col_partials != nullptr) p.col_partials[blockIdx.y * p.cols + c] = sum;
}

constexpr int kQuantRows = 128, kQuantCols = 64, kQuantThreads = 256;
constexpr int kTilePitch = kQuantRows + 16;  // bytes per qt row in shared memory (16-byte aligned)
static_assert(kQuantRows == kAmaxRows, "the quantize pass's column sums are the amax pass's chunks");

// The quantize pass's statistics of a block: |s|'s max into p.amax, and the column sums of
// its rows into p.col_partials (each where wanted). s: a thread's 4 x 8 values (zeros
// outside the matrix). Every thread of the block calls it.
__device__ void QuantizeStats(const Fp8QuantizeProblem& p, const float (&s)[4][8], int g, int rg) {
  __shared__ float sums[kQuantRows / 4][kQuantCols];
  __shared__ unsigned warp_max[kQuantThreads / 32];
  unsigned bits = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    sums[rg][8 * g + j] = (s[0][j] + s[1][j]) + (s[2][j] + s[3][j]);
#pragma unroll
    for (int i = 0; i < 4; ++i) bits = max(bits, AbsBits(s[i][j]));
  }
  bits = __reduce_max_sync(0xffffffffu, bits);
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = bits;
  __syncthreads();
  if (p.amax != nullptr && threadIdx.x == 0) {
    for (int w = 1; w < kQuantThreads / 32; ++w) bits = max(bits, warp_max[w]);
    atomicMax(reinterpret_cast<unsigned*>(p.amax), bits);
  }
  const int64_t c = int64_t(blockIdx.x) * kQuantCols + threadIdx.x;
  if (p.col_partials != nullptr && threadIdx.x < kQuantCols && c < p.cols) {
    float sum = 0.f;
    for (int r = 0; r < kQuantRows / 4; ++r) sum += sums[r][threadIdx.x];
    p.col_partials[blockIdx.y * p.cols + c] = sum;
  }
}

template <class T, Activation kAct, __nv_fp8_interpretation_t kFormat>
__global__ void __launch_bounds__(kQuantThreads) Fp8QuantizeKernel(const Fp8QuantizeProblem p) {
  __shared__ alignas(16) uint8_t tile[kQuantCols][kTilePitch];  // qt's block: a row per column
  const int g = threadIdx.x % 8, rg = threadIdx.x / 8;       // columns 8 g.., rows 4 rg..
  const int64_t col = int64_t(blockIdx.x) * kQuantCols + 8 * g;
  const int64_t row0 = int64_t(blockIdx.y) * kQuantRows;
  const bool inside = col < p.cols;
  float col_inverse[8];  // 1 / scale, IEEE-rounded as jnp's (a multiply a value after it)
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    col_inverse[j] = p.qt != nullptr && inside ? __frcp_rn(p.col_scale[(col + j) * p.col_scale_stride]) : 1.f;
  }
  // A thread's 4 rows lie in one 16-row run: inside the matrix all or none (rows % 16 == 0).
  const bool live = inside && row0 + 4 * rg < p.rows;
  float s[4][8] = {};
  if (live) {
#pragma unroll
    for (int i = 0; i < 4; ++i) LoadSource<T, kAct>(p.x, p.at, (row0 + 4 * rg + i) * p.cols + col, s[i]);
  }
  if (p.amax != nullptr || p.col_partials != nullptr) QuantizeStats(p, s, g, rg);  // (uniform across the block)
  if (p.q != nullptr && live) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t r = row0 + 4 * rg + i;
      const float row_inverse = __frcp_rn(p.row_scale[r * p.row_scale_stride]);
      const uint2 packed{Fp8Word<kFormat>(s[i][0], s[i][1], s[i][2], s[i][3], row_inverse),
                         Fp8Word<kFormat>(s[i][4], s[i][5], s[i][6], s[i][7], row_inverse)};
      *reinterpret_cast<uint2*>(static_cast<uint8_t*>(p.q) + r * p.cols + col) = packed;
    }
  }
  uint32_t words[8];  // qt: column j's 4 rows, one byte each
#pragma unroll
  for (int j = 0; j < 8; ++j) words[j] = Fp8Word<kFormat>(s[0][j], s[1][j], s[2][j], s[3][j], col_inverse[j]);
  if (p.qt == nullptr) return;  // (uniform across the block)
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    *reinterpret_cast<uint32_t*>(&tile[8 * g + j][QtTileChunk(8 * g + j, rg / 4) + 4 * (rg % 4)]) = words[j];
  }
  __syncthreads();
  // qt's rows: column c of the block, 16 rows a thread-step.
  for (int u = threadIdx.x; u < kQuantCols * kQuantRows / 16; u += kQuantThreads) {
    const int c = u / (kQuantRows / 16), seg = u % (kQuantRows / 16);
    const int64_t qt_row = int64_t(blockIdx.x) * kQuantCols + c, r = row0 + 16 * seg;
    if (qt_row < p.cols && r < p.rows) {  // (rows % 16 == 0: all 16 or none)
      *reinterpret_cast<uint4*>(static_cast<uint8_t*>(p.qt) + qt_row * p.rows + r) =
          *reinterpret_cast<const uint4*>(&tile[c][QtTileChunk(c, seg)]);
    }
  }
}

// The kernels' layout needs: 8-column runs (16-byte loads of 16-bit values, 8-byte q
// stores), 16-row runs (16-byte qt stores), aligned buffers.
bool Fits(const Fp8QuantizeProblem& p) {
  return p.cols % 8 == 0 && p.rows % 16 == 0 && IsAligned(p.x, 16) && IsAligned(p.at, 16) && IsAligned(p.q, 16) &&
         IsAligned(p.qt, 16) && p.rows / kAmaxRows < 65535;
}

}  // namespace

cudaError_t LaunchFp8Amax(const Fp8QuantizeProblem& p, cudaStream_t stream) {
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  if (!Fits(p)) return cudaErrorInvalidValue;
  for (float* amax : {p.row_amax, p.col_amax}) {
    if (amax == nullptr) continue;
    const cudaError_t status = cudaMemsetAsync(amax, 0, (amax == p.row_amax ? p.rows : p.cols) * sizeof(float), stream);
    if (status != cudaSuccess) return status;
  }
  const dim3 grid(static_cast<unsigned>((p.cols + kAmaxCols - 1) / kAmaxCols), static_cast<unsigned>(p.AmaxChunks()));
  return WithQuantizeSource(p.type, p.at, p.activation, [&](auto t, auto act) {
    Fp8AmaxKernel<decltype(t), decltype(act)::value><<<grid, kAmaxThreads, 0, stream>>>(p);
    return cudaGetLastError();
  });
}

cudaError_t LaunchFp8Quantize(const Fp8QuantizeProblem& p, cudaStream_t stream) {
  if (p.amax != nullptr) {  // (zero even for an empty matrix: its amax)
    const cudaError_t status = cudaMemsetAsync(p.amax, 0, sizeof(float), stream);
    if (status != cudaSuccess) return status;
  }
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  if (!Fits(p)) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>((p.cols + kQuantCols - 1) / kQuantCols),
                  static_cast<unsigned>((p.rows + kQuantRows - 1) / kQuantRows));
  return WithQuantizeSource(p.type, p.at, p.activation, [&](auto t, auto act) {
    return WithFp8Format(p.e5m2, [&](auto format) {
      using T = decltype(t);
      Fp8QuantizeKernel<T, decltype(act)::value, decltype(format)::value><<<grid, kQuantThreads, 0, stream>>>(p);
      return cudaGetLastError();
    });
  });
}

}  // namespace jaxgemm
