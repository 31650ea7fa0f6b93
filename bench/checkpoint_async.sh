#!/usr/bin/env bash
# What a checkpoint costs the training loop, synchronous against asynchronous (checkpoint.async):
# the same run of a large MLP (HIDDEN, about 300 MB of parameters and momentum per checkpoint)
# with no checkpoints, with synchronous ones and with asynchronous ones every EVERY steps,
# alternated REPS times. From each run's log.txt: the pause a checkpoint puts into the loop
# (synchronous: the whole write; asynchronous: the staging copy plus any wait for the previous
# write), the background write time; from summary.json-free timing: the run's wall time
# (the last metrics row's wall_s). Ratios against the run without checkpoints.
#
# Writes bench/results/checkpoint_async.csv (mode,rep,wall_s,pause_s,written_s,checkpoints) and
# bench/results/checkpoint_async.md (medians).
#
# Usage: bench/checkpoint_async.sh      (needs build/tessera and data/fashion-mnist.h5)
# env: RANKS (2), REPS (3), STEPS (40), EVERY (10), HIDDEN ("[4096,4096,4096]"), BUILD_DIR (build)
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$top"

ranks=${RANKS:-2}
reps=${REPS:-3}
steps=${STEPS:-40}
every=${EVERY:-10}
hidden=${HIDDEN:-[4096,4096,4096]}
build=${BUILD_DIR:-build}
results=bench/results
runs=$results/tmp/checkpoint_async
mkdir -p "$runs"
csv=$results/checkpoint_async.csv
echo "mode,rep,wall_s,pause_s,written_s,checkpoints" >"$csv"

run_once() {  # $1 mode (none|sync|async), $2 rep
  local mode=$1 rep=$2 dir=$runs/$1_$2
  local every_steps=$every async=false
  [[ $mode == none ]] && every_steps=0
  [[ $mode == async ]] && async=true
  rm -rf "$dir"
  tools/mpirun.sh -n "$ranks" "$build/tessera" train inputs/fashion_mnist_mlp.toml \
    --set "model.hidden=$hidden" --set train.steps="$steps" --set train.log_every=1 \
    --set eval.every_epoch=false --set eval.at_end=false --set schedule.warmup_steps=0 \
    --set checkpoint.every_steps="$every_steps" --set checkpoint.keep=2 \
    --set checkpoint.async="$async" --set run.output_dir="$dir" >"$dir.out" 2>&1 ||
    { echo "run $mode $rep failed: $dir.out" >&2; exit 1; }
  # The pause of each checkpoint in the loop, and the background write time (async).
  /usr/bin/python3 - "$dir" "$mode" "$rep" >>"$csv" <<'EOF'
import csv, re, sys
d, mode, rep = sys.argv[1:4]
log = open(f"{d}/log.txt").read()
pause = written = 0.0
count = 0
# Only the checkpoints of the EVERY schedule: the final one at the end of the run is not in the loop.
for m in re.finditer(r"checkpoint \S+ \((\d+\.\d+) s\)", log):
    pause += float(m.group(1)); count += 1
for m in re.finditer(r"staged in (\d+\.\d+) s", log):
    pause += float(m.group(1)); count += 1
for m in re.finditer(r"written in the background in (\d+\.\d+) s; waited (\d+\.\d+) s", log):
    written += float(m.group(1)); pause += float(m.group(2))
rows = [r for r in csv.DictReader(open(f"{d}/metrics.csv")) if r["kind"] == "train"]
print(f"{mode},{rep},{float(rows[-1]['wall_s']):.3f},{pause:.3f},{written:.3f},{count}")
EOF
}

for rep in $(seq 1 "$reps"); do
  for mode in none sync async; do run_once "$mode" "$rep"; done
done

/usr/bin/python3 - "$csv" "$results/checkpoint_async.md" "$ranks" "$steps" "$every" "$hidden" <<'EOF'
import csv, statistics, subprocess, sys
path, out, ranks, steps, every, hidden = sys.argv[1:7]
rows = list(csv.DictReader(open(path)))
def med(mode, key):
    return statistics.median(float(r[key]) for r in rows if r["mode"] == mode)
cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
load = open("/proc/loadavg").read().split()[0]
base = med("none", "wall_s")
lines = [f"Checkpoint cost in the loop: MLP hidden {hidden}, {ranks} ranks, {steps} steps, a checkpoint every {every} "
         f"steps; {cpu}; load {load} at the end; medians of {len(rows) // 3} runs (bench/checkpoint_async.sh).", "",
         "| mode | wall s | x no checkpoints | pause in the loop, s (all checkpoints) | written in the background, s | checkpoints |",
         "| --- | ---: | ---: | ---: | ---: | ---: |"]
for mode in ("none", "sync", "async"):
    lines.append(f"| {mode} | {med(mode, 'wall_s'):.2f} | {med(mode, 'wall_s') / base:.3f} | {med(mode, 'pause_s'):.3f} | "
                 f"{med(mode, 'written_s'):.2f} | {int(med(mode, 'checkpoints'))} |")
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
