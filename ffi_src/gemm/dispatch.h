// Picks a kernel for a GemmProblem and launches it on the given stream.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "gemm/kernel_family.h"
#include "gemm/problem.h"
#include "gemm/simt_tiles.h"
#include "gemm/sm90/heuristic.h"
#include "gemm/sm90/launch.h"

namespace jaxgemm {

struct KernelRequest {
  KernelFamily family = KernelFamily::kAuto;
  int tile_m = 0, tile_n = 0;  // 0: the heuristic's tile for the family
  // Multiprocessors to leave free: a kernel whose partial sums are all-reduced runs beside
  // the previous one's all-reduce, whose kernel cannot start while a persistent grid holds
  // every SM (docs/primitives.md).
  int sm_margin = 0;
  // The sm90 GEMM's blocks take their tiles from a counter in the workspace instead of a
  // static share (Sm90Schedule::Take; no stream-K then): for a GEMM that a collective
  // launched just before it may keep off some SMs for a while (docs/primitives.md).
  bool dynamic_tiles = false;
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

// Multiprocessors of the current device (cached per device), or 0 without a GPU; fewer when
// the environment variable JAXGEMM_SM_COUNT asks for fewer (testing).
int CurrentDeviceSmCount();

// The multiprocessors a persistent grid may take when it leaves `sm_margin` of them free for
// a collective beside it (at least 2; an H100 / H200's 132 when the device's are unknown).
// Python's workspace and split choices ask the same (the module's kernel_sm_count).
int KernelSmCount(int sm_margin);

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
