#!/usr/bin/env bash
# Warp stall reasons (cycles per issued instruction) of one jaxgemm kernel launch:
#   tools/ncu_stalls.sh [M N K dtype]   (jaxgemm installed; run on the GPU machine)
set -uo pipefail
m=${1:-4096} n=${2:-4096} k=${3:-4096} dtype=${4:-float32}
reasons="barrier long_scoreboard short_scoreboard mio_throttle math_pipe_throttle dispatch_stall not_selected selected wait no_instruction lg_throttle branch_resolving drain membar sleeping tex_throttle imc_miss misc"
metrics=$(for r in $reasons; do printf "smsp__average_warps_issue_stalled_%s_per_issue_active.ratio," "$r"; done)
ncu --clock-control none -k regex:Gemm -c 1 --metrics "${metrics%,},smsp__inst_executed_pipe_fma.sum,smsp__inst_executed.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,smsp__issue_active.avg.pct_of_peak_sustained_active" \
  python3 -P -c "
import jax, jaxgemm
ka, kb = jax.random.split(jax.random.key(0))
a = jax.random.normal(ka, ($m, $k), '$dtype'); b = jax.random.normal(kb, ($k, $n), '$dtype')
jax.block_until_ready(jaxgemm.matmul(a, b))
" 2>&1 | grep -E "stalled|inst_executed|bank|issue_active" | sed -E 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//' | sort -k3 -n -r
