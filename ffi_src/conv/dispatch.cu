#include "conv/dispatch.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "common/element_dispatch.cuh"
#include "conv/implicit_gemm.h"
#include "conv/launch.h"
#include "conv/sm90_conv.h"
#include "gemm/dispatch.h"

namespace jaxgemm {
namespace {

// The sm80 kernel when it takes the problem (16-bit inputs only), SIMT otherwise.
template <class TIn, class TOut, ConvKind kKind>
cudaError_t LaunchKind(const ConvProblem& p, const ConvGemm& g, cudaStream_t stream) {
  if constexpr (!std::is_same_v<TIn, float>) {
    if (Sm80ConvSupports(g, p.in_type)) return LaunchSm80Conv<TIn, TOut, kKind>(g, stream);
  }
  return LaunchSimtConv<TIn, TOut, kKind>(g, stream);
}

template <class TIn, class TOut>
cudaError_t Launch(const ConvProblem& p, const ConvGemm& g, cudaStream_t stream) {
  switch (p.kind) {
    case ConvKind::kFprop:
      return LaunchKind<TIn, TOut, ConvKind::kFprop>(p, g, stream);
    case ConvKind::kDgrad:  // dx in the input dtype
      if constexpr (std::is_same_v<TIn, TOut>) return LaunchKind<TIn, TOut, ConvKind::kDgrad>(p, g, stream);
      break;
    case ConvKind::kWgrad:  // fp32 partials
      if constexpr (std::is_same_v<TOut, float>) return LaunchKind<TIn, float, ConvKind::kWgrad>(p, g, stream);
      break;
  }
  return cudaErrorInvalidValue;  // ruled out by the decoder
}

// One launch per GEMM: dgrad has one per output phase (conv/implicit_gemm.h).
template <class TIn, class TOut>
cudaError_t LaunchAll(const ConvProblem& p, cudaStream_t stream) {
  if (p.kind != ConvKind::kDgrad) return Launch<TIn, TOut>(p, MakeConvGemm(p), stream);
  for (const ConvGemm& g : DgradPhases(p)) {
    const cudaError_t status = Launch<TIn, TOut>(p, g, stream);
    if (status != cudaSuccess) return status;
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t RunConv(const ConvProblem& p, cudaStream_t stream, KernelFamily family, std::string* unsupported,
                    int sm_margin) {
  const ConvGemm g = MakeConvGemm(p);
  if (g.m == 0 || g.n == 0) return cudaSuccess;  // nothing to write (K == 0 still writes the epilogue)
  if (!ConvFitsInt32(p)) {
    *unsupported = "sizes too large for 32-bit pixel indices";
    return cudaErrorInvalidValue;
  }
  if (p.groups * p.split > 65535) {  // one grid row per (group, split) slab
    *unsupported = "groups * wgrad split > 65535";
    return cudaErrorInvalidValue;
  }
  if (family != KernelFamily::kSm80) {
    // sm90 on Hopper (sm_90a code runs on compute capability 9.0 only) when TMA can gather x.
    const bool sm90_ok = CurrentDeviceComputeCapability() == 90 && Sm90ConvSupports(p);
    const bool forced = family == KernelFamily::kSm90;
    if (forced && !sm90_ok) {
      *unsupported = "the sm90 conv kernel cannot take this problem or device";
      return cudaErrorInvalidValue;
    }
    if (sm90_ok && (forced || Sm90ConvPreferred(p))) {
      bool encoded = false;
      const int sms = KernelSmCount(sm_margin);
      cudaError_t status = cudaSuccess;
      switch (p.kind) {
        case ConvKind::kFprop:
          status = RunSm90ConvFprop(p, sms, stream, &encoded);
          break;
        case ConvKind::kDgrad:
          status = RunSm90ConvDgrad(p, sms, stream, &encoded);
          break;
        case ConvKind::kWgrad:
          status = RunSm90ConvWgrad(p, sms, stream, &encoded);
          break;
      }
      if (encoded) return status;
      if (forced) {
        *unsupported = "the driver rejected the sm90 conv's tensor maps";
        return cudaErrorInvalidValue;
      }
      // The heuristic's choice: fall back to the sm80 kernel below.
    }
  }
  if (KernelElementPair(p.in_type, p.out_type)) {
    return WithElementTypes(p.in_type, p.out_type, [&](auto in, auto out) {
      return LaunchAll<typename decltype(in)::type, typename decltype(out)::type>(p, stream);
    });
  }
  *unsupported = std::string("no conv kernel for ") + ElementTypeName(p.in_type) + " inputs with " +
                 ElementTypeName(p.out_type) + " output";
  return cudaErrorInvalidValue;
}

}  // namespace jaxgemm
