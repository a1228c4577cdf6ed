// Thin wrappers, one PTX instruction each.
#pragma once
#include <cstdint>

namespace jaxgemm {

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// cp.async of 4 bytes, cached in L1 (neighbouring threads read the same 16-byte sectors);
// copies zeros when !valid, without reading src.
__device__ __forceinline__ void CpAsync4(void* smem, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(SharedAddress(smem)), "l"(src),
               "r"(valid ? 4 : 0));
}

// cp.async of 16 bytes to shared address `smem`, bypassing L1: the first `bytes` (0..16) of
// src, zeros for the rest (0: nothing is read).
__device__ __forceinline__ void CpAsync16(uint32_t smem, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(src), "r"(bytes) : "memory");
}

// The same, all 16 bytes or zeros when !valid.
__device__ __forceinline__ void CpAsync16(void* smem, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SharedAddress(smem)), "l"(src),
               "r"(valid ? 16 : 0));
}

// Barrier `id` (1..15; 0 is __syncthreads') among `threads` threads, whole warps.
__device__ __forceinline__ void NamedBarrierSync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Arrives on barrier `id` without waiting (the other side of a NamedBarrierSync: its
// threads wait until `threads` have arrived or synced); the arriving threads' earlier
// shared-memory writes are visible to the waiting ones after it.
__device__ __forceinline__ void NamedBarrierArrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ void CpAsyncCommitGroup() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most kPending committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void CpAsyncWaitGroup() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

}  // namespace jaxgemm

namespace jaxgemm {

// ldmatrix.x4: four 8x8 matrices of 16-bit elements; lane l gives the (shared) address of
// row l % 8 of matrix l / 8 and receives its fragment of each matrix in r[0..3].
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], uint32_t smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem));
}
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const void* smem) { LdMatrixX4(r, SharedAddress(smem)); }

// The same, each matrix transposed on the way.
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], uint32_t smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem));
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const void* smem) {
  LdMatrixX4Trans(r, SharedAddress(smem));
}

// mma.sync m16n8k16, fp32 accumulators, f16 or bf16 operands (kBf16).
template <bool kBf16>
__device__ __forceinline__ void MmaM16N8K16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (kBf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

}  // namespace jaxgemm
