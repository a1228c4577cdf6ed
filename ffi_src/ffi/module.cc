// The Python extension: hands the FFI handlers to jaxgemm._ffi, which registers them with XLA.
#include <nanobind/nanobind.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "common/activation.h"
#include "common/element_type.h"
#include "conv/problem.h"
#include "conv/sm90_wgrad_split.h"
#include "ffi/handlers.h"
#include "gemm/kernel_family.h"
#include "gemm/problem.h"
#include "gemm/simt_tiles.h"
#include "gemm/sm90/grouped_items.h"
#include "gemm/sm90/grouped_problem.h"
#include "gemm/sm90/schedules.h"
#include "gemm/sm90/stream_k.h"
#if defined(JAXGEMM_WITH_CUDA)
#include "gemm/decode_launch.h"
#include "gemm/dispatch.h"
#endif

namespace nb = nanobind;

namespace {

// The grouped kernel's walk for `sizes` (grouped_items.h): the tables as the kernel builds
// them, then every block's items as (block, group, row0, row_end, n0, k_begin, k_end,
// k_tiles).
template <bool kContraction>
nb::list GroupedWalk(const std::vector<int64_t>& sizes, int32_t m, int32_t n, int32_t k, int32_t blocks) {
  using Items = jaxgemm::GroupedItemTable<jaxgemm::kGroupedTileM, jaxgemm::kGroupedTileN, jaxgemm::kGroupedTileK,
                                          kContraction>;
  const int32_t groups = static_cast<int32_t>(sizes.size());
  std::vector<int32_t> row_end(groups + 1), item_end(groups + 1);
  jaxgemm::GroupedRowEnds(sizes.data(), groups, m, row_end.data());
  Items items(row_end.data(), item_end.data(), groups, m, n, k);
  if constexpr (kContraction) {  // the groups longest first, ties in order (Sm90GroupedSchedule::Order)
    std::iota(item_end.begin(), item_end.begin() + groups, 0);
    auto length = [&](int32_t g) { return row_end[g] - items.RowBegin(g); };
    std::stable_sort(item_end.begin(), item_end.begin() + groups,
                     [&](int32_t a, int32_t b) { return length(a) > length(b); });
  } else {
    for (int32_t g = 0, total = 0; g <= groups; ++g) {
      total += items.GroupItems(row_end[g] - items.RowBegin(g));
      item_end[g] = total;
    }
  }
  nb::list walk;
  for (int32_t block = 0; block < blocks; ++block) {
    for (int32_t j = 0;; ++j) {
      const int32_t t = Items::Walk(j, block, blocks, kContraction);
      if (t >= items.Items()) break;
      const jaxgemm::GroupedWork w = items.Get(t);
      walk.append(nb::make_tuple(block, w.group, w.row0, w.row_end, w.n0, w.k_begin, w.k_end, w.k_tiles));
    }
  }
  return walk;
}

template <typename T>
nb::capsule EncapsulateFfiHandler(T* fn) {
  static_assert(std::is_invocable_r_v<XLA_FFI_Error*, T, XLA_FFI_CallFrame*>,
                "an FFI handler takes XLA_FFI_CallFrame* and returns XLA_FFI_Error*");
  return nb::capsule(reinterpret_cast<void*>(fn));
}

#if defined(JAXGEMM_WITH_CUDA)
// A problem with only what the heuristics look at set: its shape, and for tensor cores
// whether float32 inputs run as tf32 (otherwise 16-bit inputs), how A and B are stored
// (tf32 with A stored (k, m) takes it from registers: no pingpong schedules) and whether
// 16-bit inputs write a float32 product (twice the output bytes) or a 16-bit one; `fp8`:
// float8_e4m3fn inputs instead of 16-bit ones.
jaxgemm::GemmProblem ShapeOnly(int64_t m, int64_t n, int64_t k, int64_t batch, bool tf32 = false,
                               bool trans_a = false, bool trans_b = false, bool out_f32 = false, bool fp8 = false) {
  jaxgemm::GemmProblem p;
  p.in_type = tf32 ? jaxgemm::ElementType::kF32 : fp8 ? jaxgemm::ElementType::kF8E4M3 : jaxgemm::ElementType::kBF16;
  p.out_type = tf32 || out_f32 ? jaxgemm::ElementType::kF32 : jaxgemm::ElementType::kBF16;
  p.tf32 = tf32;
  p.trans_a = trans_a;
  p.trans_b = trans_b;
  p.m = m;
  p.n = n;
  p.k = k;
  p.batch.count = batch;
  return p;
}
#endif

// The FFI handlers of each platform, by call target name.
void DefineRegistrations(nb::module_& m) {
  m.def("cpu_registrations", []() {
    nb::dict d;
    d["jaxgemm_gemm"] = EncapsulateFfiHandler(JaxgemmGemmCpu);
    d["jaxgemm_bias_act_grad"] = EncapsulateFfiHandler(JaxgemmBiasActGradCpu);
    d["jaxgemm_conv"] = EncapsulateFfiHandler(JaxgemmConvCpu);
    d["jaxgemm_col2im"] = EncapsulateFfiHandler(JaxgemmCol2imCpu);
    d["jaxgemm_ragged_dot"] = EncapsulateFfiHandler(JaxgemmRaggedDotCpu);
    d["jaxgemm_ragged_epilogue"] = EncapsulateFfiHandler(JaxgemmRaggedEpilogueCpu);
    d["jaxgemm_ragged_glu"] = EncapsulateFfiHandler(JaxgemmRaggedGluCpu);
    d["jaxgemm_block_scaled_gemm"] = EncapsulateFfiHandler(JaxgemmBlockScaledGemmCpu);
    d["jaxgemm_fp8_amax"] = EncapsulateFfiHandler(JaxgemmFp8AmaxCpu);
    d["jaxgemm_fp8_quantize"] = EncapsulateFfiHandler(JaxgemmFp8QuantizeCpu);
    d["jaxgemm_fp8_block_quantize"] = EncapsulateFfiHandler(JaxgemmFp8BlockQuantizeCpu);
    return d;
  });
  m.def("cuda_registrations", []() {
    nb::dict d;
#if defined(JAXGEMM_WITH_CUDA)
    d["jaxgemm_gemm"] = EncapsulateFfiHandler(JaxgemmGemmCuda);
    d["jaxgemm_bias_act_grad"] = EncapsulateFfiHandler(JaxgemmBiasActGradCuda);
    d["jaxgemm_conv"] = EncapsulateFfiHandler(JaxgemmConvCuda);
    d["jaxgemm_col2im"] = EncapsulateFfiHandler(JaxgemmCol2imCuda);
    d["jaxgemm_ragged_dot"] = EncapsulateFfiHandler(JaxgemmRaggedDotCuda);
    d["jaxgemm_ragged_epilogue"] = EncapsulateFfiHandler(JaxgemmRaggedEpilogueCuda);
    d["jaxgemm_ragged_glu"] = EncapsulateFfiHandler(JaxgemmRaggedGluCuda);
    d["jaxgemm_block_scaled_gemm"] = EncapsulateFfiHandler(JaxgemmBlockScaledGemmCuda);
    d["jaxgemm_fp8_amax"] = EncapsulateFfiHandler(JaxgemmFp8AmaxCuda);
    d["jaxgemm_fp8_quantize"] = EncapsulateFfiHandler(JaxgemmFp8QuantizeCuda);
    d["jaxgemm_fp8_block_quantize"] = EncapsulateFfiHandler(JaxgemmFp8BlockQuantizeCuda);
#endif
    return d;
  });
}

// The FFI contract's ids, limits and tables, so that Python copies none of them by hand.
void DefineContract(nb::module_& m) {
  m.def("activation_ids", []() {
    nb::dict ids;
    for (const jaxgemm::ActivationName& a : jaxgemm::kActivationNames) ids[a.name] = static_cast<int>(a.id);
    return ids;
  });
  m.def("conv_kinds", []() {
    nb::dict kinds;
    kinds["fprop"] = static_cast<int>(jaxgemm::ConvKind::kFprop);
    kinds["dgrad"] = static_cast<int>(jaxgemm::ConvKind::kDgrad);
    kinds["wgrad"] = static_cast<int>(jaxgemm::ConvKind::kWgrad);
    return kinds;
  });
  m.attr("max_batch_dims") = jaxgemm::kMaxBatchDims;
  // jaxgemm_ragged_dot's `mode` ids and group limit (gemm/sm90/grouped_problem.h).
  m.def("grouped_modes", []() {
    nb::dict modes;
    modes["rows"] = static_cast<int>(jaxgemm::GroupedMode::kRows);
    modes["rows_rhs_t"] = static_cast<int>(jaxgemm::GroupedMode::kRowsRhsT);
    modes["contraction"] = static_cast<int>(jaxgemm::GroupedMode::kContraction);
    modes["rows_gated"] = static_cast<int>(jaxgemm::GroupedMode::kRowsGated);
    return modes;
  });
  m.attr("max_grouped_groups") = jaxgemm::kMaxGroupedGroups;
  m.attr("grouped_tile") = nb::make_tuple(jaxgemm::kGroupedTileM, jaxgemm::kGroupedTileN, jaxgemm::kGroupedTileK);
  // Kernel family name -> the id the FFI calls' `kernel` attribute takes (gemm/kernel_family.h).
  m.def("kernel_families", []() {
    nb::dict families;
    for (const jaxgemm::KernelFamilyName& f : jaxgemm::kKernelFamilyNames) {
      families[f.name] = static_cast<int>(f.family);
    }
    return families;
  });
  // The element types (common/element_type.h), one dict per row: Python's dtype sets.
  m.def("element_types", []() {
    nb::list rows;
    for (const jaxgemm::ElementInfo& e : jaxgemm::kElementInfo) {
      nb::dict row;
      row["name"] = e.name;
      row["bytes"] = e.bytes;
      row["float8"] = jaxgemm::IsFloat8(e.type);
      rows.append(row);
    }
    return rows;
  });
  // The GEMM epilogue's operands (gemm/problem.h), one dict per row, in table order.
  m.def("epilogue_operands", []() {
    nb::list rows;
    for (const jaxgemm::EpilogueOperandRow& o : jaxgemm::kEpilogueOperandRows) {
      nb::dict row;
      row["name"] = o.name;
      row["shape"] = o.shape == jaxgemm::OperandShape::kMatrix ? "matrix"
                     : o.shape == jaxgemm::OperandShape::kColumns ? "columns"
                                                                   : "rows";
      row["dtype"] = o.type == jaxgemm::OperandType::kFloat32 ? "float32" : "output";
      rows.append(row);
    }
    return rows;
  });
  // The SIMT tiles (gemm/simt_tiles.h), one dict per row, in table order.
  m.def("simt_tiles", []() {
    nb::list rows;
    for (const jaxgemm::SimtTile& t : jaxgemm::kSimtTiles) {
      nb::dict row;
      row["tile"] = nb::make_tuple(t.tile.bm, t.tile.bn);
      row["heuristic"] = t.heuristic;
      rows.append(row);
    }
    return rows;
  });
  // The sm90 kernel's schedules (gemm/sm90/schedules.h), one dict per row, in table order.
  m.def("sm90_schedules", []() {
    nb::list rows;
    for (const jaxgemm::Sm90ScheduleRow& s : jaxgemm::kSm90Schedules) {
      nb::dict row;
      row["tile"] = nb::make_tuple(s.tile_m, s.tile_n);
      row["cluster_m"] = s.cluster_m;
      row["consumers"] = s.consumers;
      row["pingpong"] = s.pingpong;
      row["swapped"] = s.swapped;
      row["half"] = s.half;
      row["tf32"] = s.tf32;
      row["fp8"] = s.fp8;
      row["block_scaled"] = s.block_scaled;
      row["conv_fprop"] = s.conv_fprop;
      row["conv_wgrad"] = s.conv_wgrad;
      rows.append(row);
    }
    return rows;
  });
}

// The kernels' work walks, for tests: the host copies of what the device code computes.
void DefineWalks(nb::module_& m) {
  // The grouped kernel's work items for these group sizes (gemm/sm90/grouped_items.h), for
  // tests: row modes or the contraction (the weight gradient), over `blocks` blocks.
  m.def("grouped_walk", [](std::vector<int64_t> sizes, int64_t m, int64_t n, int64_t k, bool contraction,
                           int32_t blocks) {
    if (sizes.empty() || static_cast<int64_t>(sizes.size()) > jaxgemm::kMaxGroupedGroups || m < 0 || n < 1 ||
        k < 1 || m >= INT32_MAX || n >= INT32_MAX || k >= INT32_MAX || blocks < 1) {
      throw nb::value_error("grouped_walk: 1 to max_grouped_groups sizes, m >= 0, n, k >= 1 (int32), blocks >= 1");
    }
    const int32_t m32 = static_cast<int32_t>(m), n32 = static_cast<int32_t>(n), k32 = static_cast<int32_t>(k);
    return contraction ? GroupedWalk<true>(sizes, m32, n32, k32, blocks)
                       : GroupedWalk<false>(sizes, m32, n32, k32, blocks);
  });
  // The sm90 conv weight gradient's split of N*P*Q (conv/sm90_wgrad_split.h).
  m.def("sm90_conv_wgrad_split", [](int64_t m, int64_t n, int64_t k, int sm_count) {
    return jaxgemm::Sm90ConvWgradSplit(m, n, k, sm_count);
  });
  // The sm90 kernel's stream-K walk (sm90/stream_k.h), for tests: every worker's pieces as
  // (worker, item, first k-tile, k-tiles, fixup, partners), for `sk_items` items of
  // `item_k_tiles` k-tiles shared out over `workers`.
  m.def("sm90_stream_k_walk", [](int32_t sk_items, int32_t item_k_tiles, int32_t workers) {
    if (sk_items < 1 || item_k_tiles < 1 || workers < 1 || int64_t{sk_items} * item_k_tiles >= (int64_t{1} << 31)) {
      throw nb::value_error("sm90_stream_k_walk: needs positive counts and fewer than 2^31 k-tiles");
    }
    const int64_t sk_k_tiles = int64_t{sk_items} * item_k_tiles;
    const jaxgemm::FastDivmod item_k(item_k_tiles);
    nb::list pieces;
    for (int32_t w = 0; w < workers; ++w) {
      const int32_t begin = jaxgemm::Sm90StreamKBegin(sk_k_tiles, w, workers);
      const int32_t end = jaxgemm::Sm90StreamKBegin(sk_k_tiles, w + 1, workers);
      for (int32_t iter = begin; iter < end;) {
        const jaxgemm::Sm90StreamKPiece piece =
            jaxgemm::Sm90StreamKPieceAt(sk_k_tiles, workers, w, begin, iter, end, item_k);
        pieces.append(nb::make_tuple(w, piece.item, piece.first_k, piece.k_tiles, piece.fixup, piece.partners));
        iter += piece.k_tiles;
      }
    }
    return pieces;
  });
}

#if defined(JAXGEMM_WITH_CUDA)
// The heuristic's choices, for the lowering (split-K, workspace) and for tests that must
// cover every kernel it can pick; the device's properties.
void DefineHeuristicQueries(nb::module_& m) {
  m.def("simt_config", [](int64_t m, int64_t n, int64_t k, int64_t batch, int sm_count) {
    jaxgemm::GemmProblem p = ShapeOnly(m, n, k, batch);
    p.split_k = jaxgemm::ChooseSplitK(p, sm_count);
    const jaxgemm::SimtChoice c = jaxgemm::ChooseSimtTile(p, sm_count);
    return nb::make_tuple(c.bm, c.bn, p.split_k);
  });
  m.def("tensor_core_split_k", [](int64_t m, int64_t n, int64_t k, int64_t batch, int sm_count, bool tf32,
                                  bool trans_a, bool trans_b, bool out_f32) {
    return jaxgemm::ChooseTensorCoreSplitK(ShapeOnly(m, n, k, batch, tf32, trans_a, trans_b, out_f32), sm_count,
                                           jaxgemm::CurrentDeviceComputeCapability() == 90);
  });
  // The decode kernel's launch plan for a 16-bit problem: (column blocks, cluster size).
  m.def("decode_plan", [](int64_t m, int64_t n, int64_t k, int64_t batch, int sm_count) {
    const jaxgemm::DecodePlan plan = jaxgemm::PlanDecode(ShapeOnly(m, n, k, batch), sm_count);
    return nb::make_tuple(plan.column_blocks, plan.cluster);
  });
  // The sm90 heuristic's choice for a problem, without a device: (tile_m, tile_n, split_k).
  auto choice = [](jaxgemm::GemmProblem p, int sm_count) {
    p.split_k = jaxgemm::ChooseTensorCoreSplitK(p, sm_count, true);
    const jaxgemm::Sm90Tile t = jaxgemm::ChooseSm90Tile(p, sm_count);
    return nb::make_tuple(t.m, t.n, p.split_k);
  };
  m.def("sm90_choice", [choice](int64_t m, int64_t n, int64_t k, int64_t batch, int sm_count, bool tf32,
                                bool trans_a, bool trans_b, bool out_f32) {
    return choice(ShapeOnly(m, n, k, batch, tf32, trans_a, trans_b, out_f32), sm_count);
  });
  // The same for an fp8 product (both operands K-major, bf16 result) with or without Aux
  // (fp8.dense's forward writes z beside y), whose fused epilogue costs the cooperative
  // tiles more.
  m.def("sm90_choice_fp8", [choice](int64_t m, int64_t n, int64_t k, int sm_count, bool aux) {
    jaxgemm::GemmProblem p = ShapeOnly(m, n, k, 1, false, false, true, false, true);
    static char aux_tag;  // (only whether Aux is there matters to the pick)
    if (aux) p.epilogue.aux = &aux_tag;
    return choice(p, sm_count);
  });
  // The SMs the heuristic's sm90 grid is planned for, at the problem's split (sm90_choice's):
  // fewer than sm_count where few-row items are shared out stream-K instead of split.
  m.def("sm90_grid_sms", [](int64_t m, int64_t n, int64_t k, int64_t batch, int sm_count, int64_t split_k,
                            bool tf32, bool trans_a, bool trans_b) {
    jaxgemm::GemmProblem p = ShapeOnly(m, n, k, batch, tf32, trans_a, trans_b);
    p.split_k = split_k;
    return jaxgemm::Sm90GridSms(p, sm_count);
  });
  // The workspace a GEMM call may use (stream-K, or the dynamic walk's counter), for the
  // lowering to allocate: the call's shape, split, requested kernel family id and tile (0:
  // the heuristic's), as stored.
  m.def("gemm_workspace_bytes", [](int64_t m, int64_t n, int64_t k, int64_t batch, int sm_count, int64_t split_k,
                                   int kernel, int tile_m, int tile_n, bool tf32, bool trans_a, bool trans_b,
                                   bool out_f32, bool dynamic_tiles, bool fp8) {
    jaxgemm::GemmProblem p = ShapeOnly(m, n, k, batch, tf32, trans_a, trans_b, out_f32, fp8);
    p.split_k = split_k;
    jaxgemm::KernelRequest request{static_cast<jaxgemm::KernelFamily>(kernel), tile_m, tile_n};
    request.dynamic_tiles = dynamic_tiles;
    return jaxgemm::GemmWorkspaceBytes(p, sm_count, request);
  });
  m.def("cuda_compute_capability", &jaxgemm::CurrentDeviceComputeCapability);
  m.def("cuda_sm_count", &jaxgemm::CurrentDeviceSmCount);
  m.def("kernel_sm_count", &jaxgemm::KernelSmCount);
}
#endif

}  // namespace

NB_MODULE(_jaxgemm, m) {
  DefineRegistrations(m);
  DefineContract(m);
  DefineWalks(m);
#if defined(JAXGEMM_WITH_CUDA)
  DefineHeuristicQueries(m);
#endif
  m.attr("with_cuda") =
#if defined(JAXGEMM_WITH_CUDA)
      true;
#else
      false;
#endif
}
