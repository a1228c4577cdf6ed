#include "gemm/dispatch.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <cstring>

#include "gemm/simt_launch.h"

namespace jaxgemm {
namespace {

// SM count per device, read once: RunGemm is on XLA's hot path.
int SmCount() {
  static std::atomic<int> cache[64] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return 132;
  int n = cache[device].load(std::memory_order_relaxed);
  if (n == 0) {
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || n <= 0) n = 132;
    cache[device].store(n, std::memory_order_relaxed);
  }
  return n;
}

template <class TIn, class TOut>
cudaError_t RunSimt(const GemmProblem& p, cudaStream_t stream, SimtChoice tile, bool has_128x64) {
  if (tile.bm == 128 && tile.bn == 128) return LaunchSimtGemm<SimtPolicy128x128, TIn, TOut>(p, stream);
  if (tile.bm == 128 && tile.bn == 64 && has_128x64) return LaunchSimtGemm<SimtPolicy128x64, TIn, TOut>(p, stream);
  return LaunchSimtGemm<SimtPolicy64x64, TIn, TOut>(p, stream);
}

}  // namespace

SimtChoice ChooseSimtTile(const GemmProblem& p, int sm_count) {
  // A wave model: blocks run `resident` at a time per SM; a tile of bm x bn costs
  // bm*bn*resident/efficiency SM-time units, smaller tiles being less efficient (more
  // shared-memory traffic per FMA). Pick the cheapest total.
  struct Candidate {
    SimtChoice tile;
    int resident;
    double efficiency;
  };
  static constexpr Candidate kCandidates[] = {
      {{128, 128}, 2, 1.0}, {{128, 64}, 4, 0.85}, {{64, 64}, 8, 0.7}};
  SimtChoice best = kCandidates[0].tile;
  double best_cost = 0;
  for (const Candidate& c : kCandidates) {
    const double tiles = double((p.m + c.tile.bm - 1) / c.tile.bm) * double((p.n + c.tile.bn - 1) / c.tile.bn) *
                         double(p.batch.count);
    const double slots = double(sm_count) * c.resident;
    const double waves = tiles <= slots ? 1.0 : double(int64_t((tiles + slots - 1) / slots));
    const double cost = waves * c.tile.bm * c.tile.bn * c.resident / c.efficiency;
    if (best_cost == 0 || cost < best_cost) {
      best_cost = cost;
      best = c.tile;
    }
  }
  return best;
}

cudaError_t RunGemm(const GemmProblem& p, cudaStream_t stream, std::string* unsupported) {
  if (p.m == 0 || p.n == 0 || p.batch.count == 0) return cudaSuccess;
  if (p.k == 0) {
    return cudaMemsetAsync(p.d, 0, size_t(p.batch.count * p.m * p.n) * ElementBytes(p.out_type), stream);
  }
  if (p.k > INT32_MAX - 64) {
    *unsupported = "K >= 2^31 is not supported";
    return cudaErrorInvalidValue;
  }
  const SimtChoice tile = ChooseSimtTile(p, SmCount());
  using E = ElementType;
  if (p.in_type == E::kF32 && p.out_type == E::kF32) return RunSimt<float, float>(p, stream, tile, true);
  if (p.in_type == E::kF16 && p.out_type == E::kF16) return RunSimt<__half, __half>(p, stream, tile, false);
  if (p.in_type == E::kF16 && p.out_type == E::kF32) return RunSimt<__half, float>(p, stream, tile, false);
  if (p.in_type == E::kBF16 && p.out_type == E::kBF16)
    return RunSimt<__nv_bfloat16, __nv_bfloat16>(p, stream, tile, false);
  if (p.in_type == E::kBF16 && p.out_type == E::kF32) return RunSimt<__nv_bfloat16, float>(p, stream, tile, false);
  *unsupported = std::string("no kernel for ") + ElementTypeName(p.in_type) + " inputs with " +
                 ElementTypeName(p.out_type) + " output";
  return cudaErrorInvalidValue;
}

}  // namespace jaxgemm
