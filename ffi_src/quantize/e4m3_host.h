// Host helpers of the quantization passes' CPU references: the source value, NaN-aware
// amax, float -> float8_e4m3fn (and e5m2) and a block's scale.
#pragma once
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "common/activation.h"
#include "common/element_type.h"

namespace jaxgemm {

// v as float8_e4m3fn, rounded to nearest even, saturated to +-448 (NaN stays NaN), as the
// GPU's cvt.rn.satfinite.e4m3x2.f32.
inline uint8_t FloatToE4m3Bits(float v) {
  const uint8_t sign = std::signbit(v) ? 0x80u : 0u;
  const float m = std::fabs(v);
  if (std::isnan(v)) return sign | 0x7fu;
  if (m >= 448.f) return sign | 0x7eu;
  if (m < 0.015625f) return sign | static_cast<uint8_t>(std::nearbyint(m * 512.f));  // below 2^-6: steps of 2^-9
  int e;
  std::frexp(m, &e);  // m = f 2^e, f in [0.5, 1): m's exponent is e - 1
  const int man = static_cast<int>(std::nearbyint(std::ldexp(m, 4 - e))) - 8;  // 3 mantissa bits (8: a carry)
  const int bits = ((e - 1 + 7) << 3) + man;
  return sign | static_cast<uint8_t>(bits > 0x7e ? 0x7e : bits);
}

// v as float8_e5m2, rounded to nearest even, saturated to +-57344 (NaN stays NaN), as the
// GPU's cvt.rn.satfinite.e5m2x2.f32.
inline uint8_t FloatToE5m2Bits(float v) {
  const uint8_t sign = std::signbit(v) ? 0x80u : 0u;
  const float m = std::fabs(v);
  if (std::isnan(v)) return sign | 0x7fu;
  if (m >= 57344.f) return sign | 0x7bu;
  if (m < 6.103515625e-05f) {  // below 2^-14: steps of 2^-16
    return sign | static_cast<uint8_t>(std::nearbyint(m * 65536.f));
  }
  int e;
  std::frexp(m, &e);
  const int man = static_cast<int>(std::nearbyint(std::ldexp(m, 3 - e))) - 4;  // 2 mantissa bits (4: a carry)
  const int bits = ((e - 1 + 15) << 2) + man;
  return sign | static_cast<uint8_t>(bits > 0x7b ? 0x7b : bits);
}

// Value i of the source: x, or x * act'(at) in the gradient's form (at non-null).
inline float SourceValue(const void* x, const void* at, ElementType t, Activation act, int64_t i) {
  const float v = LoadAsFloat(x, i, t);
  return at != nullptr ? v * ActivationGrad(act, LoadAsFloat(at, i, t)) : v;
}

// max(a, |v|) with NaN winning, as jnp.max.
inline float AbsMax(float a, float v) { return std::isnan(a) || std::isnan(v) ? NAN : std::max(a, std::fabs(v)); }

// The scale of a block whose largest magnitude is amax: amax * (1 / 448) but at least
// float32's smallest normal, or 1 where amax is not positive (all zeros, or a NaN), as
// quantize.scales_of.
inline float E4m3ScaleOf(float amax) { return amax > 0.f ? std::max(amax * (1.f / 448.f), FLT_MIN) : 1.f; }

// The same for e5m2 (amax * (1 / 57344)).
inline float E5m2ScaleOf(float amax) { return amax > 0.f ? std::max(amax * (1.f / 57344.f), FLT_MIN) : 1.f; }

}  // namespace jaxgemm
