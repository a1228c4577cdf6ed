// The fp8 GEMM's input type (its TIn) where A's and B's formats differ: a 1-byte tag naming
// both, since the kernel only moves bytes and the wgmma alone reads the formats. Where both
// are e4m3 TIn is __nv_fp8_e4m3 itself.
#pragma once
#include <cuda_fp8.h>

#include <cstdint>

namespace jaxgemm {

template <class TA, class TB>
struct Fp8Operands {
  uint8_t bits;
};
using Fp8E5m2E4m3 = Fp8Operands<__nv_fp8_e5m2, __nv_fp8_e4m3>;  // a gradient times a weight (dx)
using Fp8E4m3E5m2 = Fp8Operands<__nv_fp8_e4m3, __nv_fp8_e5m2>;  // an input times a gradient (dw)

}  // namespace jaxgemm
