#include "gemm/dispatch.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <type_traits>
#include <utility>

#include "common/element_dispatch.cuh"
#include "gemm/decode_launch.h"
#include "gemm/simt_launch.h"
#include "gemm/sm80_launch.h"
#include "gemm/sm90/fp8_operands.h"
#include "gemm/sm90/heuristic.h"
#include "gemm/sm90/launch.h"

namespace jaxgemm {
namespace {

// 16-bit inputs reach SIMT only when tensor cores cannot take them (unaligned rows): one
// tile is built for them, to keep the build small.
template <class TIn, class TOut>
cudaError_t RunSimt(const GemmProblem& p, cudaStream_t stream, SimtChoice tile) {
  if constexpr (std::is_same_v<TIn, float>) {
    if (tile.bm == 256 && tile.bn == 128) return LaunchSimtGemm<SimtPolicy256x128F32, TIn, TOut>(p, stream);
    if (tile.bm == 128 && tile.bn == 64) return LaunchSimtGemm<SimtPolicy128x64, TIn, TOut>(p, stream);
    if (tile.bm == 64 && tile.bn == 64) return LaunchSimtGemm<SimtPolicy64x64, TIn, TOut>(p, stream);
    return LaunchSimtGemm<SimtPolicy128x128F32, TIn, TOut>(p, stream);
  } else {
    return LaunchSimtGemm<SimtPolicy128x128, TIn, TOut>(p, stream);
  }
}

}  // namespace

// A wave model of the SIMT kernels over simt_tiles.h's heuristic tiles. Each SM gets
// L = ceil(blocks / SMs) blocks; up to `resident` of them share it, and an SM reaches its
// FFMA rate only with ~16 warps resident.
double SimtCost(const GemmProblem& p, int sm_count, const SimtTile& c, int64_t split_k) {
  const double tiles = double((p.m + c.tile.bm - 1) / c.tile.bm) * double((p.n + c.tile.bn - 1) / c.tile.bn);
  const double blocks = tiles * double(p.batch.count) * double(split_k);
  const double per_sm = std::ceil(blocks / sm_count);
  const double active = std::min<double>(per_sm, c.resident);
  // Fewer resident warps slow an SM sublinearly (each warp has ILP of its own): sqrt fits
  // the measured 128x128 vs 128x64 vs 64x64 times at M=128, N=K=8192.
  const double rate = c.efficiency * std::sqrt(std::min(1.0, active * c.warps / 16.0));
  GemmProblem chunked = p;
  chunked.split_k = split_k;
  const double k = double(split_k > 1 ? chunked.KChunk() : p.k);
  return per_sm * c.tile.bm * c.tile.bn * k / rate;
}

SimtChoice ChooseSimtTile(const GemmProblem& p, int sm_count) {
  const SimtTile* best = &kSimtTiles[0];
  double best_cost = SimtCost(p, sm_count, *best, p.split_k);
  for (const SimtTile& c : kSimtTiles) {
    if (!c.heuristic) continue;
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
    const double cost = SimtCost(q, sm_count, kSimtTiles[0], split) * (1.0 + 0.05 * std::log2(double(split)));
    double cheapest = cost;
    for (const SimtTile& c : kSimtTiles) {
      if (!c.heuristic) continue;
      cheapest = std::min(cheapest, SimtCost(q, sm_count, c, split) * (1.0 + 0.05 * std::log2(double(split))));
    }
    if (best_cost == 0 || cheapest < best_cost) {
      best_cost = cheapest;
      best = split;
    }
  }
  return best;
}

// sm80: 128 x 128 tiles, the same wave model (one speed). sm90: the split whose cheapest
// schedule is cheapest.
int64_t ChooseTensorCoreSplitK(const GemmProblem& p, int sm_count, bool sm90) {
  if (sm90 && p.m <= kSm90FewRows) return Sm90FewRowsSplitK(p, sm_count);
  const double tiles = double((p.m + 127) / 128) * double((p.n + 127) / 128) * double(p.batch.count);
  int64_t best = 1;
  double best_cost = 0;
  for (int64_t split = 1; split <= 16; split *= 2) {
    GemmProblem q = p;
    q.split_k = split;
    if (split > 1 && q.KChunk() < 512) break;  // chunks too short to amortize the pipeline fill
    const double k = double(split > 1 ? q.KChunk() : p.k);
    double cost = std::ceil(tiles * split / sm_count) * k * (1.0 + 0.05 * std::log2(double(split)));
    if (sm90) cost = Sm90CheapestCost(q, sm_count);
    if (best_cost == 0 || cost < best_cost) {
      best_cost = cost;
      best = split;
    }
  }
  return best;
}

namespace {

// Per-device attribute cache (devices 0..63).
int CachedDeviceAttribute(std::atomic<int> (&cache)[64], int (*query)(int device)) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return 0;
  int v = cache[device].load(std::memory_order_relaxed);
  if (v == 0) {
    v = query(device);
    if (v > 0) cache[device].store(v, std::memory_order_relaxed);
  }
  return v > 0 ? v : 0;
}

}  // namespace

int CurrentDeviceSmCount() {
  static std::atomic<int> cache[64] = {};
  const int sms = CachedDeviceAttribute(cache, [](int device) {
    int n = 0;
    return cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) == cudaSuccess ? n : 0;
  });
  // A smaller count on request: the heuristics and persistent grids then act as on a
  // smaller GPU (tests reach multi-wave and stream-K schedules with small problems).
  if (const char* limit = std::getenv("JAXGEMM_SM_COUNT")) {
    const int n = std::atoi(limit);
    if (n > 0 && n < sms) return n;
  }
  return sms;
}

int KernelSmCount(int sm_margin) {
  const int sms = CurrentDeviceSmCount();
  return std::max(2, (sms > 0 ? sms : 132) - std::max(0, sm_margin));
}

int CurrentDeviceComputeCapability() {
  static std::atomic<int> cache[64] = {};
  return CachedDeviceAttribute(cache, [](int device) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
      return 0;
    }
    return 10 * major + minor;
  });
}

namespace {

template <class TIn, class TOut>
cudaError_t RunTensorCore(const GemmProblem& p, cudaStream_t stream, bool sm90, Sm90Tile tile, int sm_count,
                          Sm90Workspace workspace) {
  if constexpr (!std::is_same_v<TIn, float>) {  // (float: tf32, sm90 only)
    if (!sm90) return LaunchSm80Gemm<TIn, TOut>(p, stream);
  }
  if (tile.n == 0) {
    tile = ChooseSm90Tile(p, sm_count);
    sm_count = Sm90GridSms(p, sm_count);
  }
  return LaunchSm90Gemm<TIn, TOut>(p, tile.m, tile.n, sm_count, stream, workspace);
}

// Whether a forced sm90 tile (none: 0 x 0) has an instance for the inputs (`built`: the
// table's column for them); else *unsupported says what it is built for.
bool Sm90TileBuilt(Sm90Tile tile, bool Sm90ScheduleRow::*built, std::string* unsupported) {
  const Sm90ScheduleRow* row = FindSm90Schedule(tile.m, tile.n);
  if (row == nullptr || row->*built) return true;
  std::string kinds;
  for (auto [column, what] : {std::pair{&Sm90ScheduleRow::half, "16-bit inputs"},
                              std::pair{&Sm90ScheduleRow::tf32, "tf32"},
                              std::pair{&Sm90ScheduleRow::fp8, "float8 inputs"},
                              std::pair{&Sm90ScheduleRow::block_scaled, "float8 inputs with block scales"}}) {
    if (row->*column) kinds += (kinds.empty() ? "" : ", ") + std::string(what);
  }
  *unsupported = "the " + std::to_string(tile.m) + "x" + std::to_string(tile.n) + " tile is built for " + kinds + " only";
  return false;
}

// float8 inputs (IsFloat8): the sm90 kernel only, on the schedules built for them; both
// operands K-major and a bfloat16 or float32 output (DecodeGemm checks those).
cudaError_t RunFloat8Gemm(const GemmProblem& p, cudaStream_t stream, KernelRequest request, bool hopper,
                          int sm_count, Sm90Workspace workspace, std::string* unsupported) {
  using F = KernelFamily;
  if (!hopper || !Sm90Supports(p) || (request.family != F::kAuto && request.family != F::kSm90)) {
    *unsupported = "float8 inputs run on the sm90 kernel only: a Hopper GPU, K-major operands with 16-byte rows";
    return cudaErrorInvalidValue;
  }
  Sm90Tile tile{request.tile_m, request.tile_n};
  if (tile.n != 0) {
    const Sm90ScheduleRow* row = FindSm90Schedule(tile.m, tile.n);
    if (row == nullptr || !row->fp8) {
      *unsupported = "no float8 instance of the " + std::to_string(tile.m) + "x" + std::to_string(tile.n) + " tile";
      return cudaErrorInvalidValue;
    }
  } else {
    tile = ChooseSm90Tile(p, sm_count);
    sm_count = Sm90GridSms(p, sm_count);
  }
  if (p.out_type != ElementType::kBF16 && p.out_type != ElementType::kF32) {
    *unsupported = "float8 inputs write bfloat16 or float32";
    return cudaErrorInvalidValue;
  }
  if (p.in_type == ElementType::kF8E5M2 && !p.other_b_fp8) {
    *unsupported = "float8_e5m2 pairs with float8_e4m3fn only";
    return cudaErrorInvalidValue;
  }
  auto launch = [&](auto formats) {
    using TIn = decltype(formats);
    if (p.out_type == ElementType::kBF16) {
      return LaunchSm90Gemm<TIn, __nv_bfloat16>(p, tile.m, tile.n, sm_count, stream, workspace);
    }
    return LaunchSm90Gemm<TIn, float>(p, tile.m, tile.n, sm_count, stream, workspace);
  };
  return WithFp8Operands(p.in_type, p.other_b_fp8, launch);  // (TIn: the formats, fp8_operands.h)
}

}  // namespace

size_t GemmWorkspaceBytes(const GemmProblem& p, int sm_count, KernelRequest request) {
  if (request.family != KernelFamily::kAuto && request.family != KernelFamily::kSm90) return 0;
  if (request.dynamic_tiles) return kSm90TileCounterBytes;  // (no stream-K then)
  if (!Sm90StreamKEnabled()) return 0;
  const GemmProblem oriented = Sm90Transposed(p);  // the problem as RunGemm launches it
  if (request.family == KernelFamily::kSm90 && request.tile_n != 0) {
    return Sm90StreamKBytes(oriented, request.tile_m, request.tile_n, sm_count);
  }
  const Sm90Tile tile = ChooseSm90Tile(oriented, sm_count);
  return Sm90StreamKBytes(oriented, tile.m, tile.n, Sm90GridSms(oriented, sm_count));
}

namespace {

// Whether the family `request` forces (if any) can take the problem (else *unsupported says
// why); *sm90: the sm90 kernel runs (forced, or the heuristic's choice when it can).
bool CheckForcedFamily(const GemmProblem& p, const KernelRequest& request, bool hopper, bool sm90_ok, bool sm80_ok,
                       bool* sm90, std::string* unsupported) {
  using F = KernelFamily;
  switch (request.family) {
    case F::kAuto: *sm90 = sm90_ok; return true;
    case F::kSm90:
      if (!sm90_ok || (request.tile_n != 0 && !IsSm90Tile(request.tile_m, request.tile_n))) {
        *unsupported = "the sm90 kernel cannot take this problem, device or tile";
        return false;
      }
      *sm90 = true;
      return true;
    case F::kSm80:
      if (!sm80_ok) *unsupported = "the sm80 kernel cannot take this problem";
      return sm80_ok;
    case F::kSimt: return true;
    case F::kDecode:
      if (!hopper || !DecodeSupports(p)) {
        *unsupported =
            "the decode kernel takes 16-bit inputs with at most 16 rows, A stored (m, k) and 16-byte row starts, "
            "on Hopper";
        return false;
      }
      return true;
  }
  return true;
}

// The decode kernel, forced (DecodeSupports has passed).
cudaError_t RunForcedDecode(const GemmProblem& p, int sm_count, cudaStream_t stream, std::string* unsupported) {
  if (!KernelElementPair(p.in_type, p.out_type)) {
    *unsupported = "the decode kernel writes the input dtype or float32";
    return cudaErrorInvalidValue;
  }
  return WithElementTypes(p.in_type, p.out_type, [&](auto in, auto out) {
    using TIn = typename decltype(in)::type;
    if constexpr (std::is_same_v<TIn, float>) {
      return cudaErrorInvalidValue;  // (DecodeSupports takes 16-bit inputs only)
    } else {
      return LaunchDecodeGemm<TIn, typename decltype(out)::type>(p, sm_count, stream);
    }
  });
}

}  // namespace

cudaError_t RunGemm(const GemmProblem& p, cudaStream_t stream, KernelRequest request, std::string* unsupported,
                    Sm90Workspace workspace) {
  if (p.m == 0 || p.n == 0 || p.batch.count == 0) return cudaSuccess;
  // K == 0 needs no special case: the kernels then apply the epilogue to zero sums.
  if (p.k > INT32_MAX - 64) {
    *unsupported = "K >= 2^31 is not supported";
    return cudaErrorInvalidValue;
  }
  using E = ElementType;
  using F = KernelFamily;
  const int sm_count = KernelSmCount(request.sm_margin);
  // sm_90a code runs on compute capability 9.0 only.
  const bool hopper = CurrentDeviceComputeCapability() == 90;
  if (IsFloat8(p.in_type)) return RunFloat8Gemm(p, stream, request, hopper, sm_count, workspace, unsupported);

  // 16-bit inputs with 16-byte row starts run on tensor cores: sm90 (TMA + wgmma) on Hopper
  // when TMA can address them, sm80 (mma.sync) otherwise. float32 allowed to be tf32 runs
  // on sm90 when B is stored K-major, or both operands N-major with a plain float32 output
  // (run transposed: Sm90Transposed; the caller arranges either), exact SIMT otherwise.
  const bool half = p.in_type != E::kF32;
  const GemmProblem oriented = Sm90Transposed(p);
  const bool sm90_ok = hopper && Sm90Supports(oriented);
  const bool sm80_ok = half && Sm80Supports(p);
  bool sm90 = false;
  if (!CheckForcedFamily(p, request, hopper, sm90_ok, sm80_ok, &sm90, unsupported)) return cudaErrorInvalidValue;
  // The decode kernel runs only when asked for: it is slower than the sm90 kernel's
  // few-row schedules (docs/kernels.md, section 5.7).
  if (request.family == F::kDecode) return RunForcedDecode(p, sm_count, stream, unsupported);
  if (request.family != F::kSimt && (sm90 || sm80_ok)) {
    const Sm90Tile tile = request.family == F::kSm90 ? Sm90Tile{request.tile_m, request.tile_n} : Sm90Tile{0, 0};
    if (p.in_type == E::kF32 && p.out_type == E::kF32) {
      if (sm90 && !Sm90TileBuilt(tile, &Sm90ScheduleRow::tf32, unsupported)) return cudaErrorInvalidValue;
      if (sm90 && tile.n != 0 && Sm90RegisterA(oriented) && Sm90PingpongTile(tile.m, tile.n)) {
        *unsupported = "tf32 with A stored (k, m), or A and B stored N-major, runs on the 128x256, 256x256, 64x128 "
                       "and 64x64 tiles only";
        return cudaErrorInvalidValue;
      }
      return RunTensorCore<float, float>(oriented, stream, sm90, tile, sm_count, workspace);  // (float: sm90 only)
    }
    if (sm90 && !Sm90TileBuilt(tile, &Sm90ScheduleRow::half, unsupported)) return cudaErrorInvalidValue;
    if (sm90 && Sm90SwappedTile(tile.m, tile.n) && p.trans_a) {
      *unsupported = "the 160x128 tile takes A stored (m, k) only";
      return cudaErrorInvalidValue;
    }
    if (p.in_type != E::kF32 && KernelElementPair(p.in_type, p.out_type)) {
      return WithElementTypes(p.in_type, p.out_type, [&](auto in, auto out) {
        return RunTensorCore<typename decltype(in)::type, typename decltype(out)::type>(p, stream, sm90, tile,
                                                                                        sm_count, workspace);
      });
    }
  }
  const SimtChoice tile = request.family == F::kSimt && request.tile_m != 0
                              ? SimtChoice{request.tile_m, request.tile_n}
                              : ChooseSimtTile(p, sm_count);
  if (!IsSimtTile(tile)) {
    *unsupported = "no SIMT tile " + std::to_string(tile.bm) + "x" + std::to_string(tile.bn);
    return cudaErrorInvalidValue;
  }
  if (KernelElementPair(p.in_type, p.out_type)) {
    return WithElementTypes(p.in_type, p.out_type, [&](auto in, auto out) {
      return RunSimt<typename decltype(in)::type, typename decltype(out)::type>(p, stream, tile);
    });
  }
  *unsupported = std::string("no kernel for ") + ElementTypeName(p.in_type) + " inputs with " +
                 ElementTypeName(p.out_type) + " output";
  return cudaErrorInvalidValue;
}

}  // namespace jaxgemm
