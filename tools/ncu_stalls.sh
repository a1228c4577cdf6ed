#!/usr/bin/env bash
# Warp stall reasons (cycles per issued instruction) of one jaxgemm kernel launch:
#   tools/ncu_stalls.sh [M N K dtype [kernel tile_m,tile_n [transpose_a]]]
# (jaxgemm installed; run on the GPU machine). With a kernel and tile, that configuration
# is forced (operands kept as given); transpose_a = 1 stores A as (K, M).
set -uo pipefail
m=${1:-4096} n=${2:-4096} k=${3:-4096} dtype=${4:-float32} kernel=${5:-} tile=${6:-} ta=${7:-0}
reasons="barrier long_scoreboard short_scoreboard mio_throttle math_pipe_throttle dispatch_stall not_selected selected wait no_instruction lg_throttle branch_resolving drain membar sleeping tex_throttle imc_miss misc"
metrics=$(for r in $reasons; do printf "smsp__average_warps_issue_stalled_%s_per_issue_active.ratio," "$r"; done)
ncu --clock-control none -k regex:Gemm -c 1 --metrics "${metrics%,},smsp__inst_executed_pipe_fma.sum,smsp__inst_executed.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second" \
  python3 -P -c "
import jax
from jaxgemm.gemm import GemmConfig, gemm_product
ka, kb = jax.random.split(jax.random.key(0))
a = jax.random.normal(ka, ($k, $m) if $ta else ($m, $k), '$dtype'); b = jax.random.normal(kb, ($k, $n), '$dtype')
config = GemmConfig(transpose_a=bool($ta), kernel='$kernel' or None, tile=tuple(int(t) for t in '$tile'.split(',')) if '$tile' else None)
jax.block_until_ready(jax.jit(lambda a, b: gemm_product(a, b, config))(a, b))
" 2>&1 | grep -E "stalled|inst_executed|bank|issue_active|warps_active|duration|per_second|Error|error" | sed -E 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//' | sort -k3 -n -r
