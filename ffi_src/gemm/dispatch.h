// Picks a kernel for a GemmProblem and launches it on the given stream.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "gemm/problem.h"
#include "gemm/sm90_launch.h"

namespace jaxgemm {

struct SimtChoice {
  int bm, bn;
};

// A kernel family asked for by the caller (tests, tuning); kAuto lets the heuristic pick.
// kDecode (gemm/decode_launch.h) runs only when asked for.
enum class KernelFamily : int { kAuto = 0, kSimt = 1, kSm80 = 2, kSm90 = 3, kDecode = 4 };

struct KernelRequest {
  KernelFamily family = KernelFamily::kAuto;
  int tile_m = 0, tile_n = 0;  // 0: the heuristic's tile for the family
  // Multiprocessors to leave free: a kernel whose partial sums are all-reduced runs beside
  // the previous one's all-reduce, whose kernel cannot start while a persistent grid holds
  // every SM (docs/primitives.md).
  int sm_margin = 0;
};

// The SIMT threadblock tile for a problem (with its split_k) on a GPU with `sm_count`
// multiprocessors.
SimtChoice ChooseSimtTile(const GemmProblem& p, int sm_count);

// How many K chunks to compute in parallel (fp32 partials reduced afterwards) when the
// output alone has too few tiles to fill the GPU; 1 otherwise. Ignores p.split_k.
int64_t ChooseSplitK(const GemmProblem& p, int sm_count);

// K chunks for the tensor-core kernels (same contract as ChooseSplitK); `sm90`: for the
// sm90 kernel's schedules (Hopper), otherwise for sm80's.
int64_t ChooseTensorCoreSplitK(const GemmProblem& p, int sm_count, bool sm90);

// The sm90 kernel's schedule for a problem (with its split_k), named by the output area one
// block or cluster covers: 128x64 and 128x128 (pingpong), 128x256 (cooperative), 256x256
// (cooperative, 2-block clusters sharing B). See LaunchSm90Gemm.
struct Sm90Tile {
  int m, n;
};
// `with_narrow`: 128x64 may be picked (GEMMs; convolutions pick it by their own rule).
Sm90Tile ChooseSm90Tile(const GemmProblem& p, int sm_count, bool with_narrow = true);

// The SMs the persistent grid of the heuristic's sm90 schedule is planned for: `sm_count`,
// or, for a few-row product at one slab, tiles x share, where each 64 x 64 tile is shared out
// stream-K by the workers a split would have used (FewRowsSm90 in dispatch.cu).
int Sm90GridSms(const GemmProblem& p, int sm_count);

// Whether (tile_m, tile_n) names an sm90 schedule.
bool IsSm90Tile(int tile_m, int tile_n);

// Multiprocessors of the current device (cached per device), or 0 without a GPU; fewer when
// the environment variable JAXGEMM_SM_COUNT asks for fewer (testing).
int CurrentDeviceSmCount();

// Compute capability of the current device as 10 * major + minor (cached), or 0.
int CurrentDeviceComputeCapability();

// The workspace RunGemm can use for a problem (with its split_k) on a Hopper GPU with
// `sm_count` SMs: stream-K's, when the sm90 schedule that `request` names, or that the
// heuristic picks, shares out a last partly filled wave; 0 otherwise.
size_t GemmWorkspaceBytes(const GemmProblem& p, int sm_count, KernelRequest request);

// Launches D = alpha * op(A) op(B) with the heuristic's kernel, or the requested one.
// Returns a CUDA status; *unsupported is set (and cudaErrorInvalidValue returned) when no
// kernel takes the problem or the request. `workspace`: device memory the kernel may use
// (see GemmWorkspaceBytes); less only disables stream-K.
cudaError_t RunGemm(const GemmProblem& p, cudaStream_t stream, KernelRequest request, std::string* unsupported,
                    Sm90Workspace workspace = {});

}  // namespace jaxgemm
