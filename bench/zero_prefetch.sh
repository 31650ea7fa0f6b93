#!/usr/bin/env bash
# parallel.zero_prefetch (docs/design.md, "Gathering ahead"): what gathering ZeRO 3's next bucket
# while this one computes saves a step, against gathering each bucket when it is asked for.
#
# A byte-level GPT (inputs/kjv_gpt.toml at WIDTH x LAYERS, CONTEXT, global batch BATCH, AdamW,
# ZeRO 3) in each case of CASES, with parallel.zero_prefetch true and false alternated REPS times:
#   values1  1 rank, the optimizer state and the parameter values on disk (optimizer.offload =
#            "disk", offload_values = true, OFFLOAD_PATH): each gather reads its bucket from the file
#   values2  the same on 2 ranks: each reads its chunk, then the allgather
#   memory2  2 ranks, the values in memory: each gather is an allgather
# From metrics.csv (train rows after step WARMUP) the median step time (global batch /
# samples_per_s) and the fastest step; from summary.json's zero_gathers the seconds the most
# waiting rank spent in its gathers per step (after the first step: the per-run total over the
# steps), and the gathers made ahead, dropped and in all; the gathers' bytes read per step.
#
# Writes bench/results/zero_prefetch[_LABEL].csv (case,prefetch,rep,step_s,fastest_step_s,
# gather_s_per_step,gathers,gathered_ahead,dropped,gather_mb_per_step,param_peak_mb),
# zero_prefetch[_LABEL]_sitting.txt (date, CPU, load averages at the start and the end) and
# zero_prefetch[_LABEL].md (medians, ratios).
#
# Usage: bench/zero_prefetch.sh   (needs build/tessera; makes its token file from README.md docs/*.md)
# env: REPS (3), STEPS (8), WARMUP (2), WIDTH (512), LAYERS (4), CONTEXT (128), BATCH (8),
#      CASES ("values1 values2 memory2"), OFFLOAD_PATH ($TMPDIR, else /tmp), BUILD_DIR (build),
#      LABEL (names the files zero_prefetch_LABEL*), TABLE_ONLY=1 (rewrite the .md from the CSV)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$here/lib.sh"
cd "$here/.."

gpt_step_settings
read -r -a cases <<<"${CASES:-values1 values2 memory2}"
build=${BUILD_DIR:-build}
offload_dir=${OFFLOAD_PATH:-${TMPDIR:-/tmp}}
results=bench/results
runs=$results/tmp/zero_prefetch
data=$runs/docs.h5
name=zero_prefetch${LABEL:+_$LABEL}
csv=$results/$name.csv
sitting=$results/${name}_sitting.txt
md=$results/$name.md

[[ -x "$build/tessera" ]] || die "$build/tessera not found" "tools/setup.sh $build"
[[ -d "$offload_dir" && -w "$offload_dir" ]] || die "offload path '$offload_dir' is not a writable directory" \
  "set OFFLOAD_PATH (or TMPDIR) to node-local scratch"

# \brief The rank count and --set arguments of a case.
case_args() {
  case "$1" in
    values1) echo "1 --set optimizer.offload=\"disk\" --set optimizer.offload_values=true" ;;
    values2) echo "2 --set optimizer.offload=\"disk\" --set optimizer.offload_values=true" ;;
    memory2) echo "2 --set optimizer.offload=\"none\"" ;;
    *) die "unknown case '$1'" "CASES: values1, values2, memory2" ;;
  esac
}
for c in "${cases[@]}"; do case_args "$c" >/dev/null; done

if [[ -z "${TABLE_ONLY:-}" ]]; then
  mkdir -p "$runs"
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  [[ -f "$data" ]] || "$build/tessera" prepare text --out "$data" README.md docs/*.md >/dev/null
  { date -u '+%F %T UTC'; grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-; cut -d' ' -f1-3 /proc/loadavg; } >"$sitting"
  echo "case,prefetch,rep,step_s,fastest_step_s,gather_s_per_step,gathers,gathered_ahead,dropped,gather_mb_per_step,param_peak_mb" >"$csv"
  for rep in $(seq 1 "$reps"); do
    for c in "${cases[@]}"; do
      for prefetch in true false; do
        read -r ranks args <<<"$(case_args "$c")"
        read -r -a extra <<<"$args"
        dir=$runs/${c}_$prefetch
        rm -rf "$dir"
        tools/mpirun.sh -n "$ranks" "$build/tessera" train inputs/kjv_gpt.toml --set "data.path=\"$data\"" \
          --set train.log_every=1 --set eval.every_steps=0 --set eval.at_end=false --set checkpoint.at_end=false \
          --set checkpoint.every_steps=0 --set run.overwrite=true --set "optimizer.offload_path=\"$offload_dir\"" \
          --set model.width="$width" --set model.layers="$layers" --set model.context="$context" \
          --set train.global_batch="$batch" --set eval.batch="$batch" --set train.steps="$steps" \
          --set parallel.zero=3 --set parallel.zero_prefetch="$prefetch" "${extra[@]}" \
          --set "run.output_dir=\"$dir\"" >"$dir.out" 2>&1 ||
          { echo "error: run $c prefetch=$prefetch rep $rep failed; see $dir.out" >&2; tail -n 5 "$dir.out" >&2; exit 1; }
        /usr/bin/python3 - "$dir" "$warmup" "$c" "$prefetch" "$rep" "$batch" >>"$csv" <<'PY'
import csv, json, statistics, sys
d, warmup, case, prefetch, rep, batch = sys.argv[1], int(sys.argv[2]), *sys.argv[3:6], int(sys.argv[6])
rows = [r for r in csv.DictReader(open(f"{d}/metrics.csv")) if r["kind"] == "train" and int(r["step"]) > warmup]
step = statistics.median(batch / float(r["samples_per_s"]) for r in rows)
fastest = min(batch / float(r["samples_per_s"]) for r in rows)
s = json.load(open(f"{d}/summary.json"))
g = s["zero_gathers"]
gather = (s.get("optimizer_offload") or {}).get("gather_bytes_read_per_step") or 0.0
print(f"{case},{prefetch},{rep},{step:.4f},{fastest:.4f},{g['seconds'] / s['steps']:.4f},{g['gathers']:.0f},"
      f"{g['gathered_ahead']:.0f},{g['dropped']:.0f},{gather / 1e6:.2f},{s['memory']['param_peak_bytes'] / 1e6:.2f}")
PY
        echo "zero_prefetch: $c prefetch=$prefetch rep $rep done" >&2
      done
    done
  done
  cut -d' ' -f1-3 /proc/loadavg >>"$sitting"
fi

/usr/bin/python3 - "$csv" "$sitting" "$width" "$layers" "$context" "$batch" "$steps" "$warmup" >"$md" <<'PY'
import csv, statistics, sys
path, sitting, width, layers, context, batch, steps, warmup = sys.argv[1:]
rows = list(csv.DictReader(open(path)))
lines = open(sitting).read().splitlines()
print(f"# ZeRO 3 gathering ahead (parallel.zero_prefetch)\n")
print(f"Sitting: {lines[0]}; CPU{lines[1] if len(lines) > 1 else ''}; load averages (1, 5, 15 min) "
      f"{lines[2] if len(lines) > 2 else '?'} at the start, {lines[3] if len(lines) > 3 else '?'} at the end.")
print(f"GPT width {width}, {layers} blocks, context {context}, global batch {batch}, AdamW, ZeRO 3, "
      f"{steps} steps; medians over the runs of each run's median step after step {warmup}.\n")
print("| case | prefetch | runs | step s | fastest step s | gather s per step | ahead / gathers | dropped | gather MB read per step | param peak MB | step / on use |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
med = lambda rs, k: statistics.median(float(r[k]) for r in rs)
for case in dict.fromkeys(r["case"] for r in rows):
    base = [r for r in rows if r["case"] == case and r["prefetch"] == "false"]
    for prefetch in ("false", "true"):
        rs = [r for r in rows if r["case"] == case and r["prefetch"] == prefetch]
        if not rs:
            continue
        ratio = med(rs, "step_s") / med(base, "step_s") if base else float("nan")
        print(f"| {case} | {prefetch} | {len(rs)} | {med(rs, 'step_s'):.3f} | {med(rs, 'fastest_step_s'):.3f} | "
              f"{med(rs, 'gather_s_per_step'):.3f} | {rs[0]['gathered_ahead']} / {rs[0]['gathers']} | {rs[0]['dropped']} | "
              f"{med(rs, 'gather_mb_per_step'):.1f} | {med(rs, 'param_peak_mb'):.1f} | {ratio:.2f} |")
PY
echo "zero_prefetch: wrote $csv and $md" >&2
