// Device-side element conversions and naturally aligned 4-element vectors.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

namespace jaxgemm {

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class T> __device__ __forceinline__ T FromFloat(float x);
template <> __device__ __forceinline__ float FromFloat<float>(float x) { return x; }
template <> __device__ __forceinline__ __half FromFloat<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Two values rounded to a 16-bit type, packed low then high (one 32-bit store).
template <class T>
__device__ __forceinline__ uint32_t PackPair(float lo, float hi) {
  static_assert(sizeof(T) == 2, "16-bit types only");
  T x[2] = {FromFloat<T>(lo), FromFloat<T>(hi)};
  uint32_t word;
  memcpy(&word, x, 4);
  return word;
}

// N consecutive elements moved by one memory access (e.g. 4 floats: 128 bits).
template <class T, int N>
struct alignas(N * sizeof(T)) Vec {
  T v[N];
};
template <class T>
using Vec4 = Vec<T, 4>;

__host__ __device__ __forceinline__ bool IsAligned(const void* p, int bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

}  // namespace jaxgemm
