// Activations and their derivatives, shared by the CPU reference and the CUDA kernels.
#pragma once
#include <cmath>

#include "common/host_device.h"

namespace jaxgemm {

// Ids are part of the FFI contract; Python reads them with their names from kActivationNames
// (the nanobind module's activation_ids).
enum class Activation : int { kNone = 0, kRelu = 1, kGelu = 2, kGeluExact = 3, kSilu = 4, kSigmoid = 5, kTanh = 6 };

struct ActivationName {
  Activation id;
  const char* name;
};
inline constexpr ActivationName kActivationNames[] = {
    {Activation::kRelu, "relu"}, {Activation::kGelu, "gelu"},       {Activation::kGeluExact, "gelu_exact"},
    {Activation::kSilu, "silu"}, {Activation::kSigmoid, "sigmoid"}, {Activation::kTanh, "tanh"},
};

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;
constexpr float kGeluCubic = 0.044715f;

// max(z, 0) as jax.nn.relu (jnp.maximum) gives it: NaN stays NaN (`z > 0.f ? z : 0.f` would
// give 0) and -0 gives +0. Shared by the CPU reference and the device epilogues.
JG_HOST_DEVICE_INLINE float Relu(float z) { return z <= 0.f ? 0.f : z; }

JG_HOST_DEVICE_INLINE float Sigmoid(float z) { return 1.f / (1.f + expf(-z)); }

JG_HOST_DEVICE_INLINE float ApplyActivation(Activation act, float z) {
  switch (act) {
    case Activation::kNone: return z;
    case Activation::kRelu: return Relu(z);
    case Activation::kGelu: return 0.5f * z * (1.f + tanhf(kSqrt2OverPi * (z + kGeluCubic * z * z * z)));
    case Activation::kGeluExact: return 0.5f * z * (1.f + erff(z * kInvSqrt2));
    case Activation::kSilu: return z * Sigmoid(z);
    case Activation::kSigmoid: return Sigmoid(z);
    case Activation::kTanh: return tanhf(z);
  }
  return z;
}

// d act(z) / dz with the given tanh and sigmoid (the device's hardware approximations can
// stand in for the exact ones); at z = 0 (and NaN) relu's is 0, as in jax.nn.relu.
template <class Tanh, class Sigm>
JG_HOST_DEVICE_INLINE float ActivationGradWith(Activation act, float z, Tanh tanh_fn, Sigm sigmoid_fn) {
  switch (act) {
    case Activation::kNone: return 1.f;
    case Activation::kRelu: return z > 0.f ? 1.f : 0.f;
    case Activation::kGelu: {
      const float t = tanh_fn(kSqrt2OverPi * (z + kGeluCubic * z * z * z));
      return 0.5f * (1.f + t) + 0.5f * z * (1.f - t * t) * kSqrt2OverPi * (1.f + 3.f * kGeluCubic * z * z);
    }
    case Activation::kGeluExact:
      return 0.5f * (1.f + erff(z * kInvSqrt2)) + z * kInvSqrt2Pi * expf(-0.5f * z * z);
    case Activation::kSilu: {
      const float s = sigmoid_fn(z);
      return s * (1.f + z * (1.f - s));
    }
    case Activation::kSigmoid: {
      const float s = sigmoid_fn(z);
      return s * (1.f - s);
    }
    case Activation::kTanh: {
      const float t = tanh_fn(z);
      return 1.f - t * t;
    }
  }
  return 1.f;
}

JG_HOST_DEVICE_INLINE float ActivationGrad(Activation act, float z) {
  return ActivationGradWith(act, z, [](float x) { return tanhf(x); }, [](float x) { return Sigmoid(x); });
}

inline bool IsActivation(int id) { return id >= 0 && id <= static_cast<int>(Activation::kTanh); }

}  // namespace jaxgemm
