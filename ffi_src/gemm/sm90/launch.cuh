// Host launchers of the sm90 kernel: LaunchSm90Kernel (one policy, any loads type: the
// persistent grid, stream-K's workspace, the epilogue instance), LaunchSm90Gemm (a GEMM by
// schedule name: its tensor maps and layouts, one row of kSm90Schedules) and
// LaunchSm90BlockScaledGemm (fp8 with block scales: Sm90BlockScaledPolicy, or its groups).
// Included by the instance files that compile the kernels (gemm/ and conv/instances/).
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "gemm/problem.h"
#include "gemm/sm90/epilogue.cuh"
#include "gemm/sm90/kernel.cuh"
#include "gemm/sm90/launch.h"
#include "gemm/sm90/schedules.h"
#include "gemm/sm90/tensor_map.h"
#include "gemm/sm90/timeline.cuh"

namespace jaxgemm {

// Launches Sm90GemmKernel persistently: one block per SM (one cluster per kClusterM SMs),
// at most one per work item; stream-K (PlanSm90StreamK) when `workspace` holds its slots, or
// the dynamic walk (Sm90Schedule::Take) when it holds the tile counter.
template <class P, class TIn, class TOut, bool kTransA, bool kTransB, class Loads>
cudaError_t LaunchSm90Kernel(const Loads& loads, const GemmProblem& p, int sm_count, cudaStream_t stream,
                             Sm90Workspace workspace = {}) {
  Sm90Store store = P::kSwapped ? Sm90Store{} : MakeSm90Store<TOut>(p);  // (swapped: the general epilogue)
  if constexpr (Loads::kMapsRows) {
    if (loads.MapsRows()) store = Sm90Store{};  // D's rows are not a TMA box: the general epilogue
  }
  auto* kernel = Sm90GemmKernel<P, TIn, TOut, kTransA, kTransB, Loads, Sm90Epilogues::kAll>;
  if constexpr (kSm90EpilogueInstances<P, Loads>) {
    if (store.enabled && !store.fused) {  // (with tf32's D written transposed, too)
      kernel = Sm90GemmKernel<P, TIn, TOut, kTransA, kTransB, Loads, Sm90Epilogues::kPlain>;
    } else if (store.enabled) {
      // (MakeSm90Store fuses 16-bit outputs only: no such instance for float ones)
      if constexpr (sizeof(TOut) == 2) {
        kernel = Sm90GemmKernel<P, TIn, TOut, kTransA, kTransB, Loads, Sm90Epilogues::kTmaStores>;
      }
    }
  }
  cudaError_t status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, P::kSmemBytes);
  if (status != cudaSuccess) return status;
  // A transposed D is written by the swapped tiles' general epilogue, or by the handed TMA
  // stores (the cooperative schedules) of register A (Sm90WriteTransposedBoxes).
  const bool transposed_boxes = store.enabled && !P::kPingpong && std::is_same_v<TIn, float> && kTransA;
  if (p.transposed_d != P::kSwapped && !(p.transposed_d && transposed_boxes)) return cudaErrorInvalidValue;
  const int64_t items = Sm90Schedule<P>::Items(p);
  if (items >= (int64_t{1} << 31)) return cudaErrorInvalidValue;  // the schedule's indices are 32-bit
  // Workers of the persistent grid: blocks, or clusters. A cluster's blocks must share a
  // GPC, so fewer clusters than SMs / kClusterM may fit at once (on the H200, 66 of 2
  // blocks, but only 30 of 4); the grid must not exceed that: its walk, and stream-K's
  // waits on partners, assume every worker runs. Asked once per kernel.
  int64_t workers = std::max(sm_count / P::kClusterM, 1);
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute cluster[1];
  if constexpr (P::kClusterM > 1) {
    config.blockDim = dim3(P::kThreads);
    config.dynamicSmemBytes = P::kSmemBytes;
    config.stream = stream;
    cluster[0].id = cudaLaunchAttributeClusterDimension;
    cluster[0].val.clusterDim.x = P::kClusterM;
    cluster[0].val.clusterDim.y = 1;
    cluster[0].val.clusterDim.z = 1;
    config.attrs = cluster;
    config.numAttrs = 1;
    static std::atomic<int> resident{0};
    if (resident.load(std::memory_order_relaxed) == 0) {
      int count = 0;
      config.gridDim = dim3(static_cast<unsigned>(P::kClusterM * workers));
      if (cudaOccupancyMaxActiveClusters(&count, kernel, &config) != cudaSuccess || count <= 0) count = -1;  // unknown
      (void)cudaGetLastError();
      resident.store(count, std::memory_order_relaxed);
      if (std::getenv("JAXGEMM_VERBOSE")) {
        std::fprintf(stderr, "jaxgemm: sm90 %d-block clusters: %d resident, at most %d launched\n", P::kClusterM,
                     count, static_cast<int>(workers));
      }
    }
    const int fit = resident.load(std::memory_order_relaxed);
    if (fit > 0) workers = std::min<int64_t>(workers, fit);
  }
  // Stream-K needs loads that start an item at any k-tile (the matrix loads; the conv fprop
  // loads walk their filter taps from the first), and the grid the plan was made for (with
  // a single shared wave, more workers than items).
  // The dynamic walk (matrix loads too) takes the workspace for its counter instead.
  const bool dynamic = kSm90GemmLoads<Loads> && workspace.tile_counter && workspace.data &&
                       workspace.bytes >= kSm90TileCounterBytes;
  Sm90StreamK stream_k{};
  const Sm90StreamKPlan plan = PlanSm90StreamK(p, {P::kBM, P::kBN, P::kClusterM, P::kSwapped}, sm_count);
  const int64_t k_tiles = (p.k + P::kBK - 1) / P::kBK;
  if (!dynamic && kSm90GemmLoads<Loads> && plan.items > 0 && plan.workers == workers &&
      workspace.data && workspace.bytes >= plan.bytes && plan.items * k_tiles < (int64_t{1} << 31)) {
    stream_k.partials = static_cast<float*>(workspace.data);
    stream_k.flags = reinterpret_cast<uint32_t*>(static_cast<unsigned char*>(workspace.data) + plan.flags_offset);
    stream_k.items = plan.items;
    status = cudaMemsetAsync(stream_k.flags, 0, plan.bytes - plan.flags_offset, stream);
    if (status != cudaSuccess) return status;
  }
  if (stream_k.items == 0) workers = std::min(workers, items);
  // (Keeping row blocks in step was measured on GEMMs only: the convolutions' loads skip.)
  Sm90Schedule<P> schedule = Sm90Schedule<P>::For(p, stream_k.items, kSm90GemmLoads<Loads>);
  if (dynamic) {
    schedule.next_item = static_cast<uint32_t*>(workspace.data);
    status = cudaMemsetAsync(schedule.next_item, 0, sizeof(uint32_t), stream);
    if (status != cudaSuccess) return status;
  }
  const int64_t blocks = workers * P::kClusterM;
  const Sm90Timeline timeline = BeginSm90Timeline(blocks, stream);
  if constexpr (P::kClusterM == 1) {
    kernel<<<static_cast<unsigned>(blocks), P::kThreads, P::kSmemBytes, stream>>>(loads, p, schedule, store,
                                                                                 stream_k, timeline);
    status = cudaGetLastError();
  } else {
    config.gridDim = dim3(static_cast<unsigned>(blocks));
    status = cudaLaunchKernelEx(&config, kernel, loads, p, schedule, store, stream_k, timeline);
    if (status == cudaSuccess) status = cudaGetLastError();
  }
  if (status == cudaSuccess && timeline.stamps) {
    char what[160];
    std::snprintf(what, sizeof(what), "sm90 %dx%d%s%s, %lld x %lld x %lld, %lld items", P::kBM, P::kBN,
                  P::kClusterM > 1 ? " cluster 2" : "", P::kPingpong ? " pingpong" : "",
                  static_cast<long long>(p.m), static_cast<long long>(p.n), static_cast<long long>(p.k),
                  static_cast<long long>(items));
    ReportSm90Timeline(timeline, blocks, what, stream);
  }
  return status;
}

template <class TIn, class TOut>
cudaError_t LaunchSm90Gemm(const GemmProblem& given, int tile_m, int tile_n, int sm_count, cudaStream_t stream,
                           Sm90Workspace workspace) {
  // The swapped schedule multiplies D^T: A stored (m, k) becomes its K-major B.
  const bool swapped = Sm90SwappedTile(tile_m, tile_n);
  if (swapped && (sizeof(TIn) != 2 || given.trans_a || given.transposed_d)) return cudaErrorInvalidValue;
  const GemmProblem p = swapped ? Sm90Swapped(given) : given;
  int64_t stride_a = 0, stride_b = 0;
  if (!SingleBatchStride(p.batch, kOperandA, &stride_a) || !SingleBatchStride(p.batch, kOperandB, &stride_b)) {
    return cudaErrorInvalidValue;
  }
  const Sm90Batching batched{stride_a != 0 && p.batch.count > 1, stride_b != 0 && p.batch.count > 1};
  // Stored A is m x k (k x m when transposed), stored B k x n (n x k when transposed).
  TmaMatrix a{p.a, p.in_type, p.trans_a ? p.m : p.k, p.trans_a ? p.k : p.m, p.lda};
  TmaMatrix b{p.b, p.BType(), p.trans_b ? p.k : p.n, p.trans_b ? p.n : p.k, p.ldb};
  if (batched.a) a.batch = p.batch.count, a.batch_stride = stride_a;
  if (batched.b) b.batch = p.batch.count, b.batch_stride = stride_b;

  constexpr int kBytes = sizeof(TIn);
  constexpr bool kTf32 = kBytes == 4;
  constexpr bool kFp8 = kBytes == 1;  // (both operands K-major: no register A for 8-bit types)
  a.tf32 = b.tf32 = kTf32;
  if (kTf32 && !p.trans_b) return cudaErrorInvalidValue;  // B not K-major
  if (kFp8 && (p.trans_a || !p.trans_b)) return cudaErrorInvalidValue;

  cudaError_t status = cudaSuccess;
  auto launch = [&](auto policy, auto trans_a, auto trans_b) {
    using P = decltype(policy);
    constexpr bool kTransA = decltype(trans_a)::value, kTransB = decltype(trans_b)::value;
    Sm90MatrixLoads loads;
    loads.batched = batched;
    loads.a_rows = static_cast<int>(std::min<int64_t>(P::kBM, (p.m + 7) / 8 * 8));
    // A box: kBM rows of kBK k (one 128 B row each), or kMnBlock m x kBK k blocks; B
    // likewise with kBN (16-bit MN-major: 64 x 64 blocks).
    status = EncodeTmaMap(&loads.a, a, kTransA ? P::kMnBlock : P::kBK, kTransA ? P::kBK : loads.a_rows);
    if (status == cudaSuccess) {
      status = EncodeTmaMap(&loads.b, b, kTransB ? P::kBK : 64, kTransB ? P::kBN / P::kClusterM : P::kBK);
    }
    if (status == cudaSuccess) {
      status = LaunchSm90Kernel<P, TIn, TOut, kTransA, kTransB>(loads, p, sm_count, stream, workspace);
    }
  };
  auto with_layout = [&](auto policy) {
    using T = std::true_type;
    using F = std::false_type;
    if constexpr (decltype(policy)::kSwapped) {  // (B is K-major: LaunchSm90Gemm's check)
      p.trans_a ? launch(policy, T{}, T{}) : launch(policy, F{}, T{});
    } else if constexpr (kFp8) {
      launch(policy, F{}, T{});
    } else if constexpr (kTf32) {
      // An MN-major tf32 A comes from registers: one m64 block per consumer only.
      if (!p.trans_a) {
        launch(policy, F{}, T{});
      } else if constexpr (decltype(policy)::kMmaM == 1) {
        launch(policy, T{}, T{});
      } else {
        status = cudaErrorInvalidValue;
      }
    } else if (p.trans_a) {
      p.trans_b ? launch(policy, T{}, T{}) : launch(policy, T{}, F{});
    } else {
      p.trans_b ? launch(policy, F{}, T{}) : launch(policy, F{}, F{});
    }
  };
  bool named = false;
  ForEachSm90Schedule([&](auto row) {
    constexpr int kRow = decltype(row)::value;
    if (!kSm90Schedules[kRow].Is(tile_m, tile_n)) return;
    named = true;
    constexpr Sm90ScheduleRow kSchedule = kSm90Schedules[kRow];
    if constexpr (kTf32 ? kSchedule.tf32 : kFp8 ? kSchedule.fp8 : kSchedule.half) {
      with_layout(Sm90RowPolicy<kRow, kBytes>{});
    } else {
      status = cudaErrorInvalidValue;  // a schedule not built for this input type
    }
  });
  return named ? status : cudaErrorInvalidValue;
}

// LaunchSm90BlockScaledGemm's kernel for policy P (B's scales per row or per group).
template <class P, class TOut>
cudaError_t LaunchSm90BlockScaledPolicy(const GemmProblem& p, const BlockScales& scales, int sm_count,
                                        cudaStream_t stream) {
  // Every operand has the batch dim (stride 0 only where there is one batch index).
  const int64_t batch = p.batch.count;
  Sm90BlockScaledLoads loads;
  loads.matrix.batched = {batch > 1, batch > 1};
  loads.matrix.a_rows = static_cast<int>(std::min<int64_t>(P::kBM, (p.m + 7) / 8 * 8));
  TmaMatrix a{p.a, p.in_type, p.k, p.m, p.lda}, b{p.b, p.BType(), p.k, p.n, p.ldb};
  const int64_t b_scales = (p.n + scales.b_rows - 1) / scales.b_rows;
  TmaMatrix sa{scales.a, ElementType::kF32, p.m, scales.blocks, scales.pitch_a};
  TmaMatrix sb{scales.b, ElementType::kF32, b_scales, scales.blocks, scales.pitch_b};
  if (batch > 1) {
    a.batch = b.batch = sa.batch = sb.batch = batch;
    a.batch_stride = p.m * p.lda;
    b.batch_stride = p.n * p.ldb;
    sa.batch_stride = scales.blocks * scales.pitch_a;
    sb.batch_stride = scales.blocks * scales.pitch_b;
  }
  loads.scales.batched = batch > 1;
  loads.scales.block_k = static_cast<int>(scales.block_k);
  cudaError_t status = EncodeTmaMap(&loads.matrix.a, a, P::kBK, loads.matrix.a_rows);
  if (status == cudaSuccess) status = EncodeTmaMap(&loads.matrix.b, b, P::kBK, P::kBN);
  if (status == cudaSuccess) status = EncodeTmaMap(&loads.scales.a, sa, P::kBM, 1, /*swizzled=*/false);
  if (status == cudaSuccess) status = EncodeTmaMap(&loads.scales.b, sb, kSm90BScaleBox<P>, 1, /*swizzled=*/false);
  if (status != cudaSuccess) return status;
  // (TIn: the operands' formats, fp8_operands.h; e5m2 beside e4m3 for a gradient.)
  return WithFp8Operands(p.in_type, p.other_b_fp8, [&](auto formats) {
    return LaunchSm90Kernel<P, decltype(formats), TOut, false, true>(loads, p, sm_count, stream);
  });
}

template <class TOut>
cudaError_t LaunchSm90BlockScaledGemm(const GemmProblem& p, const BlockScales& scales, int sm_count,
                                      cudaStream_t stream) {
  const bool two_e5m2 = p.in_type == ElementType::kF8E5M2 && !p.other_b_fp8;
  const bool b_rows_ok = scales.b_rows == 1 || scales.b_rows == kBlockScaleGroupRows;
  if (!IsFloat8(p.in_type) || two_e5m2 || p.trans_a || !p.trans_b || p.split_k != 1 || p.batch.rank > 1 ||
      scales.block_k <= 0 || scales.block_k % Sm90BlockScaledPolicy::kBK != 0 || scales.pitch_a % 4 ||
      scales.pitch_b % 4 || !b_rows_ok || reinterpret_cast<uintptr_t>(scales.a) % 16 ||
      reinterpret_cast<uintptr_t>(scales.b) % 16) {
    return cudaErrorInvalidValue;
  }
  if (scales.b_rows == 1) return LaunchSm90BlockScaledPolicy<Sm90BlockScaledPolicy, TOut>(p, scales, sm_count, stream);
  return LaunchSm90BlockScaledPolicy<Sm90BlockScaledGroupsPolicy, TOut>(p, scales, sm_count, stream);
}

}  // namespace jaxgemm
