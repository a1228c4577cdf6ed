#include "gemm/dispatch.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "gemm/sm80_launch.h"
#include "gemm/simt_launch.h"

namespace jaxgemm {
namespace {

// 16-bit inputs reach SIMT only when tensor cores cannot take them (unaligned rows): one
// tile is built for them, to keep the build small.
template <class TIn, class TOut>
cudaError_t RunSimt(const GemmProblem& p, cudaStream_t stream, SimtChoice tile) {
  if constexpr (std::is_same_v<TIn, float>) {
    if (tile.bm == 128 && tile.bn == 64) return LaunchSimtGemm<SimtPolicy128x64, TIn, TOut>(p, stream);
    if (tile.bm == 64 && tile.bn == 64) return LaunchSimtGemm<SimtPolicy64x64, TIn, TOut>(p, stream);
    return LaunchSimtGemm<SimtPolicy128x128F32, TIn, TOut>(p, stream);
  } else {
    return LaunchSimtGemm<SimtPolicy128x128, TIn, TOut>(p, stream);
  }
}

}  // namespace

// A wave model of the SIMT kernels. Each SM gets L = ceil(blocks / SMs) blocks; up to
// `resident` of them share it, and an SM reaches its FFMA rate only with ~16 warps
// resident; smaller tiles do more shared-memory traffic per FMA (`efficiency`, measured).
struct SimtCandidate {
  SimtChoice tile;
  int warps, resident;
  double efficiency;
};
constexpr SimtCandidate kSimtCandidates[] = {
    {{128, 128}, 8, 2, 1.0}, {{128, 64}, 4, 4, 0.94}, {{64, 64}, 2, 8, 0.9}};

double SimtCost(const GemmProblem& p, int sm_count, const SimtCandidate& c, int64_t split_k) {
  const double tiles = double((p.m + c.tile.bm - 1) / c.tile.bm) * double((p.n + c.tile.bn - 1) / c.tile.bn);
  const double blocks = tiles * double(p.batch.count) * double(split_k);
  const double per_sm = std::ceil(blocks / sm_count);
  const double active = std::min<double>(per_sm, c.resident);
  // Fewer resident warps slow an SM sublinearly (each warp has ILP of its own): sqrt fits
  // the measured 128x128 vs 128x64 vs 64x64 times at M=128, N=K=8192 (NOTES.md).
  const double rate = c.efficiency * std::sqrt(std::min(1.0, active * c.warps / 16.0));
  GemmProblem chunked = p;
  chunked.split_k = split_k;
  const double k = double(split_k > 1 ? chunked.KChunk() : p.k);
  return per_sm * c.tile.bm * c.tile.bn * k / rate;
}

SimtChoice ChooseSimtTile(const GemmProblem& p, int sm_count) {
  const SimtCandidate* best = &kSimtCandidates[0];
  double best_cost = SimtCost(p, sm_count, *best, p.split_k);
  for (const SimtCandidate& c : kSimtCandidates) {
    const double cost = SimtCost(p, sm_count, c, p.split_k);
    if (cost < best_cost) {
      best_cost = cost;
      best = &c;
    }
  }
  return best->tile;
}

int64_t ChooseSplitK(const GemmProblem& p, int sm_count) {
  int64_t best = 1;
  double best_cost = 0;
  for (int64_t split = 1; split <= 16; split *= 2) {
    GemmProblem q = p;
    q.split_k = split;
    if (split > 1 && q.KChunk() < 256) break;  // chunks too short to amortize the prologue
    // Each doubling also costs a pass over the fp32 partials: charge 5%.
    const double cost = SimtCost(q, sm_count, kSimtCandidates[0], split) * (1.0 + 0.05 * std::log2(double(split)));
    double cheapest = cost;
    for (const SimtCandidate& c : kSimtCandidates) {
      cheapest = std::min(cheapest, SimtCost(q, sm_count, c, split) * (1.0 + 0.05 * std::log2(double(split))));
    }
    if (best_cost == 0 || cheapest < best_cost) {
      best_cost = cheapest;
      best = split;
    }
  }
  return best;
}

int CurrentDeviceSmCount() {
  static std::atomic<int> cache[64] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return 0;
  int n = cache[device].load(std::memory_order_relaxed);
  if (n == 0) {
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || n <= 0) return 0;
    cache[device].store(n, std::memory_order_relaxed);
  }
  return n;
}

cudaError_t RunGemm(const GemmProblem& p, cudaStream_t stream, SimtChoice forced, std::string* unsupported) {
  if (p.m == 0 || p.n == 0 || p.batch.count == 0) return cudaSuccess;
  // K == 0 needs no special case: the kernels then apply the epilogue to zero sums.
  if (p.k > INT32_MAX - 64) {
    *unsupported = "K >= 2^31 is not supported";
    return cudaErrorInvalidValue;
  }
  // 16-bit inputs with 16-byte row starts run on tensor cores; a forced SIMT tile (tests,
  // tuning) or any other layout takes the SIMT kernels.
  if (forced.bm == 0 && Sm80Supports(p)) {
    using E = ElementType;
    if (p.in_type == E::kF16 && p.out_type == E::kF16) return LaunchSm80Gemm<__half, __half>(p, stream);
    if (p.in_type == E::kF16 && p.out_type == E::kF32) return LaunchSm80Gemm<__half, float>(p, stream);
    if (p.in_type == E::kBF16 && p.out_type == E::kBF16) return LaunchSm80Gemm<__nv_bfloat16, __nv_bfloat16>(p, stream);
    if (p.in_type == E::kBF16 && p.out_type == E::kF32) return LaunchSm80Gemm<__nv_bfloat16, float>(p, stream);
  }
  const int sm_count = CurrentDeviceSmCount();
  const SimtChoice tile = forced.bm != 0 ? forced : ChooseSimtTile(p, sm_count > 0 ? sm_count : 132);
  const bool known = std::any_of(std::begin(kSimtCandidates), std::end(kSimtCandidates), [&](const SimtCandidate& c) {
    return c.tile.bm == tile.bm && c.tile.bn == tile.bn;
  });
  if (!known) {
    *unsupported = "no SIMT tile " + std::to_string(tile.bm) + "x" + std::to_string(tile.bn);
    return cudaErrorInvalidValue;
  }
  using E = ElementType;
  if (p.in_type == E::kF32 && p.out_type == E::kF32) return RunSimt<float, float>(p, stream, tile);
  if (p.in_type == E::kF16 && p.out_type == E::kF16) return RunSimt<__half, __half>(p, stream, tile);
  if (p.in_type == E::kF16 && p.out_type == E::kF32) return RunSimt<__half, float>(p, stream, tile);
  if (p.in_type == E::kBF16 && p.out_type == E::kBF16)
    return RunSimt<__nv_bfloat16, __nv_bfloat16>(p, stream, tile);
  if (p.in_type == E::kBF16 && p.out_type == E::kF32) return RunSimt<__nv_bfloat16, float>(p, stream, tile);
  *unsupported = std::string("no kernel for ") + ElementTypeName(p.in_type) + " inputs with " +
                 ElementTypeName(p.out_type) + " output";
  return cudaErrorInvalidValue;
}

}  // namespace jaxgemm
