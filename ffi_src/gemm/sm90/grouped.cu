// Host side of the grouped Hopper GEMM (grouped.cuh): the tensor maps, the persistent grid
// and one instance of Sm90GemmKernel per (mode, input type, output type).
#include "gemm/sm90/grouped.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>

#include "gemm/dispatch.h"
#include "gemm/sm90/grouped.cuh"
#include "gemm/sm90/kernel.cuh"
#include "gemm/sm90/tensor_map.h"

namespace jaxgemm {
namespace {

// The sm90 table's cooperative 128 x 256 schedule (the dense kernel's for large products),
// 16-bit inputs: the tile grouped_items.h names.
using GroupedPolicy = Sm90TilePolicy<kGroupedTileM, kGroupedTileN, 2>;
static_assert(GroupedPolicy::kBM == kGroupedTileM && GroupedPolicy::kBN == kGroupedTileN &&
                  GroupedPolicy::kBK == kGroupedTileK && !GroupedPolicy::kPingpong && GroupedPolicy::kConsumers == 2,
              "the tile grouped_items.h names (the module's grouped_walk walks it), cooperative");

template <class TIn, class TOut, GroupedMode kMode>
cudaError_t Launch(const GroupedProblem& p, cudaStream_t stream) {
  using P = GroupedPolicy;
  constexpr bool kContraction = kMode == GroupedMode::kContraction, kGated = kMode == GroupedMode::kRowsGated;
  constexpr bool kTransA = kContraction, kTransB = kMode == GroupedMode::kRowsRhsT;
  using Loads = Sm90GroupedLoads<kMode>;
  Loads loads{};
  TmaMatrix a{p.lhs, p.in_type, p.k, p.m, p.k};  // lhs (m, k)
  cudaError_t status = EncodeTmaMap(&loads.a, a, kTransA ? 64 : P::kBK, kTransA ? P::kBK : P::kBM);
  if (status != cudaSuccess) return status;
  if constexpr (kContraction) {  // rhs (m, n), read in (k = rows, n) boxes of 64-wide blocks
    TmaMatrix b{p.rhs, p.in_type, p.n, p.m, p.n};
    status = EncodeTmaMap(&loads.b, b, 64, P::kBK);
  } else {  // rhs (g, k, n), or (g, n, k) for kTransB
    const int64_t cols = kTransB ? p.k : p.n, rows = kTransB ? p.n : p.k;
    TmaMatrix b{p.rhs, p.in_type, cols, rows, cols, p.groups, rows * cols};
    loads.b_per_group = p.groups > 1;
    status = EncodeTmaMap(&loads.b, b, kTransB ? P::kBK : 64, kTransB ? P::kBN : P::kBK);
    if (kGated && status == cudaSuccess) {  // the up weights, read as the gate's
      TmaMatrix up{p.rhs_up, p.in_type, cols, rows, cols, p.groups, rows * cols};
      status = EncodeTmaMap(&loads.b_up, up, 64, P::kBK);
    }
  }
  if (status != cudaSuccess) return status;
  const Sm90GroupedSchedule<P, kMode> schedule{p.group_sizes, static_cast<int32_t>(p.groups),
                                               static_cast<int32_t>(p.m), static_cast<int32_t>(p.n),
                                               static_cast<int32_t>(p.k)};
  Sm90GroupedStore store{};
  // D as rows of n for the TMA-store epilogue: 64 rows x 128 bytes a box, as the dense
  // kernel's (MakeSm90Store); without it (a pitch TMA rejects) every store is direct.
  const int64_t d_rows = kContraction ? p.groups * p.k : p.m;
  TmaMatrix d{p.out, p.out_type, p.n, d_rows, p.n};
  store.tma_store = EncodeTmaMap(&store.d, d, kSm90BoxCols<TOut>, 64) == cudaSuccess;
  store.one = 1.f;
  store.out = p.out;
  store.n = static_cast<int32_t>(p.n);
  store.groups = static_cast<int32_t>(p.groups);
  store.k = static_cast<int32_t>(p.k);
  store.epilogue = p.HasEpilogue();
  store.activation = p.activation;
  store.bias = p.bias;
  store.residual = p.residual;
  store.aux = p.aux;
  store.bias_up = p.bias_up;
  store.aux_up = p.aux_up;

  constexpr int kSmemBytes = Sm90GroupedLayout<P>::kSmemBytes;
  auto kernel = Sm90GemmKernel<P, TIn, TOut, kTransA, kTransB, Loads, Sm90Epilogues::kAll>;
  status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (status != cudaSuccess) return status;
  const int blocks = static_cast<int>(std::min<int64_t>(std::max(CurrentDeviceSmCount(), 1), schedule.MostItems()));
  kernel<<<blocks, P::kThreads, kSmemBytes, stream>>>(loads, GemmProblem{}, schedule, store, Sm90StreamK{},
                                                      Sm90Timeline{});
  return cudaGetLastError();
}

template <class TIn, class TOut>
cudaError_t LaunchMode(const GroupedProblem& p, cudaStream_t stream) {
  switch (p.mode) {
    case GroupedMode::kRows: return Launch<TIn, TOut, GroupedMode::kRows>(p, stream);
    case GroupedMode::kRowsRhsT: return Launch<TIn, TOut, GroupedMode::kRowsRhsT>(p, stream);
    case GroupedMode::kContraction: return Launch<TIn, TOut, GroupedMode::kContraction>(p, stream);
    case GroupedMode::kRowsGated:  // 16-bit outputs only (GroupedUnsupported)
      if constexpr (sizeof(TOut) == 2) return Launch<TIn, TOut, GroupedMode::kRowsGated>(p, stream);
      return cudaErrorInvalidValue;
  }
  return cudaErrorInvalidValue;
}

template <class TIn>
cudaError_t LaunchOut(const GroupedProblem& p, cudaStream_t stream) {
  return p.out_type == ElementType::kF32 ? LaunchMode<TIn, float>(p, stream) : LaunchMode<TIn, TIn>(p, stream);
}

}  // namespace

std::string GroupedUnsupported(const GroupedProblem& p) {
  if (ElementBytes(p.in_type) != 2) return "grouped GEMM: inputs must be float16 or bfloat16";
  if (p.out_type != p.in_type && p.out_type != ElementType::kF32) {
    return "grouped GEMM: the output must be float32 or the inputs' type";
  }
  if (p.groups < 1 || p.groups > kMaxGroupedGroups) {
    return "grouped GEMM: 1 to " + std::to_string(kMaxGroupedGroups) + " groups, got " + std::to_string(p.groups);
  }
  // TMA: row pitches in 16-byte multiples; int32 coordinates and offsets.
  const int64_t pitch_elems = 16 / ElementBytes(p.in_type);
  if (p.k % pitch_elems || p.n % pitch_elems) return "grouped GEMM: k and n must be multiples of 8";
  // (Work items, int32, stay below 2^40 / (128 x 256) elements of D.)
  if (p.m >= INT_MAX || p.k >= INT_MAX || p.n >= INT_MAX || p.groups * p.k * p.n >= (int64_t{1} << 40) ||
      p.m * p.n >= (int64_t{1} << 40)) {
    return "grouped GEMM: dims too large";
  }
  const bool gated = p.mode == GroupedMode::kRowsGated;
  if ((p.HasEpilogue() || gated) && (p.mode == GroupedMode::kContraction || p.out_type != p.in_type || p.k == 0)) {
    return "grouped GEMM: the epilogue is the row modes', with k >= 1 and an output of the inputs' type";
  }
  if (gated && (p.rhs_up == nullptr || p.residual != nullptr)) return "grouped GEMM: the gated mode takes rhs_up, no residual";
  if (CurrentDeviceComputeCapability() != 90) return "grouped GEMM: needs an sm_90 GPU (Hopper)";
  return "";
}

cudaError_t RunGroupedGemm(const GroupedProblem& p, cudaStream_t stream) {
  if (!GroupedUnsupported(p).empty()) return cudaErrorInvalidValue;
  const int64_t out_elems = p.mode == GroupedMode::kContraction ? p.groups * p.k * p.n : p.m * p.n;
  if (out_elems == 0) return cudaSuccess;
  if (p.m == 0 || p.k == 0) {  // no products: zeros (and no zero-sized tensor maps)
    return cudaMemsetAsync(p.out, 0, out_elems * ElementBytes(p.out_type), stream);
  }
  if (p.in_type == ElementType::kBF16) return LaunchOut<__nv_bfloat16>(p, stream);
  return LaunchOut<__half>(p, stream);
}

}  // namespace jaxgemm
