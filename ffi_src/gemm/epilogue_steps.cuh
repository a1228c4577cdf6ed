// The element-wise epilogue of every GPU kernel, one definition (the CPU reference's
// counterpart is gemm/cpu_epilogue.cc, with the same steps in the same order):
//   z = alpha * (acc * row_scale * col_scale) + beta * C  [rounded to the output type]  + bias,   Aux = z,
//   y = act(z)  [* z_up, the gated form]  + residual.
// A kernel applies the steps to a block of its values, v[kRows][kWidth] (kWidth even:
// values (i, 2 u) and (i, 2 u + 1) are column pair u of row piece i, the layout of every
// mainloop's fragments), and passes a source that says where the block's operands are;
// how the block is stored afterwards (vectors, TMA boxes, grouped rows) is the kernel's
// own. The steps, in order: EpilogueLinear (EpilogueScales first), EpilogueAux, EpilogueActivation,
// [EpilogueGate], EpilogueResidual; ApplyEpilogue runs them for one product (a kernel that
// must wait for a box between two steps calls them one by one). A source derives from
// EpilogueSourceDefaults (every operand absent) and provides those it takes:
//   kRoundProduct                  round alpha * acc + beta * C before the bias (the
//                                  grouped kernel's; its CPU reference does the same)
//   kSkipUnitAlpha                 branch around alpha's multiply when alpha is 1 (the
//                                  fused TMA store's; where registers are short, as in
//                                  the general epilogue of the 128-register kernels, the
//                                  branch cost a spill and the plain multiply did not)
//   Has(o)                         operand o of gemm/problem.h's table is present
//   Value<o>(i, j)                 its value for value (i, j) of the block (C, the residual
//                                  and the scales, as float; the general epilogue reads any
//                                  by its shape and type)
//   Inside(i, j)                   value (i, j) lies inside the output (C and the residual
//                                  are read there only)
//   Bias(u)                        the bias of column pair u, as a float2 (one load a pair)
//   HasAux(), StoreAux(v)          stores the block's z
// Values outside the output may hold anything: they are never stored. (Per-value C and
// residual reads with the Inside guard compile to the same registers and spills as the
// general epilogue written out; pairs read through a zero-select did not.)
// Adding an operand (as the per-row scale was) is a row of gemm/problem.h's table, a step here
// that reads it through Has / Value, and the matching step in cpu_epilogue.cc
// (docs/kernels.md, section 5.6).
#pragma once
#include <cuda_runtime.h>

#include "common/activation.h"
#include "common/device_numeric.cuh"
#include "gemm/problem.h"

namespace jaxgemm {

// Hardware approximations (MUFU); the host build of this header (the loader emulation in
// tools/) gets the exact functions. Both keep NaN, as jax.nn does (tanh.approx, ex2.approx
// and div.approx of NaN are NaN), and give jax.nn's limits at +-inf.
__device__ __forceinline__ float TanhApprox(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return tanhf(x);
#endif
}

__device__ __forceinline__ float SigmoidApprox(float z) {
#if defined(__CUDA_ARCH__)
  return __fdividef(1.f, 1.f + __expf(-z));
#else
  return Sigmoid(z);
#endif
}

// act applied to every value, with the switch outside the loops. kApprox (16-bit outputs):
// hardware tanh and exp approximations, whose relative error (~5e-4, tanh) is below the
// output's own rounding; float32 outputs get the exact functions.
template <bool kApprox, int kRows, int kWidth>
__device__ __forceinline__ void ActivateAll(Activation act, float (&v)[kRows][kWidth]) {
  auto each = [&](auto f) {
#pragma unroll
    for (int i = 0; i < kRows; ++i)
#pragma unroll
      for (int j = 0; j < kWidth; ++j) v[i][j] = f(v[i][j]);
  };
  auto sigmoid = [](float z) { return kApprox ? SigmoidApprox(z) : Sigmoid(z); };
  auto tanh = [](float z) { return kApprox ? TanhApprox(z) : tanhf(z); };
  switch (act) {
    case Activation::kNone: break;
    case Activation::kRelu: each([](float z) { return Relu(z); }); break;
    case Activation::kGelu:
      if constexpr (kApprox) {
        // The same function in 5 arithmetic instructions instead of 7 (the epilogue's gelu is
        // MUFU- and issue-bound): u = z (k + k c z^2), y = z / 2 + (z / 2) tanh(u).
        each([](float z) {
          const float half = 0.5f * z;
          return fmaf(half, TanhApprox(z * fmaf(kSqrt2OverPi * kGeluCubic, z * z, kSqrt2OverPi)), half);
        });
      } else {
        each([&](float z) { return 0.5f * z * (1.f + tanh(kSqrt2OverPi * (z + kGeluCubic * z * z * z))); });
      }
      break;
    case Activation::kGeluExact: each([](float z) { return ApplyActivation(Activation::kGeluExact, z); }); break;
    case Activation::kSilu: each([&](float z) { return z * sigmoid(z); }); break;
    case Activation::kSigmoid: each(sigmoid); break;
    case Activation::kTanh: each(tanh); break;
  }
}

// What a source that lacks an operand says of it: derive from this and define only the
// operands the kernel takes (the steps of an absent one compile away).
struct EpilogueSourceDefaults {
  static constexpr bool kRoundProduct = false;
  static constexpr bool kSkipUnitAlpha = false;
  __device__ __forceinline__ static constexpr bool Has(int) { return false; }
  template <int kOperand>
  __device__ __forceinline__ static constexpr float Value(int, int) { return 0.f; }
  __device__ __forceinline__ static constexpr bool Inside(int, int) { return true; }
  __device__ __forceinline__ static float2 Bias(int) { return make_float2(0.f, 0.f); }
  __device__ __forceinline__ static constexpr bool HasAux() { return false; }
  template <class V>
  __device__ __forceinline__ static void StoreAux(const V&) {}
};

// The scalars of the steps; the operands come from the kernel's source.
struct EpilogueScalars {
  float alpha = 1.f, beta = 0.f;
  Activation activation = Activation::kNone;
};

// f(i, j) for every value of the block.
template <int kRows, int kWidth, class F>
__device__ __forceinline__ void ForEachValue(F f) {
#pragma unroll
  for (int i = 0; i < kRows; ++i)
#pragma unroll
    for (int j = 0; j < kWidth; ++j) f(i, j);
}

// The scales of the product: v *= row scale, then *= column scale (fp8 products'; before
// alpha, as on the CPU).
template <class Source, int kRows, int kWidth>
__device__ __forceinline__ void EpilogueScales(const Source& source, float (&v)[kRows][kWidth]) {
  if (source.Has(kEpilogueRowScale)) {
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const float r = source.template Value<kEpilogueRowScale>(i, 0);
#pragma unroll
      for (int j = 0; j < kWidth; ++j) v[i][j] *= r;
    }
  }
  if (source.Has(kEpilogueColScale)) {
#pragma unroll
    for (int j = 0; j < kWidth; ++j) {
      const float c = source.template Value<kEpilogueColScale>(0, j);
#pragma unroll
      for (int i = 0; i < kRows; ++i) v[i][j] *= c;
    }
  }
}

// z = alpha * (acc * row scale * column scale) + beta * C (rounded where the source asks)
// + bias, on one product's values. `product` false: the values belong to no product (a
// grouped kernel's rows past its groups): z = 0.
template <class TOut, class Source, int kRows, int kWidth>
__device__ __forceinline__ void EpilogueLinear(const EpilogueScalars& s, const Source& source,
                                               float (&v)[kRows][kWidth], bool product = true) {
  if (!product) {
    ForEachValue<kRows, kWidth>([&](int i, int j) { v[i][j] = 0.f; });
    return;
  }
  EpilogueScales(source, v);
  if constexpr (Source::kSkipUnitAlpha) {
    if (s.alpha != 1.f) {  // 1 x acc is acc
      ForEachValue<kRows, kWidth>([&](int i, int j) { v[i][j] = __fmul_rn(v[i][j], s.alpha); });
    }
  } else {
    ForEachValue<kRows, kWidth>([&](int i, int j) { v[i][j] *= s.alpha; });
  }
  if (source.Has(kEpilogueC)) {
    ForEachValue<kRows, kWidth>([&](int i, int j) {
      if (source.Inside(i, j)) v[i][j] += s.beta * source.template Value<kEpilogueC>(i, j);
    });
  }
  if constexpr (Source::kRoundProduct) {
    ForEachValue<kRows, kWidth>([&](int i, int j) { v[i][j] = ToFloat(FromFloat<TOut>(v[i][j])); });
  }
  if (source.Has(kEpilogueBias)) {
#pragma unroll
    for (int u = 0; u < kWidth / 2; ++u) {
      const float2 b = source.Bias(u);
#pragma unroll
      for (int i = 0; i < kRows; ++i) v[i][2 * u] += b.x, v[i][2 * u + 1] += b.y;
    }
  }
}

// Aux = z.
template <class Source, int kRows, int kWidth>
__device__ __forceinline__ void EpilogueAux(const Source& source, const float (&v)[kRows][kWidth]) {
  if (source.HasAux()) source.StoreAux(v);
}

// y = act(z) (16-bit outputs: the hardware approximations); values of no product stay 0.
template <class TOut, int kRows, int kWidth>
__device__ __forceinline__ void EpilogueActivation(const EpilogueScalars& s, float (&v)[kRows][kWidth],
                                                   bool product = true) {
  if (product) ActivateAll<sizeof(TOut) == 2>(s.activation, v);
}

// y += residual.
template <class Source, int kRows, int kWidth>
__device__ __forceinline__ void EpilogueResidual(const Source& source, float (&v)[kRows][kWidth]) {
  if (source.Has(kEpilogueResidual)) {
    ForEachValue<kRows, kWidth>([&](int i, int j) {
      if (source.Inside(i, j)) v[i][j] += source.template Value<kEpilogueResidual>(i, j);
    });
  }
}

// Every step, on the values of one product: v holds the accumulators on entry and y on
// exit; the kernel stores y.
template <class TOut, class Source, int kRows, int kWidth>
__device__ __forceinline__ void ApplyEpilogue(const EpilogueScalars& s, const Source& source,
                                              float (&v)[kRows][kWidth], bool product = true) {
  EpilogueLinear<TOut>(s, source, v, product);
  EpilogueAux(source, v);
  EpilogueActivation<TOut>(s, v, product);
  EpilogueResidual(source, v);
}

// The gated form's: y = act(z_gate) * z_up (each z through EpilogueLinear and
// EpilogueAux, the gate's then through EpilogueActivation).
template <int kRows, int kWidth>
__device__ __forceinline__ void EpilogueGate(float (&gate)[kRows][kWidth], const float (&up)[kRows][kWidth]) {
  ForEachValue<kRows, kWidth>([&](int i, int j) { gate[i][j] *= up[i][j]; });
}

}  // namespace jaxgemm
