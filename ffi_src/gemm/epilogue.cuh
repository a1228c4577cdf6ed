// The GEMM epilogue on the GPU: every mainloop hands it fp32 accumulators, kWidth (2 or 4)
// consecutive columns of one row at a time, and it applies EpilogueParams (gemm/problem.h):
//   z = alpha * acc + beta * C + bias,  D = act(z) + residual,  Aux = z.
#pragma once
#include "common/activation.h"
#include "common/device_numeric.cuh"
#include "gemm/problem.h"

namespace jaxgemm {

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
    const EpilogueParams& e = p.epilogue;
    const int valid = p.n - col < kWidth ? static_cast<int>(p.n - col) : kWidth;
    const int64_t idx = row * p.ldd + col;
    float v[kWidth];
#pragma unroll
    for (int j = 0; j < kWidth; ++j) {
      v[j] = e.alpha * acc[j];
      if (j < valid) {
        if (e.c) v[j] += e.beta * ToFloat(static_cast<const TOut*>(e.c)[off.c + idx + j]);
        if (e.bias) v[j] += ToFloat(static_cast<const TOut*>(e.bias)[off.bias + col + j]);
      }
    }
    if (e.aux) Write(static_cast<TOut*>(e.aux) + off.out + idx, v, valid, vector_ok);
    if (e.activation != Activation::kNone) {
#pragma unroll
      for (int j = 0; j < kWidth; ++j) v[j] = ApplyActivation(e.activation, v[j]);
    }
    if (e.residual) {
#pragma unroll
      for (int j = 0; j < kWidth; ++j) {
        if (j < valid) v[j] += ToFloat(static_cast<const TOut*>(e.residual)[off.residual + idx + j]);
      }
    }
    Write(static_cast<TOut*>(p.d) + off.out + idx, v, valid, vector_ok);
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
