// One GEMM problem, as the handlers decode it and every kernel (CPU and GPU) reads it:
//   D[z] = alpha * op(A[z]) * op(B[z])   for every batch index z,
// with op(X) = X or X^T, all matrices dense row-major, 64-bit sizes.
// With split_k = S > 1, K is cut into S chunks and D holds S fp32 partial products per
// batch index, D[z][s] = alpha * op(A[z])[:, chunk s] * op(B[z])[chunk s, :]; the caller
// reduces them (deterministically) afterwards.
#pragma once
#include <cstdint>

#include "common/element_type.h"

#if defined(__CUDACC__)
#define JG_HOST_DEVICE __host__ __device__
#else
#define JG_HOST_DEVICE
#endif

namespace jaxgemm {

constexpr int kMaxBatchDims = 4;

// Batch dims broadcast like jnp.matmul: an operand's stride is 0 along a dim it lacks.
struct BatchLayout {
  int rank = 0;
  int64_t count = 1;
  int64_t dims[kMaxBatchDims] = {};
  int64_t stride_a[kMaxBatchDims] = {};
  int64_t stride_b[kMaxBatchDims] = {};

  // Element offsets of batch z (row-major over dims) into A and B.
  JG_HOST_DEVICE void Offsets(int64_t z, int64_t* off_a, int64_t* off_b) const {
    int64_t oa = 0, ob = 0;
    for (int d = rank - 1; d >= 0; --d) {
      int64_t i = z % dims[d];
      z /= dims[d];
      oa += i * stride_a[d];
      ob += i * stride_b[d];
    }
    *off_a = oa;
    *off_b = ob;
  }
};

struct GemmProblem {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  bool tf32 = false;  // float32 inputs may use tf32 tensor cores
  int64_t lda = 0, ldb = 0, ldd = 0;  // row pitch of the stored matrices, in elements
  BatchLayout batch;
  ElementType in_type = ElementType::kF32;
  ElementType out_type = ElementType::kF32;
  const void* a = nullptr;
  const void* b = nullptr;
  void* d = nullptr;
  float alpha = 1.f;
  int64_t split_k = 1;

  // K elements per split chunk: a multiple of 8 so every chunk starts vector-aligned.
  JG_HOST_DEVICE int64_t KChunk() const {
    const int64_t c = (k + split_k - 1) / split_k;
    return (c + 7) / 8 * 8;
  }
  // Element offsets of the start of chunk s in A and B.
  JG_HOST_DEVICE int64_t ChunkOffsetA(int64_t s) const { return s * KChunk() * (trans_a ? lda : 1); }
  JG_HOST_DEVICE int64_t ChunkOffsetB(int64_t s) const { return s * KChunk() * (trans_b ? 1 : ldb); }
  JG_HOST_DEVICE int64_t ChunkK(int64_t s) const {
    const int64_t left = k - s * KChunk();
    return left < 0 ? 0 : (left < KChunk() ? left : KChunk());
  }
};

}  // namespace jaxgemm
