// One GEMM problem, as the handlers decode it and every kernel (CPU and GPU) reads it:
//   z = alpha * r[i] * s[j] * (op(A) op(B))[i, j] + beta * C + bias,  D = act(z) + residual,  Aux = z
// for every batch index, with op(X) = X or X^T, all matrices dense row-major, 64-bit sizes.
// C, bias, residual, the row scales r (M, float32), the column scales s (N, float32) and
// Aux are optional (null; an absent scale is 1); bias has length N (one per column).
// With split_k = S > 1, K is cut into S chunks and D holds S fp32 partial products per
// batch index, D[b][s] = alpha * op(A)[:, chunk s] op(B)[chunk s, :], with no epilogue
// operands; the caller reduces them (deterministically) and applies the epilogue.
#pragma once
#include <cstdint>

#include "common/activation.h"
#include "common/element_type.h"
#include "common/host_device.h"

namespace jaxgemm {

constexpr int kMaxBatchDims = 4;

// The epilogue's operands, one row each: the FFI call passes them after a and b in this
// order (an empty buffer: absent), Python reads the rows (the nanobind module's
// epilogue_operands), the decoder checks each against its shape, and the kernels find each
// one's pointer in EpilogueParams::operand. Adding one is a row here, its step in
// gemm/epilogue_steps.cuh and gemm/cpu_epilogue.cc, and its keyword in Python
// (docs/kernels.md, section 5.6). The scales (fp8 products' per-row and per-column scales,
// applied to the product before C and the bias) are float32, the others of the output's dtype.
enum EpilogueOperand : int {
  kEpilogueC = 0,
  kEpilogueBias,
  kEpilogueResidual,
  kEpilogueRowScale,
  kEpilogueColScale,
  kEpilogueOperands
};
enum class OperandShape : int {
  kMatrix,   // (*batch, m, n), laid out as D
  kColumns,  // (*batch, n): one value per column
  kRows,     // (*batch, m): one value per row
};
enum class OperandType : int { kOutput, kFloat32 };  // the output's dtype, or float32
struct EpilogueOperandRow {
  EpilogueOperand id;
  const char* name;
  OperandShape shape;
  OperandType type;
};
inline constexpr EpilogueOperandRow kEpilogueOperandRows[kEpilogueOperands] = {
    {kEpilogueC, "c", OperandShape::kMatrix, OperandType::kOutput},
    {kEpilogueBias, "bias", OperandShape::kColumns, OperandType::kOutput},
    {kEpilogueResidual, "residual", OperandShape::kMatrix, OperandType::kOutput},
    {kEpilogueRowScale, "row_scale", OperandShape::kRows, OperandType::kFloat32},
    {kEpilogueColScale, "col_scale", OperandShape::kColumns, OperandType::kFloat32},
};

// Operand o's element type for output type `out`.
inline constexpr ElementType EpilogueOperandType(int o, ElementType out) {
  return kEpilogueOperandRows[o].type == OperandType::kFloat32 ? ElementType::kF32 : out;
}

// Whether operand o has one value per column (a compile-time constant, usable in device code).
template <int o>
inline constexpr bool kEpilogueOperandIsColumns = kEpilogueOperandRows[o].shape == OperandShape::kColumns;

// The operands that carry batch dims, in BatchLayout::stride order: A, B, then the
// epilogue's (BatchOperandOf). D and Aux are dense with the output's batch dims.
enum BatchOperand : int { kOperandA = 0, kOperandB };
constexpr int kBatchOperands = 2 + kEpilogueOperands;
JG_HOST_DEVICE constexpr int BatchOperandOf(int epilogue_operand) { return 2 + epilogue_operand; }

// Batch dims broadcast like jnp.matmul: an operand's stride is 0 along a dim it lacks.
struct BatchLayout {
  int rank = 0;
  int64_t count = 1;
  int64_t dims[kMaxBatchDims] = {};
  int64_t stride[kBatchOperands][kMaxBatchDims] = {};

  // Element offset of batch index z (row-major over dims) into `operand`.
  JG_HOST_DEVICE int64_t Offset(int64_t z, int operand) const {
    int64_t off = 0;
    for (int d = rank - 1; d >= 0; --d) {
      off += (z % dims[d]) * stride[operand][d];
      z /= dims[d];
    }
    return off;
  }
};

// What the epilogue adds to alpha * op(A) op(B); all pointers have the output's dtype, and
// a null one is an absent operand.
struct EpilogueParams {
  float alpha = 1.f;
  float beta = 0.f;
  Activation activation = Activation::kNone;
  const void* operand[kEpilogueOperands] = {};  // kEpilogueOperandRows' order
  void* aux = nullptr;

  JG_HOST_DEVICE const void* c() const { return operand[kEpilogueC]; }
  JG_HOST_DEVICE const void* bias() const { return operand[kEpilogueBias]; }
  JG_HOST_DEVICE const void* residual() const { return operand[kEpilogueResidual]; }
  JG_HOST_DEVICE const float* row_scale() const { return static_cast<const float*>(operand[kEpilogueRowScale]); }
  JG_HOST_DEVICE const float* col_scale() const { return static_cast<const float*>(operand[kEpilogueColScale]); }
  bool IsIdentity() const {
    bool none = beta == 0.f && activation == Activation::kNone && !aux;
    for (const void* x : operand) none = none && x == nullptr;
    return none;
  }
};

struct GemmProblem {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  bool tf32 = false;  // float32 inputs may use tf32 tensor cores
  int64_t lda = 0, ldb = 0, ldd = 0;  // row pitch of the stored matrices, in elements
  BatchLayout batch;
  ElementType in_type = ElementType::kF32;  // A's (and B's, unless other_b_fp8)
  ElementType out_type = ElementType::kF32;
  // B in the other float8 format than A's: e5m2 x e4m3 or e4m3 x e5m2 (a gradient beside a
  // weight or an input; DecodeGemm refuses e5m2 x e5m2).
  bool other_b_fp8 = false;
  const void* a = nullptr;
  const void* b = nullptr;
  void* d = nullptr;
  EpilogueParams epilogue;
  int64_t split_k = 1;
  // D holds the product transposed: element (i, j) of op(A) op(B) at D's row j, column i
  // (ldd is D's pitch, >= m; C, bias, residual and Aux are laid out as D). Set by
  // Sm90Swapped only (the sm90 kernel's tf32 plain TMA-store epilogue and its swapped
  // tiles' general epilogue); the decoded call always has it false.
  bool transposed_d = false;

  ElementType BType() const {
    if (!other_b_fp8) return in_type;
    return in_type == ElementType::kF8E4M3 ? ElementType::kF8E5M2 : ElementType::kF8E4M3;
  }

  // K elements per split chunk: a multiple of 64, so every chunk starts vector-aligned and
  // whole k-tiles of every kernel (up to 64 deep) stay inside their chunk.
  JG_HOST_DEVICE int64_t KChunk() const {
    const int64_t c = (k + split_k - 1) / split_k;
    return (c + 63) / 64 * 64;
  }
  // Element offsets of the start of chunk s in A and B.
  JG_HOST_DEVICE int64_t ChunkOffsetA(int64_t s) const { return s * KChunk() * (trans_a ? lda : 1); }
  JG_HOST_DEVICE int64_t ChunkOffsetB(int64_t s) const { return s * KChunk() * (trans_b ? 1 : ldb); }
  JG_HOST_DEVICE int64_t ChunkK(int64_t s) const { return ChunkK(s, KChunk()); }
  // The same with KChunk() given (computed once, on the host).
  JG_HOST_DEVICE int64_t ChunkK(int64_t s, int64_t chunk) const {
    const int64_t left = k - s * chunk;
    return left < 0 ? 0 : (left < chunk ? left : chunk);
  }
};

}  // namespace jaxgemm
