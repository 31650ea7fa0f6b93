#!/usr/bin/env bash
# The pipeline bubble of 1F1B and of interleaved 1F1B (parallel.virtual_stages = v) beside the
# ideal (pp-1)/(v*m+pp-1).
#
# pp = 2 stages on 2 ranks, m = MICRO micro-batches, v = 1 and 2, the MLP 784-HIDDEN-10 (eight
# layers by default: with v = 2 each stage holds two chunks of two layers, and both splits give
# the stages the same layers' worth of work) for STEPS steps. Each stage's bubble is its
# summary.json bubble_by_stage: the share of its step time spent waiting in pipeline receives
# (Phase::pipeline, t_pipeline in metrics.csv), over the whole run. v = 1 and v = 2 alternate
# REPS times; the table shows the medians.
#
# Writes bench/results/interleaved.csv and interleaved.md.
# Usage: bench/interleaved.sh   env: STEPS (40), MICRO (4), HIDDEN ([1024,1024,1024,1024,1024,1024,1024]),
#        BATCH (256), REPS (3), BUILD_DIR (build), DECK
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$top"
steps=${STEPS:-40}
micro=${MICRO:-4}
hidden=${HIDDEN:-[1024,1024,1024,1024,1024,1024,1024]}
batch=${BATCH:-256}
reps=${REPS:-3}
build=${BUILD_DIR:-build}
deck=${DECK:-inputs/fashion_mnist_mlp.toml}
results=bench/results
runs=$results/tmp/interleaved
mkdir -p "$runs"
[[ -x "$build/tessera" ]] || { echo "error: $build/tessera not found" >&2; exit 1; }

echo "rep,pp,micro_batches,virtual_stages,samples_per_s,bubble_stage0,bubble_stage1,bubble_ideal" >"$results/interleaved.csv"
for rep in $(seq "$reps"); do
  for v in 1 2; do
    dir=$runs/v$v
    OPENBLAS_NUM_THREADS=1 tools/mpirun.sh -n 2 "$build/tessera" train "$deck" \
      --set train.steps="$steps" --set train.global_batch="$batch" --set eval.every_epoch=false \
      --set eval.at_end=false --set checkpoint.at_end=false --set checkpoint.every_steps=0 \
      --set train.log_every=10 --set "model.hidden=$hidden" --set parallel.pipeline=2 \
      --set parallel.micro_batches="$micro" --set parallel.virtual_stages="$v" \
      --set run.output_dir="$dir" --set run.overwrite=true >/dev/null
    /usr/bin/python3 - "$dir/summary.json" "$micro" "$v" "$rep" >>"$results/interleaved.csv" <<'PY'
import json, sys
s, m, v, rep = json.load(open(sys.argv[1])), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
b = s["bubble_by_stage"]
print(f"{rep},2,{m},{v},{s['samples_per_s']:.1f},{b[0]:.4f},{b[1]:.4f},{1 / (v * m + 1):.4f}")
PY
    echo "interleaved: rep $rep v=$v done" >&2
  done
done

/usr/bin/python3 - "$results" "$hidden" "$batch" "$steps" "$reps" <<'PY'
import csv, statistics, sys
res, hidden, batch, steps, reps = sys.argv[1:]
rows = list(csv.DictReader(open(f"{res}/interleaved.csv")))
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
out = [f"Pipeline bubble, pp = 2 on 2 ranks, MLP 784-{hidden.strip('[]').replace(',', '-')}-10, global batch {batch}, "
       f"{steps} steps, medians of {reps} alternated runs ({cpu}): each stage's time waiting in pipeline "
       "receives over its step time.", "",
       "| virtual stages v | micro-batches m | samples/s | bubble stage 0 | bubble stage 1 | ideal (pp-1)/(v m+pp-1) |",
       "| --- | --- | --- | --- | --- | --- |"]
for v in sorted({r["virtual_stages"] for r in rows}):
    mine = [r for r in rows if r["virtual_stages"] == v]
    med = lambda k: statistics.median(float(r[k]) for r in mine)
    out.append(f"| {v} | {mine[0]['micro_batches']} | {med('samples_per_s'):.0f} | {med('bubble_stage0'):.1%} | "
               f"{med('bubble_stage1'):.1%} | {float(mine[0]['bubble_ideal']):.1%} |")
open(f"{res}/interleaved.md", "w").write("\n".join(out) + "\n")
print(open(f"{res}/interleaved.md").read())
PY
