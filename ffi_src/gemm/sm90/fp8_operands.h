// The fp8 GEMM's input type (its TIn) where A's and B's formats differ: a 1-byte tag naming
// both, since the kernel only moves bytes and the wgmma alone reads the formats. Where both
// are e4m3 TIn is __nv_fp8_e4m3 itself.
#pragma once
#include <cuda_fp8.h>

#include <cstdint>

#include "common/element_type.h"

namespace jaxgemm {

template <class TA, class TB>
struct Fp8Operands {
  uint8_t bits;
};
using Fp8E5m2E4m3 = Fp8Operands<__nv_fp8_e5m2, __nv_fp8_e4m3>;  // a gradient times a weight (dx)
using Fp8E4m3E5m2 = Fp8Operands<__nv_fp8_e4m3, __nv_fp8_e5m2>;  // an input times a gradient (dw)

// f(TIn{}) for a problem's fp8 pair (A's format in_type; other_b_fp8: B holds the other
// one): e4m3 x e4m3, or e5m2 beside e4m3 in either operand. The one place that maps the
// formats onto TIn, for the launchers of both fp8 kernels.
template <class F>
auto WithFp8Operands(ElementType in_type, bool other_b_fp8, F&& f) {
  if (!other_b_fp8) return f(__nv_fp8_e4m3{});
  return in_type == ElementType::kF8E5M2 ? f(Fp8E5m2E4m3{}) : f(Fp8E4m3E5m2{});
}

}  // namespace jaxgemm
