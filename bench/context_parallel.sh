#!/usr/bin/env bash
# Context parallelism (parallel.spatial = C, docs/models.md) on a small llama
# (bench/context_llama.toml: 2 blocks, 8 heads, 2 key/value heads, width 128, one sequence per
# step), for each parallel.context_comm given (argument 1, default "all_to_all ring"; a comm type
# this build refuses is recorded as refused and the others go on):
#
# 1. Speed and memory: C = 1 (once; no context group) and each C of RANKS, at contexts from
#    CONTEXT_MIN doubling while `tessera check --ranks C` estimates the run within LIMIT_MB per rank
#    (and up to MAX_CONTEXT); REPS runs of STEPS steps each, under run.memory_limit_mb = LIMIT_MB.
#    From each run: tokens/s (metrics.csv, the median of the steps after WARMUP), rank 0's counted
#    peaks (summary.json: memory.act_peak_bytes, and every category together), the bytes a rank hands
#    to its context group per step as the communicator counts them (summary.json
#    comm.bytes_per_step_by_group.spatial over C: its own part of each all-to-all included) and what
#    `tessera check` predicts it sends to the other ranks (src/train/context_traffic.hpp).
# 2. The longest context that trains under run.memory_limit_mb = LIMIT_MB for each C: bisection
#    over multiples of CONTEXT_STEP with `tessera check` (the estimate), then 2-step runs: the
#    chosen context must train (one step down while the run is refused, by the estimate or by the
#    measured peak after step 1), the next one up must be refused.
#
# Writes bench/results/context_parallel[_LABEL]_speed.csv (comm,ranks,context,rep,result,tokens_per_s,
# act_peak_mb,peak_mb,counted_bytes_per_rank,predicted_sent_mb), _limit.csv (comm,ranks,role,context,
# estimate_mb,result,peak_mb,act_peak_mb), _sitting.txt (date, CPU, load at the start and the end) and .md.
#
# Usage: bench/context_parallel.sh ["all_to_all ring"]   (needs build/tessera; makes its token file
#        from README.md docs/*.md)
# env: RANKS ("2 4"), CONTEXT_MIN (1024), MAX_CONTEXT (16384), LIMIT_MB (2000), CONTEXT_STEP (256),
#      REPS (3), STEPS (6), WARMUP (2), BUILD_DIR (build), LABEL, SKIP_SPEED=1, SKIP_LIMIT=1,
#      TABLE_ONLY=1 (rewrite the .md from the CSVs)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$here/lib.sh"
top=$(cd "$here/.." && pwd)
cd "$top"

read -r -a comms <<<"${1:-all_to_all ring}"
read -r -a rank_counts <<<"${RANKS:-2 4}"
context_min=${CONTEXT_MIN:-1024}
max_context=${MAX_CONTEXT:-16384}
limit=${LIMIT_MB:-2000}
context_step=${CONTEXT_STEP:-256}
reps=${REPS:-3}
steps=${STEPS:-6}
warmup=${WARMUP:-2}
build=${BUILD_DIR:-build}
deck=bench/context_llama.toml
results=bench/results
runs=$results/tmp/context_parallel
data=$runs/docs.h5
name=context_parallel${LABEL:+_$LABEL}
speed_csv=$results/${name}_speed.csv
limit_csv=$results/${name}_limit.csv
sitting=$results/${name}_sitting.txt
md=$results/$name.md

for comm in "${comms[@]}"; do
  [[ $comm == all_to_all || $comm == ring ]] || die "comm type '$comm': expected all_to_all or ring"
done
for c in "${rank_counts[@]}"; do [[ $c =~ ^[1-9][0-9]*$ ]] || die "RANKS: '$c' is not a positive integer"; done
[[ "$reps" =~ ^[1-9][0-9]*$ ]] || die "REPS='$reps' is not a positive integer"
[[ "$steps" =~ ^[0-9]+$ && "$warmup" =~ ^[0-9]+$ && "$steps" -gt "$warmup" ]] ||
  die "STEPS='$steps' must be larger than WARMUP='$warmup'"
[[ "$context_step" =~ ^[1-9][0-9]*$ && "$context_min" =~ ^[1-9][0-9]*$ && "$limit" =~ ^[1-9][0-9]*$ ]] ||
  die "CONTEXT_STEP, CONTEXT_MIN and LIMIT_MB must be positive integers"
[[ "${LABEL:-x}" =~ ^[A-Za-z0-9_.-]+$ ]] || die "LABEL='$LABEL': letters, digits, '.', '_' and '-' only"
[[ -x "$build/tessera" ]] || die "$build/tessera not found" "tools/setup.sh $build"
mkdir -p "$runs"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=passive
[[ -f "$data" ]] || "$build/tessera" prepare text --out "$data" README.md docs/*.md >/dev/null
if [[ -z "${TABLE_ONLY:-}" ]]; then
  {
    date -u +%F
    grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2 | xargs
    cut -d' ' -f1-3 /proc/loadavg
  } >"$sitting"
fi

common=(--set "data.path=\"$data\"" --set run.overwrite=true --set run.memory_limit_mb="$limit")

# \brief The --set arguments of C context ranks under a comm type at a context (C = 1: none).
# \param $1 comm, $2 C, $3 context
layout_args() {
  if (($2 == 1)); then
    echo "--set model.context=$3"
  else
    echo "--set model.context=$3 --set parallel.spatial=$2 --set parallel.context_comm=\"$1\""
  fi
}

# \brief `tessera check` of a layout: prints "ESTIMATE_MB PREDICTED_SENT_MB" (the latter 0 at
# C = 1) when the deck is valid and its estimate fits LIMIT_MB, nothing otherwise.
# \param $1 comm, $2 C, $3 context
estimate() {
  local out est sent
  local -a set
  read -r -a set <<<"$(layout_args "$@")"
  out=$("$build/tessera" check "$deck" "${common[@]}" "${set[@]}" --ranks "$2" 2>&1) || return 0
  est=$(sed -nE 's/^memory per rank \(estimate.*, total ([0-9.]+) MB$/\1/p' <<<"$out")
  sent=$(sed -nE 's/.* sends ([0-9.]+) MB per step to the other ranks.*/\1/p' <<<"$out")
  echo "$est ${sent:-0}"
}

# \brief One training run; prints its CSV fields
# "result,tokens_per_s,act_peak_mb,peak_mb,counted_bytes_per_rank" and returns 0 when it trained.
# \param $1 comm, $2 C, $3 context, $4 steps, $5 run directory
train_run() {
  local comm=$1 ranks=$2 context=$3 n=$4 dir=$5 rc=0
  local -a set
  read -r -a set <<<"$(layout_args "$comm" "$ranks" "$context")"
  rm -rf "$dir"
  tools/mpirun.sh -n "$ranks" "$build/tessera" train "$deck" "${common[@]}" "${set[@]}" --set train.steps="$n" \
    --set "run.output_dir=\"$dir\"" >"$dir.out" 2>&1 || rc=$?
  /usr/bin/python3 - "$dir" "$rc" "$ranks" "$warmup" <<'PY'
import csv, json, re, statistics, sys
d, rc, ranks, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
out = open(f"{d}.out").read()
if rc != "0":
    if "at its peak in the first step" in out:
        m = re.search(r"held ([0-9.]+) MB at its peak", out)
        print(f"refused: measured peak after step 1,,,{m.group(1) if m else ''},")
    elif "the run needs about" in out:
        print("refused: estimate,,,,")
    else:
        m = re.search(r"tessera: error: (.*)", out)
        why = (m.group(1) if m else f"exit {rc}").replace(",", ";")[:120]
        print(f"failed: {why},,,,")
    sys.exit(0)
rows = [r for r in csv.DictReader(open(f"{d}/metrics.csv")) if r["kind"] == "train" and int(r["step"]) > warmup]
tps = statistics.median(float(r["tokens_per_s"]) for r in rows) if rows else float("nan")
s = json.load(open(f"{d}/summary.json"))
spatial = (s["comm"]["bytes_per_step_by_group"] or {}).get("spatial", 0.0) / ranks  # null: no group counted
print(f"trained,{tps:.1f},{s['memory']['act_peak_bytes'] / 1e6:.1f},{sum(v for k, v in s['memory'].items() if k not in ('peak_total_bytes', 'resident_peak_bytes')) / 1e6:.1f},"
      f"{spatial:.0f}")
PY
  [[ $rc -eq 0 ]]
}

# The (comm, C) pairs: C = 1 once, then each comm at each C of RANKS.
pairs=("- 1")
for comm in "${comms[@]}"; do
  for c in "${rank_counts[@]}"; do
    if ((c > 1)); then pairs+=("$comm $c"); fi
  done
done

# ---- 1. speed and memory ------------------------------------------------------------------------
if [[ -z "${SKIP_SPEED:-}" && -z "${TABLE_ONLY:-}" ]]; then
  echo "comm,ranks,context,rep,result,tokens_per_s,act_peak_mb,peak_mb,counted_bytes_per_rank,predicted_sent_mb" \
    >"$speed_csv"
  for pair in "${pairs[@]}"; do
    read -r comm c <<<"$pair"
    for ((context = context_min; context <= max_context; context *= 2)); do
      read -r est sent <<<"$(estimate "$comm" "$c" "$context")"
      if [[ -z ${est:-} ]]; then
        # The deck refused, or the estimate is over the limit: record one refused run and go on.
        fields=$(train_run "$comm" "$c" "$context" "$steps" "$runs/speed_${comm}_$c" || true)
        echo "$comm,$c,$context,1,$fields,$sent" >>"$speed_csv"
        echo "context_parallel: $comm C=$c T=$context: $fields" >&2
        break
      fi
      for rep in $(seq 1 "$reps"); do
        fields=$(train_run "$comm" "$c" "$context" "$steps" "$runs/speed_${comm}_$c" || true)
        echo "$comm,$c,$context,$rep,$fields,$sent" >>"$speed_csv"
        echo "context_parallel: $comm C=$c T=$context rep $rep: $fields" >&2
      done
    done
  done
fi

# ---- 2. the longest context under run.memory_limit_mb -----------------------------------------
# \brief A 2-step run at a context; appends its row to the limit CSV; 0 when it trained.
# \param $1 comm, $2 C, $3 context, $4 role
limit_run() {
  local fields rc=0 est
  fields=$(train_run "$1" "$2" "$3" 2 "$runs/limit_$1_$2") || rc=$?
  read -r est _ <<<"$(estimate "$1" "$2" "$3")"
  IFS=, read -r result _ act peak _ <<<"$fields"
  echo "$1,$2,$4,$3,${est:-},$result,$peak,$act" >>"$limit_csv"
  echo "context_parallel: limit $1 C=$2 T=$3 ($4): $result" >&2
  return "$rc"
}
if [[ -z "${SKIP_LIMIT:-}" && -z "${TABLE_ONLY:-}" ]]; then
  echo "comm,ranks,role,context,estimate_mb,result,peak_mb,act_peak_mb" >"$limit_csv"
  for pair in "${pairs[@]}"; do
    read -r comm c <<<"$pair"
    # Contexts are multiples of CONTEXT_STEP (and of 2C, the ring's head and tail chunks).
    unit=$context_step
    ((unit % (2 * c) == 0)) || die "CONTEXT_STEP=$context_step is not a multiple of 2 x $c"
    if [[ -z "$(estimate "$comm" "$c" "$unit")" ]]; then
      limit_run "$comm" "$c" "$unit" "smallest" || true
      continue
    fi
    lo=1 hi=$((262144 / unit))
    while ((hi - lo > 1)); do
      mid=$(((lo + hi) / 2))
      if [[ -n "$(estimate "$comm" "$c" $((mid * unit)))" ]]; then lo=$mid; else hi=$mid; fi
    done
    t=$((lo * unit)) tries=0 role="estimate's longest"
    until limit_run "$comm" "$c" "$t" "$role"; do
      tries=$((tries + 1)) role="one step down"
      ((tries < 4 && t > unit)) || { echo "context_parallel: $comm C=$c: nothing from $t up trained" >&2; break; }
      t=$((t - unit))
    done
    ((tries > 0)) || limit_run "$comm" "$c" $((t + unit)) "next up" || true
  done
fi

# ---- the table ------------------------------------------------------------------------------------
[[ -n "${TABLE_ONLY:-}" ]] || cut -d' ' -f1-3 /proc/loadavg >>"$sitting"
/usr/bin/python3 - "$speed_csv" "$limit_csv" "$md" "$sitting" "$limit" "$steps" "$warmup" <<'PY'
import csv, os, re, statistics, sys
speed_csv, limit_csv, md, sitting, limit, steps, warmup = sys.argv[1:]
day, cpu, load0, load1 = ((open(sitting).read().splitlines() if os.path.exists(sitting) else []) + ["?"] * 4)[:4]
cpuinfo = open("/proc/cpuinfo").read()
field = lambda k: re.search(rf"^{k}\s*:\s*(.*)$", cpuinfo, re.M).group(1)
read = lambda p: list(csv.DictReader(open(p))) if os.path.exists(p) else []
lines = [f"{day}: {cpu} (family {field('cpu family')}, model {field('model')}), {os.cpu_count()} cores shared "
         f"with other jobs, load average {load0} at the start, {load1} at the end. bench/context_llama.toml "
         f"(llama, 2 blocks, 8 heads, 2 key/value heads, width 128, one sequence per step), "
         f"run.memory_limit_mb = {limit}.", ""]
speed = read(speed_csv)
if speed:
    lines += [f"Speed and memory per rank: medians over runs of {steps} steps (tokens/s: the median of steps "
              f"{int(warmup) + 1}-{steps}); peaks are rank 0's counters; context bytes per rank and step as the "
              "communicator counts them (own all-to-all part included) and as `tessera check` predicts the "
              "part sent to other ranks.", "",
              "| comm | C | context | runs | tokens/s | act peak MB | peak MB | counted B/rank/step | "
              "predicted sent MB | result |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    keys = []
    for r in speed:
        k = (r["comm"], r["ranks"], r["context"])
        if k not in keys:
            keys.append(k)
    for k in keys:
        rs = [r for r in speed if (r["comm"], r["ranks"], r["context"]) == k]
        ok = [r for r in rs if r["result"] == "trained"]
        med = lambda f, d: f"{statistics.median(float(r[f]) for r in ok):.{d}f}" if ok else "-"
        result = "trained" if len(ok) == len(rs) else rs[-1]["result"]
        lines.append(f"| {k[0]} | {k[1]} | {k[2]} | {len(ok)} | {med('tokens_per_s', 0)} | "
                     f"{med('act_peak_mb', 1)} | {med('peak_mb', 1)} | {med('counted_bytes_per_rank', 0)} | "
                     f"{rs[0]['predicted_sent_mb'] or '-'} | {result} |")
    lines.append("")
lim = read(limit_csv)
if lim:
    lines += [f"Longest context that trains 2 steps under run.memory_limit_mb = {limit} (bisection with "
              "`tessera check`, then runs):", "",
              "| comm | C | role | context | estimate MB | result | peak MB | act peak MB |",
              "| --- | ---: | --- | ---: | ---: | --- | ---: | ---: |"]
    for r in lim:
        lines.append(f"| {r['comm']} | {r['ranks']} | {r['role']} | {r['context']} | {r['estimate_mb'] or '-'} | "
                     f"{r['result']} | {r['peak_mb'] or '-'} | {r['act_peak_mb'] or '-'} |")
    longest = {}
    for r in lim:
        if r["result"] == "trained":
            k = (r["comm"], r["ranks"])
            longest[k] = max(longest.get(k, 0), int(r["context"]))
    base = longest.get(("-", "1"))
    if base:
        lines += [""] + [f"{c} at C = {n}: longest context {t} = {t / base:.2f}x C = 1's {base}"
                         for (c, n), t in longest.items() if n != "1"]
open(md, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
