#!/usr/bin/env bash
# Registers, shared memory and spills of one kernel-instance file, for sm_90a:
#   tools/ptxas_report.sh ffi_src/gemm/instances/simt_f32.cu
set -euo pipefail
cd "$(dirname "$0")/.."
src=${1:-ffi_src/gemm/instances/simt_f32.cu}
inc=$(python3 -c "from jax import ffi; print(ffi.include_dir())")
nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
  -Iffi_src -I"$inc" -Xptxas=-v -c "$src" -o /tmp/ptxas_report.o 2>&1 |
  grep -E "Compiling entry|Used|spill" | sed -E 's/.*_ZN7jaxgemm14SimtGemmKernelINS_10SimtPolicyIL(i[0-9]+ELi[0-9]+)EEE([^N]*)NS_11.*/\1 \2/' |
  paste - - - | awk '{$1=$1}1' | cut -c1-220
