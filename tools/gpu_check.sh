#!/usr/bin/env bash
# On a GPU machine, in one call: build and install jaxgemm, run every test (GPU ones
# included), read the flagship kernel's SASS, run the benchmark; a short summary last.
#   tools/gpu_check.sh [bench suites, default tc,epilogue] [pytest args, default tests; "none" skips]
# Suites: jaxgemm.bench's (simt, tc, epilogue, smoke, all), "none", "conv" / "conv-bf16"
# (jaxgemm.bench_conv, both dtypes / bfloat16 only), and "tiles" (tools/simt_tile_sweep.py
# and tools/sm90_tile_sweep.py: every forced tile against XLA), comma-separated.
# Logs go to $OUT (the device tool's folder) or /tmp/jaxgemm_check.
set -uo pipefail
cd "$(dirname "$0")/.."
suite=${1:-tc,epilogue}
test_args=${2:-tests}
out=${OUT:-/tmp/jaxgemm_check}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=$(nproc)
# -P: import the installed jaxgemm, not the source folder in the working directory.
py="python3 -P"

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
start=$(date +%s)
if ! python3 -m pip install --no-build-isolation --no-deps -v . >"$out/build.log" 2>&1; then
  tail -40 "$out/build.log"; echo "BUILD FAILED"; exit 1
fi
grep -E "spill|CUDA handlers" "$out/build.log" | sort | uniq -c | head -20
echo "build: $(( $(date +%s) - start )) s"

start=$(date +%s)
if [ "$test_args" = none ]; then
  tests_rc=0 tests_line="not run"
else
  # eval: the pytest arguments may hold quoted words (-k 'simt or sm90').
  eval "$py -m pytest -q -rs $test_args -p no:cacheprovider" >"$out/tests.log" 2>&1
  tests_rc=$?
  tail -15 "$out/tests.log"
  tests_line=$(tail -1 "$out/tests.log")
  echo "tests: $(( $(date +%s) - start )) s"
fi

so=$($py -c "import glob, os, jaxgemm; print(glob.glob(os.path.join(os.path.dirname(jaxgemm.__file__), '_jaxgemm*.so'))[0])")
cuobjdump -sass "$so" >"$out/all.sass" 2>&1
# Kernels found by name pattern, in the sm_90a code only (the library also holds sm_80
# code, where the sm90 kernels are empty). The SIMT flagship: 128x128x16, 3 stages, f32 NN.
awk '/arch = /{arch = $3} /Function : /{if (f) exit; f = arch == "sm_90a" && /SimtGemmKernel/ && /SimtPolicyILi128ELi128ELi16ELi0ELi3E/ && /EffLb0ELb0ELb1EE/} f' "$out/all.sass" >"$out/flagship.sass"
sass_line="flagship SASS (128x128 f32 NN): FFMA=$(grep -c FFMA "$out/flagship.sass") LDS.128=$(grep -c 'LDS.128' "$out/flagship.sass") LDL/STL=$(grep -cE 'LDL|STL' "$out/flagship.sass")"
# The sm90 GEMM's clustered 128x256 bf16 NN instance, and the one-consumer 64x128 one.
# Policy arguments: tile N, pingpong, cluster blocks, element bytes, consumer warpgroups.
awk '/arch = /{arch = $3} /Function : /{if (f) exit; f = arch == "sm_90a" && /Sm90GemmKernel/ && /Sm90MatrixLoads/ && /Sm90PolicyILi256ELb0ELi2ELi2ELi2EE/ && /nv_bfloat16S3_Lb0ELb0E/} f' "$out/all.sass" >"$out/sm90.sass"
awk '/arch = /{arch = $3} /Function : /{if (f) exit; f = arch == "sm_90a" && /Sm90GemmKernel/ && /Sm90MatrixLoads/ && /Sm90PolicyILi128ELb0ELi1ELi2ELi1EE/ && /nv_bfloat16S3_Lb0ELb0E/} f' "$out/all.sass" >"$out/sm90_1.sass"
sass_line="$sass_line
sm90 SASS (cluster 2x 128x256 bf16 NN): HGMMA=$(grep -c HGMMA "$out/sm90.sass") UTMALDG=$(grep -c UTMALDG "$out/sm90.sass") UTMASTG=$(grep -c UTMASTG "$out/sm90.sass") LDL/STL=$(grep -cE 'LDL|STL' "$out/sm90.sass")
sm90 SASS (one consumer 64x128 bf16 NN): HGMMA=$(grep -c HGMMA "$out/sm90_1.sass") UTMALDG=$(grep -c UTMALDG "$out/sm90_1.sass") UTMASTG=$(grep -c UTMASTG "$out/sm90_1.sass") LDL/STL=$(grep -cE 'LDL|STL' "$out/sm90_1.sass")"
# The conv fprop instance of the same kernel (pingpong bf16), found by name pattern.
awk '/arch = /{arch = $3} /Function : /{if (f) exit; f = arch == "sm_90a" && /Sm90GemmKernel/ && /Sm90ConvFpropLoads/ && /Sm90PolicyILi128ELb1E/ && /nv_bfloat16S3_/} f' "$out/all.sass" >"$out/sm90_conv.sass"
sass_line="$sass_line
sm90 conv fprop SASS (pingpong bf16): HGMMA=$(grep -c HGMMA "$out/sm90_conv.sass") UTMALDG.IM2COL=$(grep -c 'UTMALDG.4D.IM2COL' "$out/sm90_conv.sass") LDL/STL=$(grep -cE 'LDL|STL' "$out/sm90_conv.sass")"

gemm_suites=$(echo "$suite" | tr ',' '\n' | grep -vE '^(conv|conv-bf16|none|tiles)$' | paste -sd, -)
: >"$out/bench.txt"
if [ -n "$gemm_suites" ]; then
  $py -m jaxgemm.bench --suite "$gemm_suites" --json "$out/bench.json" >>"$out/bench.txt" 2>"$out/bench.err" ||
    tail -20 "$out/bench.err"
fi
conv_dtypes=""
case ",$suite," in
  *,conv,*) conv_dtypes=bfloat16,float32 ;;
  *,conv-bf16,*) conv_dtypes=bfloat16 ;;
esac
if [ -n "$conv_dtypes" ]; then
  $py -m jaxgemm.bench_conv --dtypes "$conv_dtypes" --json "$out/bench_conv.json" >>"$out/bench.txt" 2>"$out/bench_conv.err" ||
    tail -20 "$out/bench_conv.err"
fi
case ",$suite," in
  *,tiles,*)
    for sweep in simt_tile_sweep sm90_tile_sweep; do
      $py "tools/$sweep.py" >>"$out/bench.txt" 2>"$out/$sweep.err" || tail -20 "$out/$sweep.err"
    done ;;
esac

echo
echo "===== summary ====="
echo "tests (rc=$tests_rc): $tests_line"
echo "$sass_line"
cat "$out/bench.txt"
