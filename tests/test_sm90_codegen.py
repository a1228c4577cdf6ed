"""What ptxas makes of the sm90 kernels, checked where nvcc exists (no GPU needed).

ptxas may compile a kernel's wgmmas serialized (each one waited for before the next issues)
instead of pipelined, and only says so in an info line ("(C75xx) Potential Performance Loss:
wgmma.mma_async instructions are serialized ..."). Results stay right, so no GPU test can
notice; session 21 shipped every float-output kernel that way. This compiles one instance of
each sm90 schedule, for each kind of mainloop and output, and fails on any such line.
"""

import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (policy, input type, output type, A stored (k, m), B stored (n, k)): the cooperative
# 128 x 256 tile, its 2-block cluster, the pingpong 128 x 128 tile and the one-consumer
# 64 x 128 tile; tf32 with A from shared memory and from registers, 16-bit products with
# 16-bit and float outputs, each in every epilogue set it is built with; fp8 (both operands
# K-major; e4m3, and e5m2 beside e4m3) into both; and the conv wgrad instances (float
# outputs, other loads).
KERNELS = [
    ("Sm90Policy<256, false, 1, 4>", "float", "float", "false", "true"),
    ("Sm90Policy<256, false, 1, 4>", "float", "float", "true", "true"),
    ("Sm90Policy<256, false, 2, 4>", "float", "float", "true", "true"),
    ("Sm90Policy<128, true, 1, 4>", "float", "float", "false", "true"),
    ("Sm90Policy<128, false, 1, 4, 1>", "float", "float", "true", "true"),
    ("Sm90Policy<256, false, 1, 2>", "__nv_bfloat16", "float", "false", "false"),
    ("Sm90Policy<256, false, 1, 2>", "__nv_bfloat16", "__nv_bfloat16", "false", "false"),
    ("Sm90Policy<256, false, 2, 2>", "__nv_bfloat16", "__nv_bfloat16", "true", "false"),
    ("Sm90Policy<128, true, 1, 2>", "__half", "__half", "true", "true"),
    ("Sm90Policy<64, false, 1, 2, 1>", "__half", "float", "true", "false"),
    ("Sm90Policy<256, false, 1, 1>", "__nv_fp8_e4m3", "__nv_bfloat16", "false", "true"),
    ("Sm90Policy<128, true, 1, 1>", "__nv_fp8_e4m3", "float", "false", "true"),
    ("Sm90Policy<256, false, 1, 1>", "Fp8E5m2E4m3", "__nv_bfloat16", "false", "true"),
    ("Sm90Policy<128, true, 1, 1>", "Fp8E4m3E5m2", "float", "false", "true"),
]


def _epilogue_sets(t_out):
    """The Sm90Epilogues instances the launcher builds for these types (kSm90EpilogueInstances)."""
    return ["kPlain", "kAll"] + (["kTmaStores"] if t_out != "float" else [])


def _source():
    kernels = ",\n".join(
        f"      (void*)Sm90GemmKernel<{p}, {ti}, {to}, {ta}, {tb}, Sm90MatrixLoads, Sm90Epilogues::{e}>"
        for p, ti, to, ta, tb in KERNELS
        for e in _epilogue_sets(to)
    )
    return f"""#include "gemm/sm90/launch.cuh"
#include "conv/sm90_conv_launch.cuh"
namespace jaxgemm {{
template cudaError_t LaunchSm90ConvWgrad<__nv_bfloat16>(const Sm90ConvWgradLoads&, const GemmProblem&, int, int,
                                                        cudaStream_t);
void* Kernels() {{
  static void* kernels[] = {{
{kernels}}};
  return kernels;
}}
}}  // namespace jaxgemm
"""


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_sm90_wgmmas_are_pipelined(tmp_path):
    src = tmp_path / "sm90_instances.cu"
    src.write_text(_source())
    cmd = ["nvcc", "-std=c++17", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "--expt-relaxed-constexpr",
           "-I", os.path.join(ROOT, "ffi_src"), "-Xptxas=-v", "-c", str(src), "-o", str(tmp_path / "sm90.o")]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-4000:]
    compiled = re.findall(r"Compiling entry function '(\w+)'", log)
    assert len(compiled) >= len(KERNELS), log[-4000:]
    serialized = [line for line in log.splitlines() if re.search(r"\(C75\d\d\)", line)]
    assert not serialized, "\n".join(serialized)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_grouped_wgmmas_are_pipelined(tmp_path):
    """The grouped GEMM's instances (ffi_src/gemm/sm90/grouped.cu builds fourteen: three modes,
    two input types, two output types, and the gated mode for 16-bit outputs): none
    serialized, none spilling. Passing the accumulators themselves as a float box's words
    (alpha = 1 folded away), on a path only some tiles take, was enough to serialize every
    wgmma of the float-output instances."""
    cmd = ["nvcc", "-std=c++17", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "-I", os.path.join(ROOT, "ffi_src"),
           "-Xptxas=-v", "-c", os.path.join(ROOT, "ffi_src", "gemm", "sm90", "grouped.cu"), "-o", str(tmp_path / "g.o")]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-4000:]
    compiled = re.findall(r"Compiling entry function '(\w*Sm90GemmKernel\w*Sm90GroupedLoads\w*)'", log)
    assert len(compiled) == 14, log[-4000:]
    serialized = [line for line in log.splitlines() if re.search(r"\(C75\d\d\)", line)]
    assert not serialized, "\n".join(serialized)
    assert not re.search(r"[1-9]\d* bytes spill stores", log), log[-4000:]
