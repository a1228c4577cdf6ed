// Host side of kernels that apply an activation (or its derivative) to every value: one
// kernel instance per activation, chosen at launch, so that the activation folds into
// straight-line code. As a runtime switch per value, unrolled over a thread's values, it
// made the blockwise fp8 quantization kernel 8,624 instructions with 483 branches, past the
// instruction cache (its gradient form ran at ~1 TB/s).
#pragma once
#include <type_traits>

#include "common/activation.h"

namespace jaxgemm {

template <Activation kAct>
using ActivationConstant = std::integral_constant<Activation, kAct>;

// f(ActivationConstant<act>{}); ids outside the enum (which the decoders refuse:
// IsActivation) as kNone.
template <class F>
decltype(auto) WithActivation(Activation act, F f) {
  using A = Activation;
  switch (act) {
    case A::kRelu: return f(ActivationConstant<A::kRelu>{});
    case A::kGelu: return f(ActivationConstant<A::kGelu>{});
    case A::kGeluExact: return f(ActivationConstant<A::kGeluExact>{});
    case A::kSilu: return f(ActivationConstant<A::kSilu>{});
    case A::kSigmoid: return f(ActivationConstant<A::kSigmoid>{});
    case A::kTanh: return f(ActivationConstant<A::kTanh>{});
    case A::kNone: break;
  }
  return f(ActivationConstant<A::kNone>{});
}

}  // namespace jaxgemm
