#!/usr/bin/env bash
# On a GPU machine, in one call: build and install jaxgemm, run every test (GPU ones
# included), read the flagship kernel's SASS, run the benchmark; a short summary last.
#   tools/gpu_check.sh [bench suites, default tc,epilogue] [pytest args, default tests; "none" skips]
# The tests run in JAXGEMM_TEST_WORKERS pytest-xdist processes (default 4, 8 on hosts of 32
# cores or more; 1: one process) sharing the GPUs (no memory preallocation): most of their
# time is XLA compiling on the host's cores (serially the suite takes over 10 minutes on an
# H200; 4 workers ran ~94 % of it in ~400 s on a 4 x H200 host). JAXGEMM_TEST_SHARD=1/2
# (then 2/2) runs half the tests; SKIP_BUILD=1 keeps the jaxgemm already installed (a warm
# machine's second call). A tests-only call (suite "none") skips the SASS facts.
# Suites: jaxgemm.bench's (simt, tc, epilogue, smoke, all), "none", "conv" / "conv-bf16"
# (jaxgemm.bench.conv, both dtypes / bfloat16 only), "tiles" (tools/simt_tile_sweep.py
# and tools/sm90_tile_sweep.py: every forced tile against XLA) and "fp8" (tools/bench_fp8.py
# --blocks and --dense, tools/fp8_breakdown.py for each scaling), comma-separated.
# Logs go to $OUT (the device tool's folder) or /tmp/jaxgemm_check.
set -uo pipefail
cd "$(dirname "$0")/.."
suite=${1:-tc,epilogue}
test_args=${2:-tests}
out=${OUT:-/tmp/jaxgemm_check}
# The SASS and the benchmarks' stderr go to $scratch, not $out: the device tool brings back
# at most 8 files from $out, and the logs (tests.log above all) must be among them.
scratch=${JAXGEMM_CHECK_SCRATCH:-/tmp/jaxgemm_scratch}
mkdir -p "$out" "$scratch"
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=$(nproc)
# -P: import the installed jaxgemm, not the source folder in the working directory.
py="python3 -P"

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
start=$(date +%s)
if [ "${SKIP_BUILD:-0}" = 1 ]; then
  echo "build: skipped (SKIP_BUILD=1)"
else
  if ! python3 -m pip install --no-build-isolation --no-deps -v . >"$out/build.log" 2>&1; then
    tail -40 "$out/build.log"; echo "BUILD FAILED"; exit 1
  fi
  grep -E "spill|CUDA handlers" "$out/build.log" | sort | uniq -c | head -20
  echo "build: $(( $(date +%s) - start )) s"
fi

start=$(date +%s)
if [ "$test_args" = none ]; then
  tests_rc=0 tests_line="not run"
else
  # eval: the pytest arguments may hold quoted words (-k 'simt or sm90').
  workers=${JAXGEMM_TEST_WORKERS:-$(( $(nproc) >= 32 ? 8 : 4 ))} parallel=""
  [ "$workers" -gt 1 ] && $py -c "import xdist" 2>/dev/null && parallel="-n $workers"
  # A test stuck in a kernel (a deadlocked barrier) ends its worker after
  # JAXGEMM_TEST_TIMEOUT seconds (default 300) instead of the whole call's time.
  $py -c "import pytest_timeout" 2>/dev/null &&
    parallel="$parallel --timeout ${JAXGEMM_TEST_TIMEOUT:-300} --timeout-method thread"
  # No memory preallocation: the workers share the GPU.
  eval "XLA_PYTHON_CLIENT_PREALLOCATE=false $py -m pytest -q -rs $parallel $test_args -p no:cacheprovider" \
    >"$out/tests.log" 2>&1
  tests_rc=$?
  tail -15 "$out/tests.log"
  tests_line=$(tail -1 "$out/tests.log")
  echo "tests: $(( $(date +%s) - start )) s"
fi

# The SASS facts cost ~2 minutes (cuobjdump of the whole library): read with benchmarks, or
# with JAXGEMM_CHECK_SASS=1; a tests-only call ("none") skips them.
sass_line="SASS: not read (suite none; JAXGEMM_CHECK_SASS=1 reads it)"
if [ "$suite" != none ] || [ "${JAXGEMM_CHECK_SASS:-0}" = 1 ]; then
  so=$($py -c "import glob, os, jaxgemm; print(glob.glob(os.path.join(os.path.dirname(jaxgemm.__file__), '_jaxgemm*.so'))[0])")
  cuobjdump -sass "$so" >"$scratch/all.sass" 2>&1
  # One kernel's SASS into $scratch/$1.sass: the first function, in the sm_90a code only (the
  # library also holds sm_80 code, where the sm90 kernels are empty), whose name matches every
  # regex that follows.
  sass_of() {
    local name=$1 cond='arch == "sm_90a"'
    shift
    for re in "$@"; do cond="$cond && /$re/"; done
    awk '/arch = /{arch = $3} /Function : /{if (f) exit; f = '"$cond"'} f' "$scratch/all.sass" >"$scratch/$name.sass"
  }
  # "label: NAME=count ..." for NAME=REGEX arguments: lines of $scratch/$2.sass matching REGEX.
  counts() {
    local label=$1 file="$scratch/$2.sass" line
    shift 2
    line="$label:"
    for pair in "$@"; do line="$line ${pair%%=*}=$(grep -cE "${pair#*=}" "$file")"; done
    echo "$line"
  }
  # The SIMT flagship: 128x128x16, 3 stages, f32 NN.
  sass_of flagship SimtGemmKernel SimtPolicyILi128ELi128ELi16ELi0ELi3E EffLb0ELb0ELb1EE
  # The sm90 GEMM's clustered 128x256 bf16 NN instance, and the one-consumer 64x128 one (their
  # plain-epilogue instances, Sm90Epilogues::kPlain).
  # Policy arguments: tile N, pingpong, cluster blocks, element bytes, consumer warpgroups,
  # swapped.
  sass_of sm90 Sm90GemmKernel Sm90MatrixLoads Sm90PolicyILi256ELb0ELi2ELi2ELi2ELb0EE nv_bfloat16S3_Lb0ELb0E Sm90EpiloguesE0E
  sass_of sm90_1 Sm90GemmKernel Sm90MatrixLoads Sm90PolicyILi128ELb0ELi1ELi2ELi1ELb0EE nv_bfloat16S3_Lb0ELb0E Sm90EpiloguesE0E
  # The conv fprop instance of the same kernel (pingpong bf16).
  sass_of sm90_conv Sm90GemmKernel Sm90ConvFpropLoads Sm90PolicyILi128ELb1E nv_bfloat16S3_
  # The block-scaled fp8 kernel's plain bf16-output e4m3 instances: B's scales per row
  # (Sm90BlockScaledPolicy) and per group of 64 rows (Sm90BlockScaledGroupsPolicy).
  sass_of sm90_block Sm90GemmKernel Sm90PolicyILi192 Sm90BlockScaledLoads E13__nv_fp8_e4m313__nv_bfloat16 Sm90EpiloguesE0E
  sass_of sm90_groups Sm90GemmKernel Sm90BlockScaledGroupsPolicy E13__nv_fp8_e4m313__nv_bfloat16 Sm90EpiloguesE0E
  local_access='LDL/STL=LDL|STL' tma='HGMMA=HGMMA UTMALDG=UTMALDG UTMASTG=UTMASTG'
  sass_line="$(counts "flagship SASS (128x128 f32 NN)" flagship FFMA=FFMA 'LDS.128=LDS\.128' "$local_access")
  $(counts "sm90 SASS (cluster 2x 128x256 bf16 NN)" sm90 $tma "$local_access")
  $(counts "sm90 SASS (one consumer 64x128 bf16 NN)" sm90_1 $tma "$local_access")
  $(counts "sm90 conv fprop SASS (pingpong bf16)" sm90_conv HGMMA=HGMMA 'UTMALDG.IM2COL=UTMALDG\.4D\.IM2COL' "$local_access")
  $(counts "sm90 block-scaled fp8 SASS (128x192, bf16 out)" sm90_block $tma FFMA=FFMA "$local_access")
  $(counts "sm90 block-scaled fp8 SASS, B in groups (128x192, bf16 out)" sm90_groups $tma FFMA=FFMA FMUL=FMUL "$local_access")"
fi

gemm_suites=$(echo "$suite" | tr ',' '\n' | grep -vE '^(conv|conv-bf16|none|tiles|fp8)$' | paste -sd, -)
: >"$out/bench.txt"
if [ -n "$gemm_suites" ]; then
  $py -m jaxgemm.bench --suite "$gemm_suites" --json "$out/bench.json" >>"$out/bench.txt" 2>"$scratch/bench.err" ||
    tail -20 "$scratch/bench.err"
fi
conv_dtypes=""
case ",$suite," in
  *,conv,*) conv_dtypes=bfloat16,float32 ;;
  *,conv-bf16,*) conv_dtypes=bfloat16 ;;
esac
if [ -n "$conv_dtypes" ]; then
  $py -m jaxgemm.bench.conv --dtypes "$conv_dtypes" --json "$out/bench_conv.json" >>"$out/bench.txt" 2>"$scratch/bench_conv.err" ||
    tail -20 "$scratch/bench_conv.err"
fi
case ",$suite," in
  *,fp8,*)
    fp8_shapes=32768x1024x4096,32768x4096x1024
    { $py tools/bench_fp8.py --blocks --shapes 8192x8192x8192,4096x4096x4096
      $py tools/bench_fp8.py --dense --shapes "$fp8_shapes"
      $py tools/fp8_breakdown.py --shapes "$fp8_shapes" --scaling rowwise,blockwise,delayed
    } >>"$out/bench.txt" 2>"$scratch/fp8.err" || tail -20 "$scratch/fp8.err" ;;
esac
case ",$suite," in
  *,tiles,*)
    for sweep in simt_tile_sweep sm90_tile_sweep; do
      $py "tools/$sweep.py" >>"$out/bench.txt" 2>"$scratch/$sweep.err" || tail -20 "$scratch/$sweep.err"
    done ;;
esac

echo
echo "===== summary ====="
echo "tests (rc=$tests_rc): $tests_line"
echo "$sass_line"
cat "$out/bench.txt"
