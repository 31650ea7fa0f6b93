#!/usr/bin/env bash
# How much of the gradient exchange hides behind backward: the same training run with
# comm.overlap = false (every bucket exchanged after backward, blocking) and = true (each full
# bucket's nonblocking exchange started from the backward hooks), alternated REPS times, and
# the same for each ZeRO stage. From each run's metrics.csv (train rows after the first WARMUP
# steps) it takes the median step time (t_data + t_forward + t_backward + t_allreduce +
# t_optimizer) and the median exposed exchange time t_allreduce (time the step waited for
# communication). hidden share = 1 - exposed(overlap on) / exposed(overlap off).
#
# Writes bench/results/step_overlap.csv (zero,overlap,rep,step_ms,exchange_ms) and
# bench/results/step_overlap.md (medians and the hidden share per stage).
#
# Usage: bench/step_overlap.sh      (needs build/tessera and data/fashion-mnist.h5)
# env: RANKS (2), REPS (3), STEPS (150), WARMUP (20), HIDDEN ("[1024,1024,1024]"),
#      BUCKET_MB (4), ZEROS ("0 1 2 3"), BUILD_DIR (build), DECK (inputs/fashion_mnist_mlp.toml)
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$top"

ranks=${RANKS:-2}
reps=${REPS:-3}
steps=${STEPS:-150}
warmup=${WARMUP:-20}
hidden=${HIDDEN:-[1024,1024,1024]}
bucket_mb=${BUCKET_MB:-4}
read -r -a zeros <<<"${ZEROS:-0 1 2 3}"
build=${BUILD_DIR:-build}
deck=${DECK:-inputs/fashion_mnist_mlp.toml}
results=bench/results
runs=$results/tmp/step_overlap
csv=$results/step_overlap.csv
md=$results/step_overlap.md
[[ -x "$build/tessera" ]] || { echo "error: $build/tessera not found" >&2; exit 1; }
mkdir -p "$runs"

echo "zero,overlap,rep,step_ms,exchange_ms" >"$csv"
for rep in $(seq 1 "$reps"); do
  for zero in "${zeros[@]}"; do
    for overlap in false true; do
      dir=$runs/z${zero}_${overlap}
      OPENBLAS_NUM_THREADS=1 tools/mpirun.sh -n "$ranks" "$build/tessera" train "$deck" \
        --set train.steps="$steps" --set "model.hidden=$hidden" --set comm.bucket_mb="$bucket_mb" \
        --set comm.overlap="$overlap" --set parallel.zero="$zero" --set eval.every_epoch=false \
        --set eval.at_end=false --set checkpoint.at_end=false --set checkpoint.every_steps=0 \
        --set train.log_every=1 --set schedule.kind=constant --set schedule.warmup_steps=0 \
        --set run.output_dir="$dir" --set run.overwrite=true >/dev/null
      /usr/bin/python3 - "$dir/metrics.csv" "$warmup" "$zero" "$overlap" "$rep" >>"$csv" <<'PY'
import csv, statistics, sys
path, warmup, zero, overlap, rep = sys.argv[1], int(sys.argv[2]), *sys.argv[3:]
rows = [r for r in csv.DictReader(open(path)) if r["kind"] == "train" and int(r["step"]) > warmup]
parts = ["t_data", "t_forward", "t_backward", "t_allreduce", "t_optimizer"]
step = statistics.median(sum(float(r[p]) for p in parts) for r in rows)
exch = statistics.median(float(r["t_allreduce"]) for r in rows)
print(f"{zero},{overlap},{rep},{step * 1e3:.4f},{exch * 1e3:.4f}")
PY
      echo "step_overlap: zero=$zero overlap=$overlap rep=$rep done" >&2
    done
  done
done

/usr/bin/python3 - "$csv" "$md" "$ranks" "$hidden" "$bucket_mb" "$steps" <<'PY'
import csv, statistics, sys
src, out, ranks, hidden, bucket, steps = sys.argv[1:]
rows = list(csv.DictReader(open(src)))
med = lambda z, o, k: statistics.median(float(r[k]) for r in rows if r["zero"] == z and r["overlap"] == o)
lines = [f"Step time and exposed gradient exchange, {ranks} ranks, MLP 784-{hidden.strip('[]').replace(',', '-')}-10, "
         f"buckets of {bucket} MB, {steps} steps, medians over runs of per-step medians.", "",
         "| ZeRO | step ms (overlap off) | step ms (on) | exchange ms (off) | exposed ms (on) | hidden share | step speed-up |",
         "| --- | --- | --- | --- | --- | --- | --- |"]
for z in sorted({r["zero"] for r in rows}):
    s0, s1, e0, e1 = med(z, "false", "step_ms"), med(z, "true", "step_ms"), med(z, "false", "exchange_ms"), med(z, "true", "exchange_ms")
    lines.append(f"| {z} | {s0:.2f} | {s1:.2f} | {e0:.2f} | {e1:.2f} | {1 - e1 / e0:.0%} | {s0 / s1:.2f}x |")
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
