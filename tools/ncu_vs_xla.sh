#!/usr/bin/env bash
# Hardware counters of jaxgemm's sm90 GEMM kernel (the heuristic's schedule, then two forced
# ones) and XLA's (cuBLAS) on the same bf16 problem, side by side (launch shape, clock,
# duration, throughputs, hit rates):
#   tools/ncu_vs_xla.sh [M N K]   (jaxgemm installed; run on the GPU machine)
set -uo pipefail
m=${1:-8192} n=${2:-8192} k=${3:-8192}
out=${OUT:-/tmp/jaxgemm_check}
mkdir -p "$out"
ncu --clock-control none -k "regex:Sm90Gemm|nvjet|xmma|gemm|Gemm" -c 4 \
  --section LaunchStats --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats \
  python3 -P -c "
import jax, jax.numpy as jnp
from jaxgemm.gemm import GemmConfig, gemm_product
ka, kb = jax.random.split(jax.random.key(0))
a = jax.random.normal(ka, ($m, $k), jnp.bfloat16); b = jax.random.normal(kb, ($k, $n), jnp.bfloat16)
jax.block_until_ready((a, b))
for tile in (None, (128, 128), (128, 256)):
    config = GemmConfig(out_dtype=jnp.dtype(jnp.bfloat16), split_k=1, kernel='sm90', tile=tile)
    jax.block_until_ready(jax.jit(lambda a, b: gemm_product(a, b, config))(a, b))
jax.block_until_ready(jax.jit(jnp.matmul)(a, b))
" >"$out/ncu_vs_xla.txt" 2>&1
grep -E "^  [A-Za-z_].*\(|Cluster Size|Grid Size|Registers Per|SM Frequency|Duration|Compute \(SM\) Throughput|DRAM Throughput|L2 Hit Rate|L2 Cache Throughput|L1/TEX Cache Throughput|Issue Slots Busy|Warp Cycles Per Issued" "$out/ncu_vs_xla.txt" | cut -c1-110
