// The GEMM epilogue on the GPU: every mainloop hands it fp32 accumulators, 4 consecutive
// columns of one row at a time, and it applies EpilogueParams (gemm/problem.h):
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

  // Columns [col, col + 4) of `row`, those < N; one vector store when `vector_ok`.
  __device__ __forceinline__ static void Store(const GemmProblem& p, const Offsets& off, int64_t row, int64_t col,
                                               float4 acc, bool vector_ok) {
    const EpilogueParams& e = p.epilogue;
    const int valid = p.n - col < 4 ? static_cast<int>(p.n - col) : 4;
    const int64_t idx = row * p.ldd + col;
    float v[4] = {acc.x, acc.y, acc.z, acc.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      v[j] *= e.alpha;
      if (j < valid) {
        if (e.c) v[j] += e.beta * ToFloat(static_cast<const TOut*>(e.c)[off.c + idx + j]);
        if (e.bias) v[j] += ToFloat(static_cast<const TOut*>(e.bias)[off.bias + col + j]);
      }
    }
    if (e.aux) Write(static_cast<TOut*>(e.aux) + off.out + idx, v, valid, vector_ok);
    if (e.activation != Activation::kNone) {
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = ApplyActivation(e.activation, v[j]);
    }
    if (e.residual) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (j < valid) v[j] += ToFloat(static_cast<const TOut*>(e.residual)[off.residual + idx + j]);
      }
    }
    Write(static_cast<TOut*>(p.d) + off.out + idx, v, valid, vector_ok);
  }

  __device__ __forceinline__ static void Write(TOut* out, const float (&v)[4], int valid, bool vector_ok) {
    if (vector_ok && valid == 4) {
      Vec4<TOut> x;
#pragma unroll
      for (int j = 0; j < 4; ++j) x.v[j] = FromFloat<TOut>(v[j]);
      *reinterpret_cast<Vec4<TOut>*>(out) = x;
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (j < valid) out[j] = FromFloat<TOut>(v[j]);
      }
    }
  }
};

}  // namespace jaxgemm
