#!/usr/bin/env bash
# Where one jaxgemm sm90 launch's warps spend their time, per SASS instruction: ncu's warp
# state sampling (SourceCounters) of one bf16 GEMM launch, the instructions with the most
# samples first, with the stall reason that dominates each, then the most executed ones
# (spin loops show there) (jaxgemm installed; GPU machine):
#   tools/ncu_hotspots.sh [M N K [fused [tile]]]   fused: + bias, gelu and aux, as in bench's
#   case ("" for none); tile: a forced sm90 schedule, e.g. 128x128 (default: the heuristic's)
set -uo pipefail
m=${1:-8192} n=${2:-8192} k=${3:-8192} fused=${4:-} tile=${5:-}
out=${OUT:-/tmp/jaxgemm_check}
mkdir -p "$out"
ncu --clock-control none -k regex:Sm90Gemm -c 1 --section SourceCounters --section WarpStateStats \
  --page source --print-source sass --csv python3 -P -c "
import jax, jax.numpy as jnp, jaxgemm
from jaxgemm.gemm import GemmConfig, gemm_product
ka, kb, kc = jax.random.split(jax.random.key(0), 3)
a = jax.random.normal(ka, ($m, $k), jnp.bfloat16)
b = jax.random.normal(kb, ($k, $n), jnp.bfloat16)
if '$fused':
    bias = jax.random.normal(kc, ($n,), jnp.bfloat16)
    out = jaxgemm.matmul(a, b, bias=bias, activation='gelu', return_pre_activation=True)
elif '$tile':
    config = GemmConfig(out_dtype=jnp.dtype(jnp.bfloat16), kernel='sm90', tile=tuple(int(v) for v in '$tile'.split('x')))
    out = jax.jit(lambda a, b: gemm_product(a, b, config))(a, b)
else:
    out = jaxgemm.matmul(a, b)
jax.block_until_ready(out)
" >"$out/ncu_source.csv" 2>"$out/ncu_source.err"
python3 - "$out/ncu_source.csv" <<'PY'
import csv, sys
lines = open(sys.argv[1]).read().splitlines()
start = next((i for i, l in enumerate(lines) if l.startswith('"Address"') or l.startswith('"#"')), None)
if start is None:
    print("\n".join(lines[-20:]))
    sys.exit(1)
rows = list(csv.DictReader(lines[start:]))
total_key = next(k for k in rows[0] if "Warp Stall Sampling (All" in k)
stall_keys = [k for k in rows[0] if k.startswith("stall_") and "Not Issued" not in k]
def num(x):
    try:
        return float(str(x).replace(",", ""))
    except ValueError:
        return 0.0
total = sum(num(r[total_key]) for r in rows) or 1.0
print(f"{len(rows)} instructions, {total:.0f} samples; columns: {', '.join(stall_keys[:40])}")
for r in sorted(rows, key=lambda r: -num(r[total_key]))[:60]:
    reasons = sorted(((num(r[k]), k) for k in stall_keys), reverse=True)[:2]
    why = " ".join(f"{k.replace('stall_', '')}={v:.0f}" for v, k in reasons if v > 0)
    print(f"{r.get('Address', '?'):>8} {num(r[total_key]) / total * 100:5.2f}% {r.get('Source', '')[:60]:60} {why}")
executed_key = next((k for k in rows[0] if k.startswith("Instructions Executed")), None)
if executed_key:
    executed = sum(num(r[executed_key]) for r in rows) or 1.0
    print(f"\nmost executed ({executed:.0f} warp instructions):")
    for r in sorted(rows, key=lambda r: -num(r[executed_key]))[:40]:
        print(f"{r.get('Address', '?'):>8} {num(r[executed_key]) / executed * 100:5.2f}% {r.get('Source', '')[:70]}")
PY
