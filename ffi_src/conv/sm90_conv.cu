#include "conv/sm90_conv.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>
#include <vector>

#include "common/element_dispatch.cuh"
#include "conv/implicit_gemm.h"
#include "conv/sm90_conv_loads.cuh"
#include "conv/sm90_conv_wgrad_loads.cuh"
#include "conv/sm90_wgrad_split.h"
#include "gemm/dispatch.h"
#include "gemm/sm90/tensor_map.h"

namespace jaxgemm {
namespace {

// The im2col bounding box of one spatial dim: starts at -pad (the first output pixel's
// window), and is (P - 1) * stride + 1 long, so the walk visits exactly P positions per
// row before it wraps (the upper corner is relative to the last input pixel).
struct BoxCorners {
  int64_t lower, upper;
};

BoxCorners Corners(int64_t size, int64_t out, int64_t stride, int64_t pad) {
  return {-pad, (out - 1) * stride + 1 - size - pad};
}

bool InCornerRange(int64_t v) { return v >= -128 && v <= 127; }

int64_t ChannelBlocks(const ConvProblem& p) { return (p.c + 63) / 64; }

// What every sm90 conv kernel needs: 16-bit operands, groups = 1, 16-byte TMA rows and
// bases, 32-bit sizes, and a bounding box and filter offsets the 4-D im2col map can hold.
bool Sm90Im2colFits(const ConvProblem& p) {
  if (p.in_type == ElementType::kF32 || p.groups != 1) return false;
  if (p.c <= 0 || p.c % 8 != 0 || p.k % 8 != 0 || p.p < 1 || p.q < 1) return false;
  if (reinterpret_cast<uintptr_t>(p.a) % 16 != 0 || reinterpret_cast<uintptr_t>(p.b) % 16 != 0) return false;
  const int64_t lim = int64_t{1} << 30;
  if (p.n * p.p * p.q >= lim || p.n * p.h * p.w >= lim || p.k >= lim || p.r * p.s * ChannelBlocks(p) * 64 >= lim) {
    return false;
  }
  if (p.stride_h > 8 || p.stride_w > 8) return false;
  // Filter offsets (unsigned 16-bit in the instruction) kept within the corners' range.
  if ((p.r - 1) * p.dil_h > 127 || (p.s - 1) * p.dil_w > 127) return false;
  const BoxCorners h = Corners(p.h, p.p, p.stride_h, p.pad_h), w = Corners(p.w, p.q, p.stride_w, p.pad_w);
  return InCornerRange(h.lower) && InCornerRange(h.upper) && InCornerRange(w.lower) && InCornerRange(w.upper);
}

// x read in im2col mode, `pixels` output pixels x 64 channels per load.
cudaError_t EncodeIm2colX(const ConvProblem& c, int pixels, CUtensorMap* map) {
  const BoxCorners h = Corners(c.h, c.p, c.stride_h, c.pad_h), w = Corners(c.w, c.q, c.stride_w, c.pad_w);
  TmaIm2col x{c.a, c.in_type, c.n, c.h, c.w, c.c, int(h.lower), int(w.lower), int(h.upper), int(w.upper),
              int(c.stride_h), int(c.stride_w), 64, pixels};
  return EncodeIm2colTmaMap(map, x);
}

// One output phase (py, px) of a strided dgrad (DgradPhases, conv/implicit_gemm.h: only
// phases with dx pixels) as the forward conv the fprop loads run: x = dy (N, P, Q, K),
// stride 1, the phase's taps as an R' x S' filter walked in reverse (offsets
// (R' - 1 - t) * step rising from the last tap's, where the phase GEMM's negative dilation
// walks them falling), output = the phase's pixel grid, B = the phase's block of w^T.
// `has_taps` is false when the phase has no taps (its dx pixels are zeros).
struct DgradPhase {
  ConvProblem fprop;
  int64_t py, px;
  bool has_taps;
};

std::vector<DgradPhase> DgradPhasesAsFprop(const ConvProblem& c) {
  std::vector<DgradPhase> phases;
  for (const ConvGemm& g : DgradPhases(c)) {
    DgradPhase ph{c, g.phase_y, g.phase_x, g.k > 0};
    ConvProblem& f = ph.fprop;
    f.kind = ConvKind::kFprop;
    f.h = c.p, f.w = c.q, f.c = c.k;  // dy is the image
    f.k = c.c;
    f.p = g.o_h, f.q = g.o_w;
    f.r = g.r, f.s = g.s;
    f.stride_h = f.stride_w = 1;
    f.pad_h = g.pad_h - (g.r - 1) * g.dil_h, f.pad_w = g.pad_w - (g.s - 1) * g.dil_w;
    f.dil_h = -g.dil_h, f.dil_w = -g.dil_w;
    f.b = g.b;
    f.epilogue = EpilogueParams{};
    phases.push_back(ph);
  }
  return phases;
}

}  // namespace

bool Sm90ConvSupports(const ConvProblem& p) {
  switch (p.kind) {
    case ConvKind::kFprop:
      return Sm90Im2colFits(p);
    case ConvKind::kWgrad:  // a 64-row block of dw must be one tap's channels
      return Sm90Im2colFits(p) && p.c % 64 == 0;
    case ConvKind::kDgrad:  // every phase a forward conv the fprop kernel takes
      if (p.in_type == ElementType::kF32 || p.groups != 1 || p.c % 8 != 0 || p.k % 8 != 0) return false;
      if (p.n * p.h * p.w >= (int64_t{1} << 30)) return false;
      for (const DgradPhase& ph : DgradPhasesAsFprop(p)) {
        if (!ph.has_taps || !Sm90Im2colFits(ph.fprop)) return false;
      }
      return true;
  }
  return false;
}

bool Sm90ConvPreferred(const ConvProblem& p) {
  // dgrad: dy's K channels are gathered; its GEMM is C wide, and below 64 a 128-wide tile
  // is mostly idle (the first layer's dx: 8 of 128 columns measured 2.5x slower than sm80).
  if (p.kind == ConvKind::kDgrad) return p.k >= 32 && p.c >= 64;
  return p.c >= 32;
}

namespace {

// The fprop loads and GEMM of a forward conv (c.kind == kFprop); *encoded as for the runs.
cudaError_t PrepareFprop(const ConvProblem& c, Sm90ConvFpropLoads* loads, GemmProblem* gemm, bool* encoded) {
  *encoded = false;
  const int64_t c_blocks = ChannelBlocks(c);
  GemmProblem& p = *gemm;
  p.m = c.n * c.p * c.q;
  p.n = c.k;
  p.k = c.r * c.s * c_blocks * 64;
  p.lda = c.c;
  p.ldb = c.k;
  p.ldd = c.k;
  p.in_type = c.in_type;
  p.out_type = c.out_type;
  p.a = c.a;
  p.b = c.b;
  p.d = c.out;
  p.epilogue = c.epilogue;

  cudaError_t status = EncodeIm2colX(c, 128, &loads->x);
  if (status != cudaSuccess) return status;
  // w (R, S, C, K) as R*S matrices of C rows x K columns.
  TmaMatrix wm{c.b, c.in_type, c.k, c.c, c.k};
  if (c.r * c.s > 1) wm.batch = c.r * c.s, wm.batch_stride = c.c * c.k;
  status = EncodeTmaMap(&loads->w, wm, 64, 64);
  if (status != cudaSuccess) return status;
  *encoded = true;
  loads->w_3d = c.r * c.s > 1;
  loads->div_pq = FastDivmod(static_cast<int32_t>(c.p * c.q));
  loads->div_q = FastDivmod(static_cast<int32_t>(c.q));
  loads->stride_h = int32_t(c.stride_h), loads->stride_w = int32_t(c.stride_w);
  loads->pad_h = int32_t(c.pad_h), loads->pad_w = int32_t(c.pad_w);
  loads->dil_h = int32_t(c.dil_h), loads->dil_w = int32_t(c.dil_w);
  loads->s = int32_t(c.s);
  loads->taps = int32_t(c.r * c.s);
  loads->c_blocks = int32_t(c_blocks);
  return cudaSuccess;
}

bool Sm90NarrowTile(const GemmProblem& p) { return Sm90ConvTileN(p.n) == 64; }

cudaError_t LaunchFprop(const ConvProblem& c, const Sm90ConvFpropLoads& loads, const GemmProblem& p, int sm_count,
                        cudaStream_t stream) {
  // The conv loads do not multicast: the GEMM's cluster schedule becomes its 128 x 256 tile.
  const int tile_n = Sm90NarrowTile(p) ? 64 : ChooseSm90Tile(p, sm_count, false).n;
  return WithElementTypes(c.in_type, c.out_type, [&](auto in, auto out) {
    using TIn = typename decltype(in)::type;
    if constexpr (std::is_same_v<TIn, float>) {
      return cudaErrorInvalidValue;  // (16-bit only: Sm90ConvSupports)
    } else {
      return LaunchSm90ConvFprop<TIn, typename decltype(out)::type>(loads, p, tile_n, sm_count, stream);
    }
  });
}

}  // namespace

cudaError_t RunSm90ConvFprop(const ConvProblem& c, int sm_count, cudaStream_t stream, bool* encoded) {
  Sm90ConvFpropLoads loads;
  GemmProblem p;
  const cudaError_t status = PrepareFprop(c, &loads, &p, encoded);
  return status != cudaSuccess ? status : LaunchFprop(c, loads, p, sm_count, stream);
}

cudaError_t RunSm90ConvDgrad(const ConvProblem& c, int sm_count, cudaStream_t stream, bool* encoded) {
  // Every map first, so a map the driver rejects leaves nothing launched.
  std::vector<DgradPhase> phases = DgradPhasesAsFprop(c);
  std::vector<Sm90ConvFpropLoads> loads(phases.size());
  std::vector<GemmProblem> gemms(phases.size());
  for (size_t i = 0; i < phases.size(); ++i) {
    const cudaError_t status = PrepareFprop(phases[i].fprop, &loads[i], &gemms[i], encoded);
    if (status != cudaSuccess) return status;
    *encoded = false;
    Sm90ConvFpropLoads& l = loads[i];
    l.reverse_taps = true;
    l.phased = true;
    l.dx_h = int32_t(c.h), l.dx_w = int32_t(c.w);
    l.phase_y = int32_t(phases[i].py), l.phase_x = int32_t(phases[i].px);
    l.step_y = int32_t(c.stride_h), l.step_x = int32_t(c.stride_w);
  }
  *encoded = true;
  for (size_t i = 0; i < phases.size(); ++i) {
    const cudaError_t status = LaunchFprop(phases[i].fprop, loads[i], gemms[i], sm_count, stream);
    if (status != cudaSuccess) return status;
  }
  return cudaSuccess;
}

cudaError_t RunSm90ConvWgrad(const ConvProblem& c, int sm_count, cudaStream_t stream, bool* encoded) {
  *encoded = false;
  GemmProblem p;
  p.m = c.r * c.s * c.c;
  p.n = c.k;
  p.k = c.n * c.p * c.q;
  p.trans_a = true;
  p.split_k = c.split;
  p.ldd = c.k;
  p.in_type = c.in_type;
  p.out_type = ElementType::kF32;
  p.a = c.a;
  p.b = c.b;
  p.d = c.out;  // partial s at s * m * n: the (split, R, S, C, K) layout

  Sm90ConvWgradLoads loads;
  cudaError_t status = EncodeIm2colX(c, 64, &loads.x);
  if (status != cudaSuccess) return status;
  status = EncodeTmaMap(&loads.dy, TmaMatrix{c.b, c.in_type, c.k, p.k, c.k}, 64, 64);
  if (status != cudaSuccess) return status;
  *encoded = true;
  loads.div_pq = FastDivmod(static_cast<int32_t>(c.p * c.q));
  loads.div_q = FastDivmod(static_cast<int32_t>(c.q));
  loads.div_c = FastDivmod(static_cast<int32_t>(c.c));
  loads.div_s = FastDivmod(static_cast<int32_t>(c.s));
  loads.taps = static_cast<int32_t>(c.r * c.s);
  loads.stride_h = int32_t(c.stride_h), loads.stride_w = int32_t(c.stride_w);
  loads.pad_h = int32_t(c.pad_h), loads.pad_w = int32_t(c.pad_w);
  loads.dil_h = int32_t(c.dil_h), loads.dil_w = int32_t(c.dil_w);
  const int tile_n = Sm90ConvTileN(p.n);
  // (float32 partial sums, whatever the conv's output)
  return WithElementTypes(c.in_type, ElementType::kF32, [&](auto in, auto) {
    using TIn = typename decltype(in)::type;
    if constexpr (std::is_same_v<TIn, float>) {
      return cudaErrorInvalidValue;  // (16-bit only: Sm90ConvSupports)
    } else {
      return LaunchSm90ConvWgrad<TIn>(loads, p, tile_n, sm_count, stream);
    }
  });
}

}  // namespace jaxgemm
