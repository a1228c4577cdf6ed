#!/usr/bin/env bash
# compute-sanitizer memcheck and racecheck over small problems of every GEMM kernel family
# (jaxgemm installed; run on the GPU machine). Only jaxgemm's kernels are checked.
#   tools/sanitize.sh
set -uo pipefail
out=${OUT:-/tmp/jaxgemm_check}
mkdir -p "$out"
cat >"$out/sanitize_case.py" <<'PY'
import itertools
import jax, jax.numpy as jnp
from jaxgemm.gemm import GemmConfig, _gemm
key = jax.random.key(0)
for (kernel, tile), dtype, (ta, tb) in itertools.product(
        [("simt", (128, 128)), ("sm80", None), ("sm90", (128, 128)), ("sm90", (128, 256))],
        ["bfloat16"], [(False, False), (True, True)]):
    m, n, k = 136, 264, 200
    a = jax.random.normal(key, (k, m) if ta else (m, k), dtype)
    b = jax.random.normal(key, (n, k) if tb else (k, n), dtype)
    for split in (1, 2):
        cfg = GemmConfig(ta, tb, False, jnp.dtype(dtype), split_k=split, kernel=kernel, tile=tile)
        jax.block_until_ready(_gemm(a, b, cfg))
print("sanitize cases done")
PY
for tool in memcheck racecheck; do
  compute-sanitizer --tool $tool --kernel-name regex:jaxgemm --print-limit 20 \
    python3 -P "$out/sanitize_case.py" >"$out/sanitize_$tool.txt" 2>&1
  echo "$tool (rc=$?): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|sanitize cases done' "$out/sanitize_$tool.txt" | tr '\n' ' ')"
done
