#!/usr/bin/env bash
# Throughput and step-time split of every (data, tensor, pipeline) layout, and the measured
# pipeline bubble against the ideal (pp-1)/(m+pp-1).
#
# 1. Each layout of the layout matrix (dp,tp,pp) in (1,1,1) (2,1,1) (1,2,1) (1,1,2) (2,2,1)
#    (2,1,2) (1,2,2) (2,2,2) trains the MLP 784-HIDDEN-10 (1F1B, MICRO micro-batches) for STEPS
#    steps; from rank 0's metrics.csv (rows after WARMUP) the medians of samples/s and of each
#    phase: compute (t_forward + t_backward), tensor (t_tensor), bubble (t_pipeline), data
#    parallel (t_allreduce), optimizer, data.  More ranks than cores oversubscribe: on a 2-core
#    machine the 4- and 8-rank layouts measure time-sharing as much as the layout.
# 2. pp = 2 on 2 ranks (one core each), GPipe and 1F1B, m = 1, 4, 8, 16 micro-batches: the
#    bubble is stage 0's t_pipeline / step time, set beside (pp-1)/(m+pp-1).
#
# Writes bench/results/layouts.csv, layouts.md, bubble.csv, bubble.md.
# Usage: bench/layouts.sh   env: STEPS (30), WARMUP (5), HIDDEN ([4096,4096]), MICRO (4),
#        BUBBLE_HIDDEN ([2048,2048,2048]), BATCH (256), BUILD_DIR (build), DECK
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$top"
steps=${STEPS:-30}
warmup=${WARMUP:-5}
hidden=${HIDDEN:-[4096,4096]}
micro=${MICRO:-4}
bubble_hidden=${BUBBLE_HIDDEN:-[2048,2048,2048]}
batch=${BATCH:-256}
build=${BUILD_DIR:-build}
deck=${DECK:-inputs/fashion_mnist_mlp.toml}
results=bench/results
runs=$results/tmp/layouts
mkdir -p "$runs"
[[ -x "$build/tessera" ]] || { echo "error: $build/tessera not found" >&2; exit 1; }

# \brief train LABEL RANKS ARGS...: one run into $runs/LABEL
train() {
  local label=$1 ranks=$2
  shift 2
  OPENBLAS_NUM_THREADS=1 tools/mpirun.sh -n "$ranks" "$build/tessera" train "$deck" \
    --set train.steps="$steps" --set train.global_batch="$batch" --set eval.every_epoch=false \
    --set eval.at_end=false --set checkpoint.at_end=false --set checkpoint.every_steps=0 \
    --set train.log_every=1 --set schedule.kind=constant --set schedule.warmup_steps=0 \
    --set run.output_dir="$runs/$label" --set run.overwrite=true "$@" >/dev/null
  echo "layouts: $label done" >&2
}

summarise='
import csv, statistics, sys
path, warmup = sys.argv[1], int(sys.argv[2])
rows = [r for r in csv.DictReader(open(path)) if r["kind"] == "train" and int(r["step"]) > warmup]
med = lambda k: statistics.median(float(r[k] or 0) for r in rows)
step = statistics.median(sum(float(r[k] or 0) for k in ("t_data", "t_forward", "t_backward", "t_allreduce", "t_optimizer", "t_tensor", "t_pipeline")) for r in rows)
print(",".join(f"{v:.6g}" for v in (med("samples_per_s"), step * 1e3, (med("t_forward") + med("t_backward")) * 1e3,
      med("t_tensor") * 1e3, med("t_pipeline") * 1e3, med("t_allreduce") * 1e3, med("t_optimizer") * 1e3, med("t_data") * 1e3)))
'

echo "dp,tp,pp,ranks,samples_per_s,step_ms,compute_ms,tensor_ms,bubble_ms,dp_comm_ms,optimizer_ms,data_ms" >"$results/layouts.csv"
for l in 1,1,1 2,1,1 1,2,1 1,1,2 2,2,1 2,1,2 1,2,2 2,2,2; do
  IFS=, read -r d t p <<<"$l"
  n=$((d * t * p))
  train "l_${d}${t}${p}" "$n" --set "model.hidden=$hidden" --set parallel.data="$d" --set parallel.tensor="$t" \
    --set parallel.pipeline="$p" --set parallel.micro_batches="$micro"
  echo "$d,$t,$p,$n,$(/usr/bin/python3 -c "$summarise" "$runs/l_${d}${t}${p}/metrics.csv" "$warmup")" >>"$results/layouts.csv"
done

echo "schedule,micro_batches,samples_per_s,step_ms,bubble_ms,bubble_measured,bubble_ideal" >"$results/bubble.csv"
for schedule in gpipe 1f1b; do
  for m in 1 4 8 16; do
    train "b_${schedule}_$m" 2 --set "model.hidden=$bubble_hidden" --set parallel.pipeline=2 \
      --set parallel.micro_batches="$m" --set parallel.schedule="$schedule"
    IFS=, read -r rate step _ _ bubble _ <<<"$(/usr/bin/python3 -c "$summarise" "$runs/b_${schedule}_$m/metrics.csv" "$warmup")"
    echo "$schedule,$m,$rate,$step,$bubble,$(/usr/bin/python3 -c "print(f'{$bubble / $step:.3f},{1 / ($m + 1):.3f}')")" >>"$results/bubble.csv"
  done
done

/usr/bin/python3 - "$results" "$hidden" "$micro" "$steps" "$bubble_hidden" "$batch" <<'PY'
import csv, sys
res, hidden, micro, steps, bh, batch = sys.argv[1:]
rows = list(csv.DictReader(open(f"{res}/layouts.csv")))
out = [f"MLP 784-{hidden.strip('[]').replace(',', '-')}-10, global batch {batch}, 1F1B with {micro} micro-batches, "
       f"{steps} steps, medians of rank 0's per-step times (ms).", "",
       "| dp | tp | pp | ranks | samples/s | step | compute | tensor comm | bubble | data-parallel comm | optimizer | data |",
       "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
for r in rows:
    out.append("| " + " | ".join([r["dp"], r["tp"], r["pp"], r["ranks"], f"{float(r['samples_per_s']):.0f}"] +
               [f"{float(r[k]):.2f}" for k in ("step_ms", "compute_ms", "tensor_ms", "bubble_ms", "dp_comm_ms", "optimizer_ms", "data_ms")]) + " |")
open(f"{res}/layouts.md", "w").write("\n".join(out) + "\n")
rows = list(csv.DictReader(open(f"{res}/bubble.csv")))
out = [f"Pipeline bubble, pp = 2 on 2 ranks, MLP 784-{bh.strip('[]').replace(',', '-')}-10, global batch {batch}: "
       "stage 0's time waiting for its neighbour over its step time.", "",
       "| schedule | micro-batches | samples/s | step ms | bubble ms | bubble measured | ideal (pp-1)/(m+pp-1) |",
       "| --- | --- | --- | --- | --- | --- | --- |"]
for r in rows:
    out.append(f"| {r['schedule']} | {r['micro_batches']} | {float(r['samples_per_s']):.0f} | {float(r['step_ms']):.2f} | "
               f"{float(r['bubble_ms']):.2f} | {float(r['bubble_measured']):.1%} | {float(r['bubble_ideal']):.1%} |")
open(f"{res}/bubble.md", "w").write("\n".join(out) + "\n")
print(open(f"{res}/layouts.md").read()); print(open(f"{res}/bubble.md").read())
PY
