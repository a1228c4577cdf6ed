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

// cp.async of 16 bytes, bypassing L1; zeros when !valid.
__device__ __forceinline__ void CpAsync16(void* smem, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SharedAddress(smem)), "l"(src),
               "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void CpAsyncCommitGroup() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most kPending committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void CpAsyncWaitGroup() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

}  // namespace jaxgemm
