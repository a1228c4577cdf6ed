#include "gemm/sm90/tensor_map.h"

#include <cudaTypedefs.h>

#include <cstdint>

namespace jaxgemm {
namespace {

// A driver entry point by name (12.0 ABI), or null.
void* DriverFunction(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found;
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    return nullptr;
  }
  return fn;
}

PFN_cuTensorMapEncodeTiled_v12000 TensorMapEncoder() {
  static const auto encoder =
      reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(DriverFunction("cuTensorMapEncodeTiled"));
  return encoder;
}

PFN_cuTensorMapEncodeIm2col_v12000 Im2colMapEncoder() {
  static const auto encoder =
      reinterpret_cast<PFN_cuTensorMapEncodeIm2col_v12000>(DriverFunction("cuTensorMapEncodeIm2col"));
  return encoder;
}

CUtensorMapDataType TmaDataType(ElementType t, bool tf32) {
  switch (t) {
    case ElementType::kBF16: return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    case ElementType::kF16: return CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    case ElementType::kF8E4M3:
    case ElementType::kF8E5M2: return CU_TENSOR_MAP_DATA_TYPE_UINT8;  // (bytes: the wgmma reads their format)
    case ElementType::kF32: break;
  }
  // A tf32 operand: the TFLOAT32 type rounds each element to tf32 on the way to shared
  // memory (measured: the same error as cuBLAS's tf32, 2.9e-4 on random data); loaded as
  // FLOAT32 the tensor cores would truncate (7.8e-4).
  return tf32 ? CU_TENSOR_MAP_DATA_TYPE_TFLOAT32 : CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
}

}  // namespace

cudaError_t EncodeTmaMap(CUtensorMap* map, const TmaMatrix& m, int box_cols, int box_rows, bool swizzled) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = TensorMapEncoder();
  if (!encode) return cudaErrorNotSupported;
  const CUtensorMapDataType type = TmaDataType(m.type, m.tf32);
  const cuuint32_t rank = m.batch > 1 ? 3 : 2;
  const cuuint64_t dims[3] = {cuuint64_t(m.cols), cuuint64_t(m.rows), cuuint64_t(m.batch)};
  // Strides of dims 1.. in bytes (dim 0 is contiguous).
  const cuuint64_t bytes = ElementBytes(m.type);
  const cuuint64_t strides[2] = {cuuint64_t(m.ld) * bytes, cuuint64_t(m.batch_stride) * bytes};
  const cuuint32_t box[3] = {cuuint32_t(box_cols), cuuint32_t(box_rows), 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  // Rows that do not start on 128-byte lines: each box row straddles two lines, and
  // promoting its misses to 256 bytes fetched more than it saved (bf16 3000x5000x7000 and
  // 4104^3, 128 x 256 tiles: 0.61x of XLA with 256-byte promotion, 0.72x with 128; rows on
  // 128-byte lines ran the same with either).
  const bool rows_on_lines = strides[0] % 128 == 0 && reinterpret_cast<uintptr_t>(m.base) % 128 == 0;
  const CUtensorMapL2promotion promo =
      rows_on_lines ? CU_TENSOR_MAP_L2_PROMOTION_L2_256B : CU_TENSOR_MAP_L2_PROMOTION_L2_128B;
  const CUresult r = encode(map, type, rank, const_cast<void*>(m.base), dims, strides, box, element_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE,
                            swizzled ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE, promo,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t EncodeIm2colTmaMap(CUtensorMap* map, const TmaIm2col& t) {
  const PFN_cuTensorMapEncodeIm2col_v12000 encode = Im2colMapEncoder();
  if (!encode) return cudaErrorNotSupported;
  // Every array lists dims innermost first: (C, W, H, N); corners and offsets (W, H).
  const cuuint64_t dims[4] = {cuuint64_t(t.c), cuuint64_t(t.w), cuuint64_t(t.h), cuuint64_t(t.n)};
  const cuuint64_t strides[3] = {cuuint64_t(t.c) * 2, cuuint64_t(t.c * t.w) * 2, cuuint64_t(t.c * t.w * t.h) * 2};
  const int lower[2] = {t.lower_w, t.lower_h}, upper[2] = {t.upper_w, t.upper_h};
  const cuuint32_t element_strides[4] = {1, cuuint32_t(t.stride_w), cuuint32_t(t.stride_h), 1};
  const CUresult r = encode(map, TmaDataType(t.type, false), 4, const_cast<void*>(t.base), dims, strides, lower, upper,
                            cuuint32_t(t.channels), cuuint32_t(t.pixels), element_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

}  // namespace jaxgemm
