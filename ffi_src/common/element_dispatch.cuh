// The device types behind the ElementType pairs the kernels are built for, in one place:
// a launch site writes its call once, for TIn and TOut, instead of a ladder of pairs.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "common/element_type.h"

namespace jaxgemm {

template <class T>
struct TypeTag {
  using type = T;
};

// f(TypeTag<TIn>{}, TypeTag<TOut>{}) for (in, out) among the pairs the kernels take:
// 16-bit inputs writing their own type or float32, float32 writing float32. Any other pair:
// cudaErrorInvalidValue, without calling f. (f sees every pair at compile time: a site
// built for fewer guards the others with `if constexpr`.)
template <class F>
cudaError_t WithElementTypes(ElementType in, ElementType out, F&& f) {
  using E = ElementType;
  if (in == E::kF32 && out == E::kF32) return f(TypeTag<float>{}, TypeTag<float>{});
  if (in == E::kF16 && out == E::kF16) return f(TypeTag<__half>{}, TypeTag<__half>{});
  if (in == E::kF16 && out == E::kF32) return f(TypeTag<__half>{}, TypeTag<float>{});
  if (in == E::kBF16 && out == E::kBF16) return f(TypeTag<__nv_bfloat16>{}, TypeTag<__nv_bfloat16>{});
  if (in == E::kBF16 && out == E::kF32) return f(TypeTag<__nv_bfloat16>{}, TypeTag<float>{});
  return cudaErrorInvalidValue;
}

// Whether (in, out) is such a pair.
inline bool KernelElementPair(ElementType in, ElementType out) {
  return out == ElementType::kF32 || out == in;
}

}  // namespace jaxgemm
