#!/usr/bin/env bash
# Where a bf16 GEMM's L2 traffic comes from, for jaxgemm's sm90 kernel (the heuristic's
# schedule, then forced tiles) and XLA's, at ncu's locked base clock: L2 sectors by source
# unit (SMs, the fabric between the two L2 partitions, ...) and operation, hits and misses,
# DRAM bytes, one column per kernel.
#   tools/ncu_l2_traffic.sh [M N K [tiles]]   (jaxgemm installed; run on the GPU machine)
# tiles: forced sm90 tiles, "128x256,256x256" (default); "-" for the heuristic's only.
set -uo pipefail
m=${1:-4096} n=${2:-4096} k=${3:-4096} tiles=${4:-128x256,256x256}
out=${OUT:-/tmp/jaxgemm_check}
mkdir -p "$out"

# The L2 metrics this chip has: sector counts by source and operation, plus totals.
ncu --query-metrics --chip gh100 >"$out/ncu_metrics.txt" 2>&1
metrics=$(awk '{print $1}' "$out/ncu_metrics.txt" |
  grep -E '^lts__t_sectors_(srcunit_(tex|ltcfabric)|srcnode_gpc)(_op_(read|write))?(_lookup_(hit|miss))?$|^lts__t_sectors_op_(read|write|atom|red)$' |
  sed 's/$/.sum/' | tr '\n' ',')
metrics="${metrics}lts__t_bytes.sum,lts__t_sectors.sum,lts__t_sectors_lookup_hit.sum,lts__t_sectors_lookup_miss.sum"
metrics="${metrics},dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second"
metrics="${metrics},smsp__inst_executed.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"

# Everything is compiled and run once before profiling starts (XLA's autotuner launches
# candidate kernels while compiling), then each GEMM is profiled once.
# XLA's command buffers (CUDA graphs) off: ncu could not replay its kernel inside one.
XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_command_buffer=" ncu --csv --page raw --profile-from-start off --metrics "$metrics" -k "regex:Sm90Gemm|nvjet|xmma|cutlass|gemm" \
  python3 -P -c "
import ctypes
import jax, jax.numpy as jnp
from jaxgemm.gemm import GemmConfig, gemm_product
ka, kb = jax.random.split(jax.random.key(0))
a = jax.random.normal(ka, ($m, $k), jnp.bfloat16); b = jax.random.normal(kb, ($k, $n), jnp.bfloat16)
tiles = [None] + [tuple(int(v) for v in t.split('x')) for t in '$tiles'.split(',') if t != '-']
def ours(tile):
    config = GemmConfig(out_dtype=jnp.dtype(jnp.bfloat16), split_k=1, kernel='sm90', tile=tile)
    return jax.jit(lambda a, b: gemm_product(a, b, config))
fns = [ours(t) for t in tiles] + [jax.jit(jnp.matmul)]
for f in fns:
    jax.block_until_ready(f(a, b))
cuda = ctypes.CDLL('libcuda.so.1')
ctx = ctypes.c_void_p()
assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0 and cuda.cuCtxSetCurrent(ctx) == 0
assert cuda.cuProfilerStart() == 0
for f in fns:
    jax.block_until_ready(f(a, b))
cuda.cuProfilerStop()
" >"$out/ncu_l2.csv" 2>"$out/ncu_l2.err"

# One row per metric, one column per kernel (in the order listed first), zero rows dropped.
python3 - "$out/ncu_l2.csv" <<'PY'
import csv, sys
lines = [l for l in open(sys.argv[1]) if l.startswith('"')]
rows = list(csv.reader(lines))
if len(rows) < 3:
    sys.exit("no kernels profiled; see ncu_l2.err")
head, units, kernels = rows[0], rows[1], rows[2:]
name_col = head.index("Kernel Name")
print("kernels:")
for i, r in enumerate(kernels):
    print(f"  [{i}] {r[name_col][:160]}")
for j, metric in enumerate(head):
    if "__" not in metric or metric.startswith(("device__", "launch__", "profiler__")) or not metric.endswith(
            (".sum", ".per_second", ".pct_of_peak_sustained_active")):
        continue
    vals = [r[j] for r in kernels]
    try:
        nums = [float(v.replace(",", "")) for v in vals]
    except ValueError:
        continue
    if not any(nums):
        continue
    print(f"{metric:70s} {units[j]:>8s} " + " ".join(f"{v:>14,.0f}" if v >= 100 else f"{v:>14.3f}" for v in nums))
PY
