// Element types the kernels take, and float conversions usable on host and device.
#pragma once
#include <cstdint>
#include <cstring>

namespace jaxgemm {

enum class ElementType : int { kF32 = 0, kF16 = 1, kBF16 = 2, kF8E4M3 = 3, kF8E5M2 = 4 };

// What the host side knows of each element type, one row per type in the enum's order:
// adding a type is a row here, its device type in common/element_dispatch.cuh (or, for a
// GEMM-input-only type such as fp8, in gemm/dispatch.cu's own entry, RunFloat8Gemm) and its
// TMA type in gemm/sm90/tensor_map.cu.
struct ElementInfo {
  ElementType type;
  const char* name;
  int bytes;
  // wgmma reads the type from shared memory K-major only: 32-bit (tf32) and 8-bit types;
  // 16-bit ones in either major (the kernels then transpose MN-major tiles with its bit).
  bool wgmma_k_major_only;
};
inline constexpr ElementInfo kElementInfo[] = {
    {ElementType::kF32, "float32", 4, true},
    {ElementType::kF16, "float16", 2, false},
    {ElementType::kBF16, "bfloat16", 2, false},
    {ElementType::kF8E4M3, "float8_e4m3fn", 1, true},  // GEMM inputs only, on sm90 (IsFloat8)
    {ElementType::kF8E5M2, "float8_e5m2", 1, true},    // the same, beside an e4m3 operand
};
inline constexpr int kElementTypes = static_cast<int>(sizeof(kElementInfo) / sizeof(kElementInfo[0]));

constexpr bool ElementRowsInEnumOrder() {
  for (int i = 0; i < kElementTypes; ++i) {
    if (static_cast<int>(kElementInfo[i].type) != i) return false;
  }
  return true;
}
static_assert(ElementRowsInEnumOrder(), "kElementInfo: one row per ElementType, in the enum's order");

inline const char* ElementTypeName(ElementType t) {
  const int i = static_cast<int>(t);
  return i >= 0 && i < kElementTypes ? kElementInfo[i].name : "?";
}

inline int ElementBytes(ElementType t) { return kElementInfo[static_cast<int>(t)].bytes; }

inline bool WgmmaKMajorOnly(ElementType t) { return kElementInfo[static_cast<int>(t)].wgmma_k_major_only; }

// 8-bit floats: inputs of the sm90 GEMM only (both operands K-major, a 16-bit or float32
// output, no epilogue operands); every other kernel and handler refuses them. e4m3 pairs
// with itself or with e5m2 (a gradient's format), e5m2 with e4m3 only.
inline bool IsFloat8(ElementType t) { return t == ElementType::kF8E4M3 || t == ElementType::kF8E5M2; }

// Host-side half conversions (the CPU reference sees raw 16-bit words). Device code
// uses cuda_fp16.h / cuda_bf16.h instead.
inline float Bf16BitsToFloat(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t FloatToBf16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

inline float F16BitsToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    u = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;
  } else {  // subnormal: renormalize
    int e = -1;
    do { ++e; man <<= 1; } while ((man & 0x400u) == 0);
    u = sign | ((112u - e) << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t FloatToF16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;           // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;          // rounds to inf
  if (abs < 0x33000001u) return sign;                     // rounds to zero
  int exp = static_cast<int>(abs >> 23);
  uint32_t man = (abs & 0x7fffffu) | 0x800000u;
  int shift = exp < 113 ? 126 - exp : 13;                 // subnormal halves shift further
  uint32_t half_man = man >> shift;
  uint32_t rest = man & ((1u << shift) - 1u);
  uint32_t halfway = 1u << (shift - 1);
  if (rest > halfway || (rest == halfway && (half_man & 1u))) ++half_man;
  uint32_t bits = exp < 113 ? half_man : ((static_cast<uint32_t>(exp - 112) << 10) + (half_man - 0x400u));
  return static_cast<uint16_t>(sign | bits);  // a mantissa carry rolls into the exponent correctly
}

// float8_e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities, and
// S.1111.111 is NaN.
inline float E4m3BitsToFloat(uint8_t h) {
  const uint32_t exp = (h >> 3) & 0xfu, man = h & 0x7u;
  float magnitude;
  if (exp == 0xf && man == 0x7) {
    uint32_t nan = 0x7fc00000u;
    std::memcpy(&magnitude, &nan, 4);
  } else if (exp == 0) {
    magnitude = static_cast<float>(man) * (1.f / 512.f);  // subnormal: man / 8 * 2^-6
  } else {
    uint32_t u = ((exp + 120u) << 23) | (man << 20);  // rebias 7 -> 127
    std::memcpy(&magnitude, &u, 4);
  }
  return (h & 0x80u) ? -magnitude : magnitude;
}

// float8_e5m2: sign, 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like: S.11111.00 is
// infinity, S.11111.xx NaN.
inline float E5m2BitsToFloat(uint8_t h) {
  const uint32_t exp = (h >> 2) & 0x1fu, man = h & 0x3u;
  float magnitude;
  if (exp == 0x1f) {
    uint32_t special = man == 0 ? 0x7f800000u : 0x7fc00000u;
    std::memcpy(&magnitude, &special, 4);
  } else if (exp == 0) {
    magnitude = static_cast<float>(man) * (1.f / 65536.f);  // subnormal: man / 4 * 2^-14
  } else {
    uint32_t u = ((exp + 112u) << 23) | (man << 21);  // rebias 15 -> 127
    std::memcpy(&magnitude, &u, 4);
  }
  return (h & 0x80u) ? -magnitude : magnitude;
}

inline float LoadAsFloat(const void* base, int64_t i, ElementType t) {
  switch (t) {
    case ElementType::kF32: return static_cast<const float*>(base)[i];
    case ElementType::kF16: return F16BitsToFloat(static_cast<const uint16_t*>(base)[i]);
    case ElementType::kBF16: return Bf16BitsToFloat(static_cast<const uint16_t*>(base)[i]);
    case ElementType::kF8E4M3: return E4m3BitsToFloat(static_cast<const uint8_t*>(base)[i]);
    case ElementType::kF8E5M2: return E5m2BitsToFloat(static_cast<const uint8_t*>(base)[i]);
  }
  return 0.f;
}

inline void StoreFromFloat(void* base, int64_t i, float v, ElementType t) {
  switch (t) {
    case ElementType::kF32: static_cast<float*>(base)[i] = v; break;
    case ElementType::kF16: static_cast<uint16_t*>(base)[i] = FloatToF16Bits(v); break;
    case ElementType::kBF16: static_cast<uint16_t*>(base)[i] = FloatToBf16Bits(v); break;
    case ElementType::kF8E4M3:
    case ElementType::kF8E5M2: break;  // (never an output: DecodeGemm)
  }
}

}  // namespace jaxgemm
