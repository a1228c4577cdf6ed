#!/usr/bin/env bash
# Hardware counters (clock, duration, DRAM / L2 throughput) of every kernel that XLA's
# and jaxgemm's bf16 GEMM launch for M x N x K, counted only after both are compiled and
# warm (so XLA's autotuning launches are not profiled):
#   tools/ncu_after_warmup.sh [M N K]   (jaxgemm installed; run on the GPU machine)
set -uo pipefail
m=${1:-16} n=${2:-8192} k=${3:-8192}
out=${OUT:-/tmp/jaxgemm_check}
mkdir -p "$out"
ncu --clock-control none --profile-from-start off -c 12 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats \
  python3 -P -c "
import ctypes, glob, jax, jax.numpy as jnp, jaxgemm
ka, kb = jax.random.split(jax.random.key(0))
a = jax.random.normal(ka, ($m, $k), jnp.bfloat16); b = jax.random.normal(kb, ($k, $n), jnp.bfloat16)
fns = [jax.jit(jnp.matmul), jax.jit(jaxgemm.matmul)]
for f in fns: jax.block_until_ready(f(a, b))
cudart = ctypes.CDLL(sorted(glob.glob('/usr/local/cuda/lib64/libcudart.so*'))[0])
cudart.cudaProfilerStart()
for f in fns: jax.block_until_ready(f(a, b))
cudart.cudaProfilerStop()
" >"$out/ncu_after_warmup.txt" 2>&1
grep -E "^  [A-Za-z_].*\(|SM Frequency|DRAM Frequency|Duration|DRAM Throughput|Memory Throughput|L2 Hit Rate|Grid Size|Block Size|==PROF==|rror" \
  "$out/ncu_after_warmup.txt" | cut -c1-120
