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

// An 8-bit float format: mantissa bits, exponent bias, its largest finite value and that
// value's bits (the formats' NaN is 0x7f; e5m2's 0x7c is infinity, never written).
struct Fp8Format {
  int mantissa, bias;
  float largest;
  uint8_t largest_bits;
};
inline constexpr Fp8Format kE4m3{3, 7, 448.f, 0x7e}, kE5m2{2, 15, 57344.f, 0x7b};

// v in format f, rounded to nearest even, saturated to +-largest (NaN stays NaN), as the
// GPU's cvt.rn.satfinite.{e4m3,e5m2}x2.f32.
inline uint8_t FloatToFp8Bits(float v, const Fp8Format& f) {
  const uint8_t sign = std::signbit(v) ? 0x80u : 0u;
  const float m = std::fabs(v);
  if (std::isnan(v)) return sign | 0x7fu;
  if (m >= f.largest) return sign | f.largest_bits;
  const int min_exp = 1 - f.bias;      // the smallest normal's exponent
  if (m < std::ldexp(1.f, min_exp)) {  // subnormals: steps of 2^(min_exp - mantissa)
    return sign | static_cast<uint8_t>(std::nearbyint(std::ldexp(m, f.mantissa - min_exp)));
  }
  int e;
  std::frexp(m, &e);  // m = g 2^e, g in [0.5, 1): m's exponent is e - 1
  // The mantissa bits (2^mantissa after rounding: a carry, which rolls into the exponent).
  const int man = static_cast<int>(std::nearbyint(std::ldexp(m, f.mantissa + 1 - e))) - (1 << f.mantissa);
  const int bits = ((e - 1 + f.bias) << f.mantissa) + man;
  return sign | static_cast<uint8_t>(std::min(bits, int{f.largest_bits}));
}

// Value i of the source: x, or x * act'(at) in the gradient's form (at non-null).
inline float SourceValue(const void* x, const void* at, ElementType t, Activation act, int64_t i) {
  const float v = LoadAsFloat(x, i, t);
  return at != nullptr ? v * ActivationGrad(act, LoadAsFloat(at, i, t)) : v;
}

// max(a, |v|) with NaN winning, as jnp.max.
inline float AbsMax(float a, float v) { return std::isnan(a) || std::isnan(v) ? NAN : std::max(a, std::fabs(v)); }

// The scale of a block whose largest magnitude is amax: amax * (1 / largest) but at
// least float32's smallest normal, or 1 where amax is not positive (all zeros, or a NaN),
// as quantize.scales_of.
inline float Fp8ScaleOf(float amax, const Fp8Format& f) {
  return amax > 0.f ? std::max(amax * (1.f / f.largest), FLT_MIN) : 1.f;
}

}  // namespace jaxgemm
