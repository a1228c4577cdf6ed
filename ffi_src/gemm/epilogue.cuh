// Epilogue functors: turn fp32 accumulators into output elements. Every mainloop calls
// one through the same interface: Params built on the host, Apply(params, acc) per element.
#pragma once
#include "common/device_numeric.cuh"

namespace jaxgemm {

// D = alpha * accumulator, converted to the output type.
template <class TOut>
struct LinearCombination {
  struct Params {
    float alpha = 1.f;
  };
  __device__ __forceinline__ static TOut Apply(const Params& params, float acc) {
    return FromFloat<TOut>(params.alpha * acc);
  }
};

}  // namespace jaxgemm
