#!/usr/bin/env bash
# Hardware counters of one jaxgemm kernel launch (stall reasons, issue utilisation):
#   tools/ncu_kernel.sh [M N K dtype ta tb]   (jaxgemm installed; run on the GPU machine)
set -uo pipefail
m=${1:-4096} n=${2:-4096} k=${3:-4096} dtype=${4:-float32} ta=${5:-0} tb=${6:-0}
out=${OUT:-/tmp/jaxgemm_check}
mkdir -p "$out"
ncu --clock-control none -k regex:Gemm -c 1 \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
  --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
  python3 -P -c "
import jax, jax.numpy as jnp, jaxgemm
ka, kb = jax.random.split(jax.random.key(0))
a = jax.random.normal(ka, ($k, $m) if $ta else ($m, $k), '$dtype')
b = jax.random.normal(kb, ($n, $k) if $tb else ($k, $n), '$dtype')
jax.block_until_ready(jaxgemm.matmul(a, b, transpose_a=bool($ta), transpose_b=bool($tb)))
" >"$out/ncu.txt" 2>&1
grep -E "Stall|Issue|Warp Cycles|Eligible|Active Warps|Registers|Achieved Occupancy|Duration|SM Busy|Executed Ipc|Throughput|Bank|Theoretical Occupancy|Block Limit" "$out/ncu.txt" | head -60
