#!/usr/bin/env bash
# A/B on one GPU: another source tree (A) against the working tree (B), each built, installed
# and benchmarked one after the other on the same machine, then compared row by row
# (tools/ab_compare.py: our time B/A, with XLA's own drift between the runs beside it).
#   mkdir -p ab/base && git archive <rev> | tar -x -C ab/base   # here (ab/ is git-ignored: carry ["ab"])
#   tools/gpu_ab.sh ab/base [bench suites, default tc,epilogue; "none": skip] [conv,ragged,zoo]
# "conv" adds jaxgemm.bench.conv --dtypes bfloat16; "ragged" adds jaxgemm.bench.ragged (both
# trees must have it; a tree from before jaxgemm/bench/ runs its jaxgemm.bench_conv /
# bench_ragged); "zoo" adds tools/shape_zoo.py (this tree's, for both builds). Results go to
# $OUT (the device tool's folder) or /tmp/jaxgemm_ab. SKIP_BUILD=1: B is
# the jaxgemm already installed from the working tree (a warm machine's earlier
# tools/gpu_check.sh): B is benchmarked first, then A is built and benchmarked (and stays
# installed: rebuild B before anything else). AB_ONLY=B or AB_ONLY=A runs one side only
# (two calls where both do not fit in one; compare here with tools/ab_compare.py on the
# fetched A*.json and B*.json). AB_PREBUILT=DIR: no builds; each side imports the jaxgemm
# installed in DIR/A or DIR/B (pip install --target of wheels built here and carried).
# Extras "ragged-product": jaxgemm.bench.ragged --no-xla (the grouped kernel, forward and
# backward, without XLA's slow ragged dot); "ragged-epilogue": --epilogue gelu and --glu,
# without XLA's ragged dot (the grouped kernel's epilogues).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
base=$1
suites=${2:-tc,epilogue}
extras=",${3:-},"
out=${OUT:-/tmp/jaxgemm_ab}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=$(nproc)

bench_module() {  # bench_module conv: the installed tree's jaxgemm.bench.conv, or an older tree's jaxgemm.bench_conv
  if (cd /tmp && python3 -P -c "import jaxgemm.bench.$1") 2>/dev/null; then echo "jaxgemm.bench.$1"; else echo "jaxgemm.bench_$1"; fi
}

run() {  # run NAME TREE [skip]: build TREE (unless skip), benchmark it into $out/NAME*.json
  local name=$1 tree=$2 start=$SECONDS
  if [ -n "${AB_PREBUILT:-}" ]; then
    export PYTHONPATH="$AB_PREBUILT/$name"
  elif [ "${3:-}" != skip ]; then
    if ! (cd "$tree" && python3 -m pip install --no-build-isolation --no-deps -q . >"$out/$name.build.log" 2>&1); then
      tail -30 "$out/$name.build.log"; echo "$name: BUILD FAILED"; return 1
    fi
    echo "$name: built in $(( SECONDS - start )) s"
  fi
  # -P and a neutral folder: import the installed jaxgemm, not a source tree.
  if [ "$suites" != none ]; then
    (cd /tmp && python3 -P -m jaxgemm.bench --suite "$suites" --json "$out/$name.json" >"$out/$name.txt" 2>"$out/$name.err") ||
      tail -20 "$out/$name.err"
  fi
  if [[ $extras == *,conv,* ]]; then
    (cd /tmp && python3 -P -m "$(bench_module conv)" --dtypes bfloat16 --json "$out/${name}_conv.json" >>"$out/$name.txt" 2>>"$out/$name.err") ||
      tail -20 "$out/$name.err"
  fi
  if [[ $extras == *,zoo,* ]]; then
    (cd /tmp && python3 -P "$root/tools/shape_zoo.py" --json "$out/${name}_zoo.json" >>"$out/$name.txt" 2>>"$out/$name.err") ||
      tail -20 "$out/$name.err"
  fi
  if [[ $extras == *,ragged,* ]]; then
    (cd /tmp && python3 -P -m "$(bench_module ragged)" --json "$out/${name}_ragged.json" >>"$out/$name.txt" 2>>"$out/$name.err") ||
      tail -20 "$out/$name.err"
  fi
  if [[ $extras == *,ragged-product,* ]]; then
    (cd /tmp && python3 -P -m "$(bench_module ragged)" --no-xla >>"$out/${name}_ragged_product.txt" 2>>"$out/$name.err") ||
      tail -20 "$out/$name.err"
  fi
  if [[ $extras == *,ragged-epilogue,* ]]; then
    for flag in "--epilogue gelu" --glu; do
      (cd /tmp && python3 -P -m "$(bench_module ragged)" $flag --no-xla >>"$out/${name}_ragged_epilogue.txt" 2>>"$out/$name.err") ||
        tail -20 "$out/$name.err"
    done
  fi
  echo "$name: built and benchmarked in $(( SECONDS - start )) s"
}

case ${AB_ONLY:-} in
  B) run B . "$([ "${SKIP_BUILD:-0}" = 1 ] && echo skip)" || exit 1; exit 0 ;;
  A) run A "$base" || exit 1; exit 0 ;;
esac
if [ "${SKIP_BUILD:-0}" = 1 ] || [ -n "${AB_PREBUILT:-}" ]; then
  run B . skip && run A "$base" || exit 1
else
  run A "$base" && run B . || exit 1
fi
[ "$suites" != none ] && python3 tools/ab_compare.py "$out/A.json" "$out/B.json"
[[ $extras == *,conv,* ]] && python3 tools/ab_compare.py "$out/A_conv.json" "$out/B_conv.json"
[[ $extras == *,zoo,* ]] && python3 tools/ab_compare.py "$out/A_zoo.json" "$out/B_zoo.json"
[[ $extras == *,ragged,* ]] && grep -hE "^(case|mixtral|fine)" "$out/A.txt" "$out/B.txt"
[[ $extras == *,ragged-epilogue,* ]] && grep -hE "^(case|mixtral|fine)" "$out/A_ragged_epilogue.txt" "$out/B_ragged_epilogue.txt"
exit 0
