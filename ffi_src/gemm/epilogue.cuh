// The GEMM epilogue on the GPU: every mainloop hands it fp32 accumulators, kWidth (2 or 4)
// consecutive columns of one row at a time, and it applies EpilogueParams (gemm/problem.h):
//   z = alpha * acc + beta * C + bias,  D = act(z) + residual,  Aux = z.
#pragma once
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

template <class TOut>
struct GemmEpilogue {
  // Where batch index z's slabs start in each epilogue operand.
  struct Offsets {
    int64_t out, c, bias, residual;
  };

  __device__ __forceinline__ static Offsets ForBatch(const GemmProblem& p, int64_t z) {
    return {z * p.m * p.n, p.batch.Offset(z, kOperandC), p.batch.Offset(z, kOperandBias),
            p.batch.Offset(z, kOperandResidual)};
  }

  // Columns [col, col + kWidth) of `row`, those < N; one vector store when `vector_ok`
  // (the output's row pitch and base allow kWidth-element vectors).
  template <int kWidth>
  __device__ __forceinline__ static void Store(const GemmProblem& p, const Offsets& off, int64_t row, int64_t col,
                                               const float (&acc)[kWidth], bool vector_ok) {
    const int64_t rows[1] = {row};
    const bool live[1] = {true};
    float v[1][kWidth];
#pragma unroll
    for (int j = 0; j < kWidth; ++j) v[0][j] = acc[j];
    StoreRows(p, off, rows, live, col, v, vector_ok);
  }

  // The same columns of kRows rows at once: their loads and arithmetic are independent, so
  // a thread keeps several in flight (the epilogue runs with few warps per scheduler), and
  // the activation's switch is taken once for all kRows * kWidth values. Rows whose `live`
  // is false are skipped (rows index the output, which for convolutions is not always the
  // GEMM's M). `v` holds the accumulators on entry.
  template <int kRows, int kWidth>
  __device__ __forceinline__ static void StoreRows(const GemmProblem& p, const Offsets& off, const int64_t (&row)[kRows],
                                                   const bool (&live)[kRows], int64_t col, float (&v)[kRows][kWidth],
                                                   bool vector_ok) {
    const EpilogueParams& e = p.epilogue;
    const int64_t n = p.transposed_d ? p.m : p.n;  // D's columns
    const int cols = n - col < kWidth ? static_cast<int>(n - col) : kWidth;
    int valid[kRows];
    int64_t idx[kRows];
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      valid[i] = live[i] ? cols : 0;
      idx[i] = row[i] * p.ldd + col;
#pragma unroll
      for (int j = 0; j < kWidth; ++j) v[i][j] *= e.alpha;
    }
    if (e.c) {
      const TOut* c = static_cast<const TOut*>(e.c) + off.c;
#pragma unroll
      for (int i = 0; i < kRows; ++i)
#pragma unroll
        for (int j = 0; j < kWidth; ++j)
          if (j < valid[i]) v[i][j] += e.beta * ToFloat(c[idx[i] + j]);
    }
    if (e.bias) {
      const TOut* bias = static_cast<const TOut*>(e.bias) + off.bias + col;
#pragma unroll
      for (int j = 0; j < kWidth; ++j) {
        const float b = j < cols ? ToFloat(bias[j]) : 0.f;
#pragma unroll
        for (int i = 0; i < kRows; ++i) v[i][j] += b;
      }
    }
    if (e.aux) {
#pragma unroll
      for (int i = 0; i < kRows; ++i) Write(static_cast<TOut*>(e.aux) + off.out + idx[i], v[i], valid[i], vector_ok);
    }
    ActivateAll<sizeof(TOut) == 2>(e.activation, v);
    if (e.residual) {
      const TOut* residual = static_cast<const TOut*>(e.residual) + off.residual;
#pragma unroll
      for (int i = 0; i < kRows; ++i)
#pragma unroll
        for (int j = 0; j < kWidth; ++j)
          if (j < valid[i]) v[i][j] += ToFloat(residual[idx[i] + j]);
    }
#pragma unroll
    for (int i = 0; i < kRows; ++i) Write(static_cast<TOut*>(p.d) + off.out + idx[i], v[i], valid[i], vector_ok);
  }

  template <int kWidth>
  __device__ __forceinline__ static void Write(TOut* out, const float (&v)[kWidth], int valid, bool vector_ok) {
    if (vector_ok && valid == kWidth) {
      Vec<TOut, kWidth> x;
#pragma unroll
      for (int j = 0; j < kWidth; ++j) x.v[j] = FromFloat<TOut>(v[j]);
      *reinterpret_cast<Vec<TOut, kWidth>*>(out) = x;
    } else {
#pragma unroll
      for (int j = 0; j < kWidth; ++j) {
        if (j < valid) out[j] = FromFloat<TOut>(v[j]);
      }
    }
  }
};

}  // namespace jaxgemm
