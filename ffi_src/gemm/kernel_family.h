// The kernel families a caller may ask for by id (the FFI calls' `kernel` attribute), with
// the names Python gives them (exported by the nanobind module). Plain C++.
#pragma once

namespace jaxgemm {

// kAuto lets the heuristic pick. kDecode (gemm/decode_launch.h) runs only when asked for;
// convolutions take kSm80 and kSm90 only.
enum class KernelFamily : int { kAuto = 0, kSimt = 1, kSm80 = 2, kSm90 = 3, kDecode = 4 };

struct KernelFamilyName {
  KernelFamily family;
  const char* name;
};
inline constexpr KernelFamilyName kKernelFamilyNames[] = {
    {KernelFamily::kSimt, "simt"},
    {KernelFamily::kSm80, "sm80"},
    {KernelFamily::kSm90, "sm90"},
    {KernelFamily::kDecode, "decode"},
};

}  // namespace jaxgemm
