// Division by a run-time constant as a multiply-high and a shift (Granlund & Montgomery,
// "Division by invariant integers using multiplication", 1994): the divisor's magic number
// is computed once on the host, so loops on the GPU never issue an integer division.
#pragma once
#include <cstdint>

#include "common/host_device.h"

namespace jaxgemm {

struct FastDivmod {
  int32_t divisor = 1;
  uint32_t multiplier = 1;  // floor(2^32 (2^shift - d) / d) + 1
  int32_t shift = 0;        // ceil(log2 d)

  FastDivmod() = default;
  explicit FastDivmod(int32_t d) : divisor(d < 1 ? 1 : d) {
    while ((int64_t{1} << shift) < divisor) ++shift;
    multiplier = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - divisor)) / divisor + 1);
  }

  // Quotient and remainder of 0 <= x < 2^31 (so the sum below cannot overflow 32 bits).
  JG_HOST_DEVICE_INLINE int32_t Div(int32_t x) const {
    const uint32_t ux = static_cast<uint32_t>(x);
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(ux, multiplier);
#else
    const uint32_t hi = static_cast<uint32_t>((uint64_t{ux} * multiplier) >> 32);
#endif
    return static_cast<int32_t>((hi + ux) >> shift);
  }
  JG_HOST_DEVICE_INLINE void DivMod(int32_t x, int32_t* quotient, int32_t* remainder) const {
    *quotient = Div(x);
    *remainder = x - *quotient * divisor;
  }
};

}  // namespace jaxgemm
