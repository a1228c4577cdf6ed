#!/usr/bin/env bash
# compute-sanitizer memcheck and racecheck over small problems of every kernel family (GEMM,
# fused epilogues and their backward, convolution, the grouped GEMM, its epilogue and gated mode;
# fp8: the scaled product, fp8.dense's three scalings)
# (jaxgemm installed; run on the GPU machine). Only jaxgemm's kernels are checked.
#   tools/sanitize.sh   (SANITIZE_CASES="sanitize_fp8": the fp8 cases only; SANITIZE_TOOLS=memcheck;
#                        SANITIZE_ONLY="blockwise 136": the fp8 cases whose names hold it)
set -uo pipefail
out=${OUT:-/tmp/jaxgemm_check}
cases=$(mktemp -d)  # (the case scripts stay out of $OUT: the device tool returns 8 files at most)
mkdir -p "$out"
command -v compute-sanitizer >/dev/null || export PATH="$PATH:/usr/local/cuda/bin"
# JAX takes 75 % of the GPU up front by default; under memcheck that allocation has failed
# (cuMemCreate out of memory, then the tool crashed): allocate as needed.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
cat >"$cases/sanitize_case.py" <<'PY'
import itertools
import jax, jax.numpy as jnp
import jaxgemm
from jaxgemm.gemm import GemmConfig, gemm_product
key = jax.random.key(0)
families = [("simt", (128, 128), "float32"), ("simt", (128, 64), "float32"), ("sm80", None, "bfloat16")]
families += [("sm90", t, "bfloat16")
             for t in ((128, 64), (128, 128), (128, 256), (256, 256), (64, 64), (64, 128), (192, 128), (160, 128))]
# tf32: TT takes A from registers on the cooperative and one-consumer tiles; NN with m = 136,
# unsplit, runs transposed (D^T = B^T A^T, each tile written transposed by the TMA stores).
families += [("sm90", t, "tf32") for t in ((128, 256), (256, 256), (64, 128))]
# m = 136: a last tile row of 8 (m64 blocks past M skipped); m = 16: A's box shrunk to 16 rows.
for (kernel, tile, dtype), (ta, tb), m in itertools.product(families, [(False, False), (True, True)], (136, 16)):
    ta = ta and tile != (160, 128)  # (the swapped tile takes A stored (m, k) only)
    n, k = 264, 200
    tf32 = dtype == "tf32"
    dtype = "float32" if tf32 else dtype
    a = jax.random.normal(key, (k, m) if ta else (m, k), dtype)
    b = jax.random.normal(key, (n, k) if tb else (k, n), dtype)
    for split in (1, 2):
        cfg = GemmConfig(ta, tb, tf32, jnp.dtype(dtype), split_k=split, kernel=kernel, tile=tile)
        jax.block_until_ready(jax.jit(lambda a, b: gemm_product(a, b, cfg))(a, b))
# The fused TMA-store epilogue (bias, gelu, aux) and the bias-activation backward.
x = jax.random.normal(key, (136, 200), jnp.bfloat16)
w = jax.random.normal(key, (200, 264), jnp.bfloat16)
bias = jax.random.normal(key, (264,), jnp.bfloat16)
jax.block_until_ready(jaxgemm.matmul(x, w, bias=bias, activation="gelu", return_pre_activation=True))
jax.block_until_ready(jax.grad(lambda x, w, b: jaxgemm.dense(x, w, b, "gelu").astype(jnp.float32).sum(),
                               argnums=(0, 1, 2))(x, w, bias))
# The bias backward on narrow rows (16 and 8 vectors: 8 and 16 column threads a block).
for n_narrow in (128, 64):
    jax.block_until_ready(jax.grad(lambda x, w, b: jaxgemm.dense(x, w, b, "relu").astype(jnp.float32).sum(),
                                   argnums=(0, 1, 2))(x, w[:, :n_narrow], bias[:n_narrow]))
# Convolutions: the sm90 implicit GEMM (fprop, dgrad, wgrad) and the few-channel col2im.
for c_in in (64, 3):
    img = jax.random.normal(key, (2, 12, 12, c_in), jnp.bfloat16)
    ker = jax.random.normal(key, (3, 3, c_in, 64), jnp.bfloat16)
    conv = lambda x, k: jaxgemm.conv2d(x, k, padding="SAME").astype(jnp.float32).sum()
    jax.block_until_ready(jax.grad(conv, argnums=(0, 1))(img, ker))
# The grouped kernel (ragged_dot): forward, input gradient and weight gradient, with an
# empty group, groups cut inside a tile and rows of no group.
lhs = jax.random.normal(key, (200, 136), jnp.bfloat16)
rhs = jax.random.normal(key, (3, 136, 264), jnp.bfloat16)
sizes = jnp.array([70, 0, 100], jnp.int32)
ragged = lambda l, r: jaxgemm.ragged_dot(l, r, sizes).astype(jnp.float32).sum()
jax.block_until_ready(jax.grad(ragged, argnums=(0, 1))(lhs, rhs))
# Its epilogue: bias, activation and residual, and under grad the aux z; a 192-row group
# fills one box-stored tile (64 rows a consumer), the rest are cut by group ends.
bias = jax.random.normal(key, (3, 264), jnp.float32)
res = jax.random.normal(key, (200, 264), jnp.bfloat16)
fused = lambda l, r, b: jaxgemm.ragged_dot(l, r, jnp.array([192, 0, 5], jnp.int32), bias=b, activation="gelu",
                                           residual=res).astype(jnp.float32).sum()
jax.block_until_ready(jax.jit(fused)(lhs, rhs, bias))
jax.block_until_ready(jax.grad(fused, argnums=(0, 1, 2))(lhs, rhs, bias))
# The gated mode (ragged_glu): both products in one kernel, biases, and under grad the two z.
glu = lambda l, g, u, b: jaxgemm.ragged_glu(l, g, u, jnp.array([192, 0, 5], jnp.int32), bias_gate=b,
                                            bias_up=b).astype(jnp.float32).sum()
jax.block_until_ready(jax.jit(glu)(lhs, rhs, rhs, bias))
jax.block_until_ready(jax.grad(glu, argnums=(0, 1, 2, 3))(lhs, rhs, rhs, bias))
# Sizes that break the contract (negative, summing past m): traced through the API, which
# clips them (ragged.group_sizes_for), and bound raw to the primitives, whose kernels clip
# them again: both must stay inside the operands.
from jaxgemm.ragged import ragged_dot_op, ragged_wgrad_op
raw = jax.jit(lambda l, r, s: ragged_dot_op.bind(l, r, s, out_dtype=l.dtype, precision=None)[0])
raw_wgrad = jax.jit(lambda l, s: ragged_wgrad_op.bind(l, l, s, out_dtype=l.dtype, groups=3, precision=None)[0])
api = jax.jit(jax.grad(lambda l, r, s: jaxgemm.ragged_dot(l, r, s).astype(jnp.float32).sum(), argnums=(0, 1)))
for bad in ([-70, 300, 100], [200, -200, 200], [150, 150, 150], [-2**31 + 1, 2**31 - 1, 100]):
    s = jnp.array(bad, jnp.int32)
    jax.block_until_ready((api(lhs, rhs, s), raw(lhs, rhs, s), raw_wgrad(lhs, s)))
print("sanitize cases done")
PY
# fp8 (apart, so that a sanitizer failure on them leaves the other cases' report whole): the
# per-row product with its scales in the epilogue (ragged tiles), fp8.dense's rowwise
# forward (scales, bias, gelu, z in the kernel) and backward, and the block-scaled product.
# One case a process (the loop below): run one after another in one process, both tools
# segfaulted on the third case (H100, s61), each of whose kernels, and the case itself,
# came out clean in a process of its own.
cat >"$cases/sanitize_fp8_case.py" <<'PY'
import os
import jax, jax.numpy as jnp
import jaxgemm
key = jax.random.key(0)
def step(name):  # whether to run case `name` (SANITIZE_ONLY: a part of the names to run), marked in the report
    if os.environ.get("SANITIZE_LIST"):  # only name the cases
        print(name)
        return False
    run = os.environ.get("SANITIZE_ONLY", "") in name
    if run:
        print("case:", name, flush=True)
    return run
for m, n, k in ((136, 264, 256), (64, 128, 512)):
    if not step(f"per-row product {m}x{n}x{k}"):
        continue
    lhs = jax.random.normal(key, (1, m, k), jnp.float32).astype(jnp.float8_e4m3fn)
    rhs = jax.random.normal(key, (1, n, k), jnp.float32).astype(jnp.float8_e4m3fn)
    ls, rs = jnp.full((1, m, 1), 0.5, jnp.float32), jnp.full((1, n, 1), 2.0, jnp.float32)
    jax.block_until_ready(jaxgemm.scaled_matmul(lhs, rhs, ls, rs, jnp.bfloat16))
x = jax.random.normal(key, (136, 256), jnp.bfloat16)
w = jax.random.normal(key, (256, 264), jnp.bfloat16)
bias = jax.random.normal(key, (264,), jnp.bfloat16)
for scaling in ("rowwise", "blockwise"):
    if not step(f"fp8.dense {scaling} 136x256 -> 264"):
        continue
    layer = lambda x, w, b: jaxgemm.fp8.dense(x, w, b, "gelu", scaling=scaling).astype(jnp.float32).sum()
    jax.block_until_ready(jax.jit(jax.value_and_grad(layer, argnums=(0, 1, 2)))(x, w, bias))
# Whole 128-blocks: blockwise quantization in one pass (x, w as tiles, dz).
if step("fp8.dense blockwise in whole blocks 128x256 -> 384"):
    x2, w2 = x[:128], jax.random.normal(key, (256, 384), jnp.bfloat16)
    layer = lambda x, w, b: jaxgemm.fp8.dense(x, w, b, "gelu", scaling="blockwise").astype(jnp.float32).sum()
    jax.block_until_ready(jax.jit(jax.value_and_grad(layer, argnums=(0, 1, 2)))(x2, w2, w2[0]))
# Delayed: one quantize pass a tensor (128 rows: the kernel's 16-row runs), with the amax
# (an atomicMax a block) and dz's column sums.
# "e5m2": dz in e5m2 (the quantize pass's e5m2 instance; dx and dw on the e5m2 x e4m3 and
# e4m3 x e5m2 GEMM instances).
for fmt in ("e4m3", "e5m2"):
    if not step(f"fp8.dense delayed {fmt} 128x256 -> 264"):
        continue
    def layer(x, w, b, h):
        return jaxgemm.fp8.dense(x, w, b, "gelu", scaling="delayed", history=h,
                                 grad_format=fmt).astype(jnp.float32).sum()
    grad = jax.jit(jax.value_and_grad(layer, argnums=(0, 1, 2, 3)))
    jax.block_until_ready(grad(x[:128], w, bias, jaxgemm.fp8.amax_history(4)))
print("sanitize cases done")
PY
# Each report's summary, and its first errors where it has any (so that they are seen where
# the report files are not). A sanitizer that crashes (rc >= 128: the tool itself segfaults
# now and then on an H100, with no report, the same case clean on another run; s61 saw it
# on three of the fp8 cases and on the families' case, each clean on some run) tries again.
# sanitize_fp8 runs once per case (SANITIZE_ONLY: that case's name), its reports appended.
fp8_cases() {
  SANITIZE_LIST=1 python3 -P "$cases/sanitize_fp8_case.py" 2>/dev/null | grep -v "sanitize cases done" |
    grep -F -- "${SANITIZE_ONLY:-}"
}
for case in ${SANITIZE_CASES:-sanitize sanitize_fp8}; do
  for tool in ${SANITIZE_TOOLS:-memcheck racecheck}; do
    report="$out/${case}_$tool.txt"
    : >"$report"
    while IFS= read -r only; do
      for attempt in 1 2 3; do
        SANITIZE_ONLY="$only" compute-sanitizer --tool $tool --kernel-name kns=jaxgemm --print-limit 20 \
          python3 -P "$cases/${case}_case.py" >"$report.one" 2>&1
        rc=$?
        cat "$report.one" >>"$report"
        [ $rc -lt 128 ] && break
        echo "$case $tool ${only:+($only) }: the sanitizer crashed (rc=$rc), attempt $attempt"
      done
      echo "$case $tool ${only:+($only) }(rc=$rc): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|sanitize cases done' "$report.one" | tr '\n' ' ')"
      grep -E '^case:|^========= (Invalid|Error|Race|Program hit|    at |Internal)' "$report.one" | grep -B1 '^=' | head -16
    done < <(if [ "$case" = sanitize_fp8 ]; then fp8_cases; else echo ""; fi)
    rm -f "$report.one"
  done
done
rm -rf "$cases"
