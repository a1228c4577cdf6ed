// Device helpers of the quantization kernels (fp8_quantize.cu, fp8_block_quantize.cu): the
// source s (x, or dy * act'(at)) 8 values at a time, |s|'s bits for atomicMax, fp8 words.
// 16-bit inputs take act' with the hardware tanh / exp approximations (as bias_act_grad:
// their error is far below e4m3's rounding).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "common/activation.h"
#include "common/device_numeric.cuh"
#include "common/with_activation.h"
#include "gemm/epilogue_steps.cuh"

namespace jaxgemm {

template <class T>
__device__ __forceinline__ float QuantizeGrad(Activation act, float at) {
  if constexpr (std::is_same_v<T, float>) {
    return ActivationGrad(act, at);
  } else {
    return ActivationGradWith(act, at, [](float x) { return TanhApprox(x); }, [](float x) { return SigmoidApprox(x); });
  }
}

// The source's 8 values from element i (16-byte aligned runs): x (kAct kNone), or
// x * act'(at). The activation is a kernel's template argument (WithQuantizeSource,
// common/with_activation.h).
template <class T, Activation kAct>
__device__ __forceinline__ void LoadSource(const void* x, const void* at, int64_t i, float (&s)[8]) {
  const Vec<T, 8> xv = *reinterpret_cast<const Vec<T, 8>*>(static_cast<const T*>(x) + i);
#pragma unroll
  for (int j = 0; j < 8; ++j) s[j] = ToFloat(xv.v[j]);
  if constexpr (kAct != Activation::kNone) {
    const Vec<T, 8> av = *reinterpret_cast<const Vec<T, 8>*>(static_cast<const T*>(at) + i);
#pragma unroll
    for (int j = 0; j < 8; ++j) s[j] *= QuantizeGrad<T>(kAct, ToFloat(av.v[j]));
  }
}

// |v|'s bits: ordered as the magnitudes for numbers, NaN above all of them.
__device__ __forceinline__ unsigned AbsBits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

// a, b, c, d times `inverse` (IEEE products), rounded to kFormat (e4m3 or e5m2,
// saturating), as the bytes of one word, a's lowest: two conversions of a pair each, where
// one a value cost twice the conversions and 64-bit shifts to pack (the passes are bound
// by their issue rate).
template <__nv_fp8_interpretation_t kFormat>
__device__ __forceinline__ uint32_t Fp8Word(float a, float b, float c, float d, float inverse) {
  const auto pair = [inverse](float lo, float hi) {
    return uint32_t(__nv_cvt_float2_to_fp8x2(make_float2(__fmul_rn(lo, inverse), __fmul_rn(hi, inverse)),
                                             __NV_SATFINITE, kFormat));
  };
  return pair(a, b) | pair(c, d) << 16;
}

// The largest finite value of kFormat: e4m3's 448, e5m2's 57344.
template <__nv_fp8_interpretation_t kFormat>
inline constexpr float kFp8Largest = kFormat == __NV_E5M2 ? 57344.f : 448.f;

// Calls f(format), format the std::integral_constant of the quantized values' format.
template <class F>
cudaError_t WithFp8Format(bool e5m2, F f) {
  if (e5m2) return f(std::integral_constant<__nv_fp8_interpretation_t, __NV_E5M2>{});
  return f(std::integral_constant<__nv_fp8_interpretation_t, __NV_E4M3>{});
}

// Byte offset of 16-byte chunk `chunk` (0-7) of qt-tile row `c`: chunks XOR-swizzled by the
// row's group of 8, so that the 8 (16) column groups of a warp's writes, whose rows lie 8
// apart and would all start in one bank at a 144-byte pitch, reach 8 different chunks.
__device__ __forceinline__ int QtTileChunk(int c, int chunk) { return 16 * (chunk ^ (c / 8 % 8)); }

template <class F>
cudaError_t WithQuantizeType(ElementType t, F f) {
  switch (t) {
    case ElementType::kF32: return f(float{});
    case ElementType::kF16: return f(__half{});
    case ElementType::kBF16: return f(__nv_bfloat16{});
    case ElementType::kF8E4M3:
    case ElementType::kF8E5M2: break;
  }
  return cudaErrorInvalidValue;
}

// Calls f(t, act) for a pass's source: t a value of its element type, act the
// std::integral_constant of its activation (kNone where there is no `at`: x alone, or an
// identity's dz = dy).
template <class F>
cudaError_t WithQuantizeSource(ElementType type, const void* at, Activation activation, F f) {
  const Activation act = at != nullptr ? activation : Activation::kNone;
  return WithQuantizeType(type, [&](auto t) { return WithActivation(act, [&](auto a) { return f(t, a); }); });
}

}  // namespace jaxgemm
