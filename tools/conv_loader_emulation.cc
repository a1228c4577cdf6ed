// Checks the conv kernels' operand loaders and output addressing on the host, without a
// GPU: the real loader code (ffi_src/conv/*_loaders.cuh, SimtTileLoader, Sm80Tile's B
// loader), compiled by g++ with cp.async / __ldg / threadIdx mocked (tools/conv_mock),
// runs every thread of every (group, split, tile) for every k-tile; the staged
// shared-memory tiles are read back through the mainloops' layouts (Sm80Tile's swizzle,
// SimtTileMap's padded K-major rows), multiplied on the host, and written through the
// kernels' epilogue (ConvOutOffsets + GemmEpilogue::Store, bias + relu + residual + aux for
// fprop); the result must equal CpuConv exactly (small integer data). Covers the index
// math, edges, predication and alignment that no CPU test reaches.
//
//   g++ -std=c++17 -O2 -I tools/conv_mock -I ffi_src -I $CUDA_HOME/include \
//       tools/conv_loader_emulation.cc ffi_src/conv/cpu_conv.cc ffi_src/gemm/cpu_epilogue.cc \
//       -o /tmp/conv_emu && /tmp/conv_emu
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

struct MockDim {
  unsigned x = 0, y = 0, z = 0;
};
MockDim threadIdx;
template <class T>
T __ldg(const T* p) {
  return *p;
}

#include "conv/cpu_conv.h"
#include "conv/implicit_gemm.h"
#include "conv/simt_conv_loaders.cuh"
#include "conv/slab.cuh"
#include "conv/sm80_conv_loaders.cuh"
#include "gemm/simt_policy.h"
#include "gemm/simt_tile_loader.cuh"
#include "gemm/sm80_tile.cuh"

namespace jaxgemm {
namespace {

// Emulates one kernel family: for each slab and output tile, `Stage()` fills the shared
// tiles of the next k-tile (all threads), `ReadA(i, k)` / `ReadB(k, j)` read them back; the
// products go through the kernels' epilogue (ConvOutOffsets + GemmEpilogue::Store) into
// g.out.
template <class Family, bool kPhased>
void RunFamily(const ConvGemm& g) {
  constexpr int kW = Family::kStoreWidth;
  const bool vector_ok = ConvVectorStore<float, kW>(g);
  for (int64_t z = 0; z < g.groups * g.split; ++z) {
    const int64_t group = z / g.split, part = z % g.split;
    int64_t k_begin, k_size;
    ConvChunk(g, part, &k_begin, &k_size);
    const GemmEpilogue<float>::Offsets off = ConvOutOffsets<float>(g, group, part);
    for (int64_t m0 = 0; m0 < g.m; m0 += Family::kBM) {
      for (int64_t n0 = 0; n0 < g.n; n0 += Family::kBN) {
        Family f(g, group, m0, n0, k_begin, k_size);
        std::vector<double> acc(Family::kBM * Family::kBN, 0.0);
        const int64_t k_tiles = (k_size + Family::kBK - 1) / Family::kBK;
        for (int64_t t = 0; t < k_tiles; ++t) {
          f.Stage();
          for (int i = 0; i < Family::kBM; ++i)
            for (int kk = 0; kk < Family::kBK; ++kk) {
              const float a = f.ReadA(i, kk);
              if (a == 0.f) continue;
              for (int j = 0; j < Family::kBN; ++j) acc[i * Family::kBN + j] += double(a) * f.ReadB(kk, j);
            }
        }
        for (int i = 0; i < Family::kBM && m0 + i < g.m; ++i)
          for (int j = 0; j < Family::kBN && n0 + j < g.n; j += kW) {
            float v[kW];
            for (int q = 0; q < kW; ++q) v[q] = static_cast<float>(acc[i * Family::kBN + j + q]);
            const int64_t out_row = g.OutRow<kPhased>(m0 + i);
            if (vector_ok && (off.out + out_row * g.out.ldd + n0 + j) % kW != 0) {
              std::printf("misaligned vector store\n");
              std::abort();
            }
            GemmEpilogue<float>::Store<kW>(g.out, off, out_row, n0 + j, v, vector_ok);
          }
      }
    }
  }
}

// bf16 bits of small integers are exact: the sm80 family stages raw 16-bit words.
float Bits(uint16_t b) { return Bf16BitsToFloat(b); }

template <int kTileN, ConvKind kKind>
struct Sm80Family {
  static constexpr int kBM = 128, kBN = kTileN, kBK = 32, kThreads = 256, kStoreWidth = 2;
  static constexpr bool kWgrad = kKind == ConvKind::kWgrad;
  using TileA = Sm80Tile<uint16_t, kBM, kBK, kThreads, !kWgrad>;
  using TileB = Sm80Tile<uint16_t, kBN, kBK, kThreads, false>;
  using LoaderA = std::conditional_t<kWgrad, Sm80WgradLoader<uint16_t, TileA>, Sm80Im2colLoader<uint16_t, TileA>>;
  std::vector<LoaderA> la;
  std::vector<typename TileB::Loader> lb;
  std::vector<uint16_t> sa = std::vector<uint16_t>(TileA::kElems), sb = std::vector<uint16_t>(TileB::kElems);

  Sm80Family(const ConvGemm& g, int64_t group, int64_t m0, int64_t n0, int64_t k_begin, int64_t k_size) {
    const uint16_t* b = static_cast<const uint16_t*>(g.b) + group * g.n + n0 + k_begin * g.ldb;
    for (unsigned t = 0; t < kThreads; ++t) {
      threadIdx.x = t;
      if constexpr (kWgrad) {
        la.emplace_back(g, group, m0, k_begin, k_size);
      } else {
        la.emplace_back(g, group, m0);
      }
      lb.emplace_back(b, g.ldb, g.n - n0, k_size);
    }
  }
  void Stage() {
    std::fill(sa.begin(), sa.end(), 0x7fc0);  // NaN: a chunk nobody writes shows
    std::fill(sb.begin(), sb.end(), 0x7fc0);
    for (unsigned t = 0; t < kThreads; ++t) {
      threadIdx.x = t;
      la[t].IssueNext(sa.data());
      lb[t].IssueNext(sb.data());
    }
  }
  float ReadA(int i, int k) const {
    return Bits(sa[kWgrad ? TileA::OffsetOf(i & ~7, k) + (i & 7) : TileA::OffsetOf(i, k & ~7) + (k & 7)]);
  }
  float ReadB(int k, int j) const { return Bits(sb[TileB::OffsetOf(j & ~7, k) + (j & 7)]); }
};

template <class Policy, ConvKind kKind, bool kVec>
struct SimtFamily {
  static constexpr int kBM = Policy::kBM, kBN = Policy::kBN, kBK = Policy::kBK, kThreads = Policy::kThreads;
  static constexpr int kStoreWidth = 4;
  using LoaderA = std::conditional_t<kKind == ConvKind::kWgrad, SimtWgradLoader<float, kBM, kBK, kThreads, kVec>,
                                     SimtIm2colLoader<float, kBM, kBK, kThreads, kVec>>;
  using LoaderB = SimtTileLoader<float, kBN, kBK, kThreads, false, kVec>;
  static constexpr int kStrideA = kBM + 4, kStrideB = kBN + 4;
  std::vector<LoaderA> la;
  std::vector<LoaderB> lb;
  std::vector<float> sa = std::vector<float>(kBK * kStrideA), sb = std::vector<float>(kBK * kStrideB);

  SimtFamily(const ConvGemm& g, int64_t group, int64_t m0, int64_t n0, int64_t k_begin, int64_t k_size) {
    const float* b = static_cast<const float*>(g.b) + group * g.n + n0 + k_begin * g.ldb;
    for (unsigned t = 0; t < kThreads; ++t) {
      threadIdx.x = t;
      if constexpr (kKind == ConvKind::kWgrad) {
        la.emplace_back(g, group, m0, k_begin, k_size);
      } else {
        la.emplace_back(g, group, m0);
      }
      lb.emplace_back(b, g.ldb, g.n - n0, k_size);
    }
  }
  void Stage() {
    std::fill(sa.begin(), sa.end(), std::nanf(""));
    std::fill(sb.begin(), sb.end(), std::nanf(""));
    for (unsigned t = 0; t < kThreads; ++t) {
      threadIdx.x = t;
      la[t].LoadNext();
      lb[t].LoadNext();
    }
    for (unsigned t = 0; t < kThreads; ++t) {
      threadIdx.x = t;
      la[t].Store(sa.data());
      lb[t].Store(sb.data());
    }
  }
  float ReadA(int i, int k) const { return sa[k * kStrideA + i]; }
  float ReadB(int k, int j) const { return sb[k * kStrideB + j]; }
};

struct Case {
  int64_t n, h, w, c, k, r, s, sh, sw, ph, pw, dh, dw, groups, split;
};

int64_t OutSize(int64_t in, int64_t taps, int64_t stride, int64_t pad, int64_t dil) {
  const int64_t span = in + 2 * pad - (taps - 1) * dil - 1;
  return span < 0 ? 0 : span / stride + 1;
}

int failures = 0;

// Runs one kind through `Family` (float data when kFloat, bf16 bits otherwise).
template <class Family, bool kFloat>
void Check(const Case& cs, ConvKind kind, const char* name, std::mt19937& rng) {
  ConvProblem p;
  p.kind = kind;
  p.n = cs.n, p.h = cs.h, p.w = cs.w, p.c = cs.c, p.k = cs.k, p.r = cs.r, p.s = cs.s;
  p.stride_h = cs.sh, p.stride_w = cs.sw, p.pad_h = cs.ph, p.pad_w = cs.pw, p.dil_h = cs.dh, p.dil_w = cs.dw;
  p.groups = cs.groups;
  p.p = OutSize(cs.h, cs.r, cs.sh, cs.ph, cs.dh), p.q = OutSize(cs.w, cs.s, cs.sw, cs.pw, cs.dw);
  p.split = kind == ConvKind::kWgrad ? cs.split : 1;
  p.in_type = kFloat ? ElementType::kF32 : ElementType::kBF16;
  p.out_type = ElementType::kF32;
  const int64_t cg = p.Cg(), kg = p.Kg();
  int64_t a_count = 0, b_count = 0, out_count = 0;
  switch (kind) {
    case ConvKind::kFprop: a_count = p.n * p.h * p.w * p.c, b_count = p.r * p.s * cg * p.k, out_count = p.n * p.p * p.q * p.k; break;
    case ConvKind::kDgrad: a_count = p.n * p.p * p.q * p.k, b_count = p.r * p.s * kg * p.c, out_count = p.n * p.h * p.w * p.c; break;
    case ConvKind::kWgrad: a_count = p.n * p.h * p.w * p.c, b_count = p.n * p.p * p.q * p.k, out_count = p.split * p.r * p.s * cg * p.k; break;
  }
  std::uniform_int_distribution<int> dist(-3, 3);
  std::vector<float> af(a_count), bf(b_count);
  std::vector<uint16_t> ah(a_count), bh(b_count);
  for (int64_t i = 0; i < a_count; ++i) af[i] = float(dist(rng)), ah[i] = FloatToBf16Bits(af[i]);
  for (int64_t i = 0; i < b_count; ++i) bf[i] = float(dist(rng)), bh[i] = FloatToBf16Bits(bf[i]);
  std::vector<float> ref(out_count), ref_aux(out_count), got(out_count, std::nanf("")), got_aux(out_count, std::nanf(""));
  std::vector<float> bias(p.k), residual(kind == ConvKind::kFprop ? out_count : 0);
  for (float& v : bias) v = float(dist(rng));
  for (float& v : residual) v = float(dist(rng));
  if (kind == ConvKind::kFprop) {  // fprop carries the whole epilogue: bias, relu, residual, aux
    p.epilogue.activation = Activation::kRelu;
    p.epilogue.operand[kEpilogueBias] = bias.data();
    p.epilogue.operand[kEpilogueResidual] = residual.data();
  }
  p.a = kFloat ? static_cast<const void*>(af.data()) : ah.data();
  p.b = kFloat ? static_cast<const void*>(bf.data()) : bh.data();
  p.out = ref.data();
  p.epilogue.aux = kind == ConvKind::kFprop ? ref_aux.data() : nullptr;
  CpuConv(p);
  p.out = got.data();
  p.epilogue.aux = kind == ConvKind::kFprop ? got_aux.data() : nullptr;
  if (kind == ConvKind::kDgrad) {  // one GEMM per output phase, as RunConv launches them
    for (const ConvGemm& g : DgradPhases(p)) RunFamily<Family, true>(g);
  } else {
    RunFamily<Family, false>(MakeConvGemm(p));
  }
  int64_t bad = 0;
  for (int64_t i = 0; i < out_count; ++i) {
    bad += got[i] != ref[i];
    if (kind == ConvKind::kFprop) bad += got_aux[i] != ref_aux[i];
  }
  if (bad) {
    ++failures;
    std::printf("FAIL %-40s n%ld h%ld w%ld c%ld k%ld r%ld s%ld stride %ld,%ld pad %ld,%ld dil %ld,%ld g%ld split %ld: %ld of %ld\n",
                name, cs.n, cs.h, cs.w, cs.c, cs.k, cs.r, cs.s, cs.sh, cs.sw, cs.ph, cs.pw, cs.dh, cs.dw, cs.groups,
                p.split, bad, out_count);
  }
}

}  // namespace
}  // namespace jaxgemm

int main() {
  using namespace jaxgemm;
  std::mt19937 rng(7);
  // n, h, w, c, k, r, s, sh, sw, ph, pw, dh, dw, groups, split
  const Case tc[] = {  // channels per group multiples of 8 (the tensor-core path)
      {2, 9, 11, 16, 24, 3, 3, 1, 1, 1, 1, 1, 1, 1, 3},
      {1, 13, 12, 8, 136, 3, 3, 2, 2, 1, 1, 1, 1, 1, 2},
      {3, 10, 7, 40, 16, 3, 2, 2, 1, 0, 1, 2, 1, 1, 5},
      {2, 8, 8, 32, 64, 1, 1, 2, 2, 0, 0, 1, 1, 2, 1},
      {1, 12, 13, 48, 48, 5, 3, 3, 2, 2, 1, 1, 2, 3, 2},
      {2, 7, 7, 64, 64, 3, 3, 1, 1, -1, 2, 1, 1, 8, 4},
      {2, 11, 10, 8, 16, 3, 3, 3, 3, 2, 2, 3, 3, 1, 2},   // stride = dilation: empty phases
      {1, 9, 13, 16, 8, 3, 2, 4, 5, 1, 0, 1, 1, 1, 1},    // stride > filter
      {3, 1, 2, 8, 24, 3, 3, 2, 3, 1, 1, 1, 1, 1, 1},     // images smaller than the stride
  };
  const Case any[] = {  // any channel counts (SIMT)
      {2, 9, 11, 3, 5, 3, 3, 1, 1, 1, 1, 1, 1, 1, 3},
      {1, 13, 12, 6, 9, 3, 3, 2, 2, 1, 1, 1, 1, 3, 2},
      {2, 10, 9, 8, 12, 3, 2, 2, 3, 0, 1, 2, 1, 2, 5},
      {2, 7, 8, 4, 132, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1},
      {1, 15, 14, 3, 8, 7, 7, 2, 2, 3, 3, 1, 1, 1, 2},
      {3, 8, 8, 12, 20, 3, 3, 2, 1, -1, 2, 1, 2, 4, 3},
      {2, 11, 10, 5, 7, 3, 3, 3, 3, 2, 2, 3, 3, 1, 2},
      {1, 9, 13, 3, 6, 3, 2, 4, 5, 1, 0, 1, 1, 1, 1},
      {3, 1, 2, 6, 9, 3, 3, 2, 3, 1, 1, 1, 1, 3, 1},
  };
  for (const Case& c : tc) {
    Check<Sm80Family<128, ConvKind::kFprop>, false>(c, ConvKind::kFprop, "sm80 128x128 fprop", rng);
    Check<Sm80Family<64, ConvKind::kFprop>, false>(c, ConvKind::kFprop, "sm80 128x64 fprop", rng);
    Check<Sm80Family<128, ConvKind::kDgrad>, false>(c, ConvKind::kDgrad, "sm80 128x128 dgrad", rng);
    Check<Sm80Family<64, ConvKind::kDgrad>, false>(c, ConvKind::kDgrad, "sm80 128x64 dgrad", rng);
    Check<Sm80Family<128, ConvKind::kWgrad>, false>(c, ConvKind::kWgrad, "sm80 128x128 wgrad", rng);
    Check<Sm80Family<64, ConvKind::kWgrad>, false>(c, ConvKind::kWgrad, "sm80 128x64 wgrad", rng);
  }
  for (const Case& c : any) {
    Check<SimtFamily<SimtPolicy128x128, ConvKind::kFprop, false>, true>(c, ConvKind::kFprop, "simt 128x128 fprop", rng);
    Check<SimtFamily<SimtPolicy128x64, ConvKind::kFprop, false>, true>(c, ConvKind::kFprop, "simt 128x64 fprop", rng);
    Check<SimtFamily<SimtPolicy128x128, ConvKind::kDgrad, false>, true>(c, ConvKind::kDgrad, "simt 128x128 dgrad", rng);
    Check<SimtFamily<SimtPolicy128x64, ConvKind::kDgrad, false>, true>(c, ConvKind::kDgrad, "simt 128x64 dgrad", rng);
    Check<SimtFamily<SimtPolicy128x128, ConvKind::kWgrad, false>, true>(c, ConvKind::kWgrad, "simt 128x128 wgrad", rng);
    Check<SimtFamily<SimtPolicy128x64, ConvKind::kWgrad, false>, true>(c, ConvKind::kWgrad, "simt 128x64 wgrad", rng);
  }
  for (const Case& c : tc) {  // vectorized SIMT: channels and columns multiples of 4
    Check<SimtFamily<SimtPolicy128x128, ConvKind::kFprop, true>, true>(c, ConvKind::kFprop, "simt vec 128x128 fprop", rng);
    Check<SimtFamily<SimtPolicy128x64, ConvKind::kFprop, true>, true>(c, ConvKind::kFprop, "simt vec 128x64 fprop", rng);
    Check<SimtFamily<SimtPolicy128x128, ConvKind::kDgrad, true>, true>(c, ConvKind::kDgrad, "simt vec 128x128 dgrad", rng);
    Check<SimtFamily<SimtPolicy128x64, ConvKind::kDgrad, true>, true>(c, ConvKind::kDgrad, "simt vec 128x64 dgrad", rng);
    Check<SimtFamily<SimtPolicy128x128, ConvKind::kWgrad, true>, true>(c, ConvKind::kWgrad, "simt vec 128x128 wgrad", rng);
    Check<SimtFamily<SimtPolicy128x64, ConvKind::kWgrad, true>, true>(c, ConvKind::kWgrad, "simt vec 128x64 wgrad", rng);
  }
  std::printf(failures ? "%d FAILED\n" : "all loader emulations match CpuConv\n", failures);
  return failures ? 1 : 0;
}
