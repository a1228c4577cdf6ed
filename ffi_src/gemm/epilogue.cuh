// The GEMM epilogue on the GPU for row pieces: every mainloop but the sm90 TMA-store and
// grouped ones hands it fp32 accumulators, kWidth (2 or 4) consecutive columns of one or
// more rows at a time, and it applies EpilogueParams (gemm/problem.h) with the shared
// steps (gemm/epilogue_steps.cuh), then stores the pieces as vectors where it can:
//   z = alpha * acc + beta * C + bias,  D = act(z) + residual,  Aux = z.
#pragma once
#include <type_traits>
#include <utility>

#include "common/activation.h"
#include "common/device_numeric.cuh"
#include "gemm/epilogue_steps.cuh"
#include "gemm/problem.h"

namespace jaxgemm {

// kScales: the kernel reads the row and column scales (fp8 inputs only; other kernels'
// epilogues compile without them).
template <class TOut, bool kScales = false>
struct GemmEpilogue {
  // Where batch index z's slabs start in each epilogue operand.
  struct Offsets {
    int64_t out;
    int64_t operand[kEpilogueOperands];
  };

  __device__ __forceinline__ static Offsets ForBatch(const GemmProblem& p, int64_t z) {
    Offsets off{z * p.m * p.n, {}};
#pragma unroll
    for (int o = 0; o < kEpilogueOperands; ++o) off.operand[o] = p.batch.Offset(z, BatchOperandOf(o));
    return off;
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

  // The steps' source (epilogue_steps.cuh) for kRows row pieces of kWidth columns from
  // `col`: row piece i is row row[i] of D, starts at element idx[i] of a matrix operand's
  // slab and has valid[i] columns inside D (0: a dead row). Every operand is read by its
  // shape (kEpilogueOperandRows), so an operand added to the table is read here as it is.
  template <int kRows, int kWidth>
  struct RowPieces : EpilogueSourceDefaults {
    const EpilogueParams& e;
    int64_t at[kEpilogueOperands];  // where each operand's values for these pieces start
    int64_t out_at;                 // D's and Aux's slab
    int64_t row[kRows], idx[kRows];
    int valid[kRows];
    int cols;        // columns of the pieces inside D
    bool vector_ok;  // Write's

    __device__ __forceinline__ RowPieces(const EpilogueParams& params, const Offsets& off, int64_t col)
        : e(params), out_at(off.out) {
      Start(off, col, std::make_index_sequence<kEpilogueOperands>());
    }
    // at[o]: operand o's batch offset, plus `col` for a column operand (at its first column).
    template <size_t... kOperand>
    __device__ __forceinline__ void Start(const Offsets& off, int64_t col, std::index_sequence<kOperand...>) {
      ((at[kOperand] = off.operand[kOperand] + (kEpilogueOperandIsColumns<kOperand> ? col : 0)), ...);
    }
    __device__ __forceinline__ bool Has(int o) const {
      if constexpr (!kScales) {
        if (o == kEpilogueRowScale || o == kEpilogueColScale) return false;
      }
      return e.operand[o] != nullptr;
    }
    // Operand kOperand's value for value j of row piece i, of the operand's type. A row or
    // column operand reads only inside D (a dead row's index, or a column past N, may lie
    // past its end); C and the residual are read under the steps' Inside guard.
    template <int kOperand>
    __device__ __forceinline__ float Value(int i, int j) const {
      using T = std::conditional_t<kEpilogueOperandRows[kOperand].type == OperandType::kFloat32, float, TOut>;
      const T* x = static_cast<const T*>(e.operand[kOperand]);
      constexpr OperandShape kShape = kEpilogueOperandRows[kOperand].shape;
      if constexpr (kShape == OperandShape::kMatrix) return ToFloat(x[at[kOperand] + idx[i] + j]);
      // (a column operand's `at` is at `col`)
      if constexpr (kShape == OperandShape::kColumns) return j < cols ? ToFloat(x[at[kOperand] + j]) : 0.f;
      if constexpr (kShape == OperandShape::kRows) return valid[i] > 0 ? ToFloat(x[at[kOperand] + row[i]]) : 0.f;
    }
    __device__ __forceinline__ bool Inside(int i, int j) const { return j < valid[i]; }
    __device__ __forceinline__ float2 Bias(int u) const {
      const TOut* b = static_cast<const TOut*>(e.operand[kEpilogueBias]) + at[kEpilogueBias] + 2 * u;
      return make_float2(2 * u < cols ? ToFloat(b[0]) : 0.f, 2 * u + 1 < cols ? ToFloat(b[1]) : 0.f);
    }
    __device__ __forceinline__ bool HasAux() const { return e.aux != nullptr; }
    __device__ __forceinline__ void StoreAux(const float (&v)[kRows][kWidth]) const {
#pragma unroll
      for (int i = 0; i < kRows; ++i) Write(static_cast<TOut*>(e.aux) + out_at + idx[i], v[i], valid[i], vector_ok);
    }
  };

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
    RowPieces<kRows, kWidth> source(e, off, col);
    source.cols = n - col < kWidth ? static_cast<int>(n - col) : kWidth;
    source.vector_ok = vector_ok;
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      source.valid[i] = live[i] ? source.cols : 0;
      source.row[i] = row[i];
      source.idx[i] = row[i] * p.ldd + col;
    }
    ApplyEpilogue<TOut>({e.alpha, e.beta, e.activation}, source, v);
    TOut* d = static_cast<TOut*>(p.d) + off.out;
#pragma unroll
    for (int i = 0; i < kRows; ++i) Write(d + source.idx[i], v[i], source.valid[i], vector_ok);
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
