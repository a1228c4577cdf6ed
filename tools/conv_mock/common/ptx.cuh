// Host stand-in for common/ptx.cuh, for tools/conv_loader_emulation.cc: cp.async as a copy
// or a zero fill, with the alignment the hardware requires checked.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace jaxgemm {

inline void CheckAligned(const void* p, int bytes, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % bytes != 0) {
    std::fprintf(stderr, "misaligned %d-byte cp.async %s address %p\n", bytes, what, p);
    std::abort();
  }
}

inline void CpAsync4(void* smem, const void* src, bool valid) {
  CheckAligned(smem, 4, "shared");
  if (valid) CheckAligned(src, 4, "global");
  if (valid) std::memcpy(smem, src, 4); else std::memset(smem, 0, 4);
}

inline void CpAsync16(void* smem, const void* src, bool valid) {
  CheckAligned(smem, 16, "shared");
  if (valid) CheckAligned(src, 16, "global");
  if (valid) std::memcpy(smem, src, 16); else std::memset(smem, 0, 16);
}

inline void CpAsyncCommitGroup() {}
template <int kPending>
inline void CpAsyncWaitGroup() {}

}  // namespace jaxgemm
