#!/usr/bin/env bash
# optimizer.offload = "disk" (docs/design.md, "Optimizer state on disk"): what it costs a step and
# how much larger a model it lets one rank train under the same run.memory_limit_mb.
#
# 1. The disk's own bandwidth on the offload path: dd of a DD_MB file with O_DIRECT (bs=64M):
#    a write into a new file, an overwrite of it (what every step after the first does to the
#    reserved state file) and a read; REPS times, the file removed afterwards.
# 2. Step time: a byte-level GPT (inputs/kjv_gpt.toml at WIDTH x LAYERS, CONTEXT, global batch
#    BATCH; AdamW, so 8 bytes of state per parameter) on each rank count of RANKS, in memory
#    (offload none), on disk with optimizer.offload_overlap = true and with it false, alternated
#    REPS times. From metrics.csv (train rows after step WARMUP): the median step time (global
#    batch / samples_per_s), the fastest step (the one least disturbed by other jobs) and the
#    median t_optimizer; from summary.json the bytes read and written per step (and, with the
#    values on disk, gather_bytes_read_per_step: what the gathers read, all ranks summed); from
#    log.txt the I/O mode (O_DIRECT or buffered). The modes are STEP_MODES: memory, overlap,
#    serial and values (state and parameter values on disk, optimizer.offload_values = true,
#    overlap, ZeRO 3). Runs on more than one rank use ZeRO stage ZERO, so each rank streams its
#    shard; the values mode is ZeRO 3 on every rank count whatever ZERO says (on 1 rank too: the
#    values on disk need it). Hidden share = 1 - exposed(overlap) / exposed(no overlap), where
#    exposed = t_optimizer(disk) - t_optimizer(memory).
# 3. The largest GPT that trains 5 steps on 1 rank under run.memory_limit_mb = LIMIT_MB for each
#    mode of LIMIT_MODES: in memory, on disk with the default buffer, on disk with a
#    SMALL_BUFFER_MB buffer and with the state and the parameter values on disk (ZeRO 3, the
#    default 64 MB buffer): model.width (a multiple of WIDTH_STEP; SEARCH_LAYERS blocks, context
#    SEARCH_CONTEXT, global batch and eval batch SEARCH_BATCH, so activations stay small) is
#    searched by bisection with `tessera check` (the estimate), then confirmed by real 5-step runs:
#    the chosen width must train (a narrower one is tried while the run is refused), and the next
#    width up must be refused (by the estimate before anything is allocated, or by the measured
#    peak after step 1). Each run's counted peak (summary.json's memory.*_peak_bytes, summed) and
#    its maximum resident set (/usr/bin/time) go in the table.
#
# Writes bench/results/offload[_LABEL]_dd.csv (what,rep,block,bytes,seconds,gbps),
# offload[_LABEL]_step.csv (ranks,mode,rep,step_s,t_optimizer_s,t_fwd_bwd_s,read_mb_per_step,
# written_mb_per_step,io_mode,fastest_step_s,gather_mb_per_step: empty but for the values mode;
# read_mb_per_step includes it), offload[_LABEL]_limit.csv (mode,buffer_mb,role,
# width,parameters,estimate_mb,result,counted_peak_mb,max_rss_mb,final_loss),
# offload[_LABEL]_sitting.txt (date, load averages at the start and the end) and
# offload[_LABEL].md (the machine, medians, ratios).
#
# Usage: bench/offload.sh     (needs build/tessera; makes its token file from README.md docs/*.md)
# env: REPS (3), STEPS (8), WARMUP (2), WIDTH (512), LAYERS (4), CONTEXT (128), BATCH (8),
#      RANKS ("1 2"), ZERO (1; not the values mode, always 3), STEP_MODES ("memory overlap serial
#      values"), LIMIT_MODES ("memory overlap small values"), LIMIT_MB (2000), WIDTH_STEP (16),
#      SEARCH_LAYERS (4), SEARCH_CONTEXT (64), SEARCH_BATCH (2), SMALL_BUFFER_MB (8), DD_MB (512),
#      OFFLOAD_PATH (empty: $TMPDIR, else /tmp, as optimizer.offload_path), BUILD_DIR (build),
#      LABEL (names the files offload_LABEL*),
#      SKIP_DD=1, SKIP_STEP=1, SKIP_LIMIT=1 (leave a part out; the table keeps its old CSV),
#      TABLE_ONLY=1 (rewrite the .md from the CSVs)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$here/lib.sh"
top=$(cd "$here/.." && pwd)
cd "$top"

gpt_step_settings
read -r -a rank_counts <<<"${RANKS:-1 2}"
zero=${ZERO:-1}
read -r -a step_modes <<<"${STEP_MODES:-memory overlap serial values}"
read -r -a limit_modes <<<"${LIMIT_MODES:-memory overlap small values}"
limit=${LIMIT_MB:-2000}
width_step=${WIDTH_STEP:-16}
search_layers=${SEARCH_LAYERS:-4}
search_context=${SEARCH_CONTEXT:-64}
search_batch=${SEARCH_BATCH:-2}
small_buffer=${SMALL_BUFFER_MB:-8}
dd_mb=${DD_MB:-512}
build=${BUILD_DIR:-build}
offload_dir=${OFFLOAD_PATH:-${TMPDIR:-/tmp}}
results=bench/results
runs=$results/tmp/offload
data=$runs/docs.h5
name=offload${LABEL:+_$LABEL}
dd_csv=$results/${name}_dd.csv
step_csv=$results/${name}_step.csv
limit_csv=$results/${name}_limit.csv
sitting=$results/${name}_sitting.txt
md=$results/$name.md

[[ "$width_step" =~ ^[1-9][0-9]*$ && $((width_step % 4)) -eq 0 ]] || die "WIDTH_STEP='$width_step': a multiple of the deck's 4 heads"
[[ -x "$build/tessera" ]] || die "$build/tessera not found" "tools/setup.sh $build"
[[ -d "$offload_dir" && -w "$offload_dir" ]] || die "offload path '$offload_dir' is not a writable directory" \
  "set OFFLOAD_PATH (or TMPDIR) to node-local scratch"
mkdir -p "$runs"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[[ -f "$data" ]] || "$build/tessera" prepare text --out "$data" README.md docs/*.md >/dev/null
# The sitting: its date and the load averages at its start (and, below, at its end).
[[ -n "${TABLE_ONLY:-}" ]] || { date -u +%F; cut -d' ' -f1-3 /proc/loadavg; } >"$sitting"

# The deck's settings every run shares: no evaluation or checkpoint, a metrics row per step.
common=(--set "data.path=\"$data\"" --set train.log_every=1 --set eval.every_steps=0 --set eval.at_end=false
        --set checkpoint.at_end=false --set checkpoint.every_steps=0 --set run.overwrite=true
        --set "optimizer.offload_path=\"$offload_dir\"")

# \brief The --set arguments of an offload mode: memory, overlap (disk, I/O thread reading ahead
# and writing behind), serial (disk, one tile at a time), small (disk, overlap, SMALL_BUFFER_MB),
# values (state and parameter values on disk, overlap, the default buffer; ZeRO 3, which they need;
# each bucket gathered on use, as the tables were made: bench/zero_prefetch.sh measures gathering
# ahead, which holds one bucket more).
mode_args() {
  case "$1" in
    memory) echo "--set optimizer.offload=\"none\"" ;;
    overlap) echo "--set optimizer.offload=\"disk\" --set optimizer.offload_overlap=true" ;;
    serial) echo "--set optimizer.offload=\"disk\" --set optimizer.offload_overlap=false" ;;
    small) echo "--set optimizer.offload=\"disk\" --set optimizer.offload_overlap=true --set optimizer.offload_buffer_mb=$small_buffer" ;;
    values) echo "--set optimizer.offload=\"disk\" --set optimizer.offload_overlap=true --set optimizer.offload_values=true --set parallel.zero=3 --set parallel.zero_prefetch=false" ;;
    *) die "unknown mode '$1'" ;;
  esac
}
for mode in "${step_modes[@]}" "${limit_modes[@]}"; do mode_args "$mode" >/dev/null; done

# ---- 1. dd on the offload path -------------------------------------------------------------
# \brief Print "bytes,seconds" from dd's last line of output.
dd_figures() {
  tail -n 1 | sed -E 's/^([0-9]+) bytes .* copied, ([0-9.e+-]+) s,.*/\1,\2/'
}
if [[ -z "${SKIP_DD:-}" && -z "${TABLE_ONLY:-}" ]]; then
  echo "what,rep,block,bytes,seconds,gbps" >"$dd_csv"
  ddfile=$(mktemp "$offload_dir/tessera-offload-dd.XXXXXX")
  trap 'rm -f "$ddfile"' EXIT
  count=$((dd_mb / 64))
  ((count > 0)) || die "DD_MB='$dd_mb': at least 64"
  for rep in $(seq 1 "$reps"); do
    rm -f "$ddfile"
    for what in write overwrite read; do
      case $what in
        write) out=$(dd if=/dev/zero of="$ddfile" bs=64M count="$count" oflag=direct 2>&1 | dd_figures) ;;
        overwrite) out=$(dd if=/dev/zero of="$ddfile" bs=64M count="$count" oflag=direct conv=notrunc 2>&1 | dd_figures) ;;
        read) out=$(dd if="$ddfile" of=/dev/null bs=64M iflag=direct 2>&1 | dd_figures) ;;
      esac
      awk -F, -v w="$what" -v r="$rep" '{ printf "%s,%s,64M,%s,%s,%.4f\n", w, r, $1, $2, $1 / $2 / 1e9 }' <<<"$out" >>"$dd_csv"
    done
  done
  rm -f "$ddfile"
  echo "offload: dd done" >&2
fi

# ---- 2. step time: memory against disk ---------------------------------------------------------
# \brief One training run of the step-time GPT; appends its row to the step CSV.
# \param $1 ranks, $2 mode, $3 rep
step_run() {
  local ranks=$1 mode=$2 rep=$3 dir=$runs/step_np$1_$2
  local -a mode_set zero_set=()
  read -r -a mode_set <<<"$(mode_args "$mode")"
  # The values mode sets ZeRO 3 itself (mode_args), on any rank count.
  if ((ranks > 1)) && [[ "$mode" != values ]]; then zero_set=(--set "parallel.zero=$zero"); fi
  rm -rf "$dir"
  tools/mpirun.sh -n "$ranks" "$build/tessera" train inputs/kjv_gpt.toml "${common[@]}" \
    --set model.width="$width" --set model.layers="$layers" --set model.context="$context" \
    --set train.global_batch="$batch" --set eval.batch="$batch" --set train.steps="$steps" \
    "${mode_set[@]}" "${zero_set[@]}" --set "run.output_dir=\"$dir\"" >"$dir.out" 2>&1 ||
    { echo "error: run np$ranks $mode $rep failed; see $dir.out" >&2; tail -n 5 "$dir.out" >&2; exit 1; }
  /usr/bin/python3 - "$dir" "$warmup" "$ranks" "$mode" "$rep" "$batch" >>"$step_csv" <<'PY'
import csv, json, re, statistics, sys
d, warmup, ranks, mode, rep, batch = sys.argv[1], int(sys.argv[2]), *sys.argv[3:5], sys.argv[5], int(sys.argv[6])
rows = [r for r in csv.DictReader(open(f"{d}/metrics.csv")) if r["kind"] == "train" and int(r["step"]) > warmup]
med = lambda f: statistics.median(f(r) for r in rows)
step = med(lambda r: batch / float(r["samples_per_s"]))
opt = med(lambda r: float(r["t_optimizer"]))
fb = med(lambda r: float(r["t_forward"]) + float(r["t_backward"]))
s = json.load(open(f"{d}/summary.json"))
off = s.get("optimizer_offload") or {"bytes_read": 0.0, "bytes_written": 0.0}
m = re.search(r"optimizer state \(rank 0\): .*\((O_DIRECT|buffered I/O[^)]*)\)", open(f"{d}/log.txt").read())
io = m.group(1) if m else "memory"
fastest = min(batch / float(r["samples_per_s"]) for r in rows)
gather = off.get("gather_bytes_read_per_step") if off.get("values_on_disk") else None
print(f"{ranks},{mode},{rep},{step:.4f},{opt:.4f},{fb:.4f},{off['bytes_read'] / s['steps'] / 1e6:.2f},"
      f"{off['bytes_written'] / s['steps'] / 1e6:.2f},{io},{fastest:.4f},"
      f"{'' if gather is None else f'{gather / 1e6:.2f}'}")
PY
  echo "offload: step np$ranks $mode rep $rep done" >&2
}
if [[ -z "${SKIP_STEP:-}" && -z "${TABLE_ONLY:-}" ]]; then
  echo "ranks,mode,rep,step_s,t_optimizer_s,t_fwd_bwd_s,read_mb_per_step,written_mb_per_step,io_mode,fastest_step_s,gather_mb_per_step" >"$step_csv"
  for rep in $(seq 1 "$reps"); do
    for ranks in "${rank_counts[@]}"; do
      for mode in "${step_modes[@]}"; do step_run "$ranks" "$mode" "$rep"; done
    done
  done
fi

# ---- 3. the largest GPT under run.memory_limit_mb --------------------------------------------
search=(--set model.layers="$search_layers" --set model.context="$search_context"
        --set train.global_batch="$search_batch" --set eval.batch="$search_batch"
        --set run.memory_limit_mb="$limit")

# \brief `tessera check` at a width: prints "PARAMETERS ESTIMATE_MB" when the estimate fits the
# limit, nothing when it is refused.
# \param $1 mode, $2 width
estimate() {
  local -a mode_set
  read -r -a mode_set <<<"$(mode_args "$1")"
  local out
  out=$("$build/tessera" check inputs/kjv_gpt.toml "${common[@]}" "${search[@]}" "${mode_set[@]}" \
          --set model.width="$2" 2>&1) || return 0
  sed -nE 's/^model: .*, ([0-9]+) parameters in .*/\1/p' <<<"$out" | tr '\n' ' '
  sed -nE 's/^memory per rank \(estimate.*, total ([0-9.]+) MB$/\1/p' <<<"$out"
}

# \brief The number of parameters of the search GPT at a width (the estimate of the run without
# a limit).
parameters_at() {
  "$build/tessera" check inputs/kjv_gpt.toml "${common[@]}" "${search[@]}" --set run.memory_limit_mb=0 \
    --set model.width="$1" 2>&1 | sed -nE 's/^model: .*, ([0-9]+) parameters in .*/\1/p'
}

# \brief A 5-step run at a width; appends its row (role: estimate's largest, one step down, next
# up) to the limit CSV and
# returns 0 when it trained, 1 when it was refused.
# \param $1 mode, $2 width, $3 role
limit_run() {
  local mode=$1 w=$2 role=$3 dir=$runs/limit_$1_$2 rc=0
  local -a mode_set
  read -r -a mode_set <<<"$(mode_args "$mode")"
  rm -rf "$dir"
  /usr/bin/time -o "$dir.time" -f "%M" tools/mpirun.sh -n 1 "$build/tessera" train inputs/kjv_gpt.toml \
    "${common[@]}" "${search[@]}" "${mode_set[@]}" --set model.width="$w" --set train.steps=5 \
    --set "run.output_dir=\"$dir\"" >"$dir.out" 2>&1 || rc=$?
  /usr/bin/python3 - "$dir" "$mode" "$w" "$role" "$rc" "$(parameters_at "$w")" \
    "$(estimate "$mode" "$w" | cut -d' ' -f2)" "${small_buffer}" >>"$limit_csv" <<'PY'
import json, os, re, sys
d, mode, w, role, rc, params, est, small = sys.argv[1:9]
out = open(f"{d}.out").read()
try:
    rss = f"{int(open(f'{d}.time').read().split()[-1]) * 1024 / 1e6:.1f}"  # KiB -> MB
except (OSError, ValueError, IndexError):
    rss = ""
peak = loss = ""
if rc == "0":
    s = json.load(open(f"{d}/summary.json"))
    peak = f"{sum(v for k, v in s['memory'].items() if k not in ('peak_total_bytes', 'resident_peak_bytes')) / 1e6:.1f}"
    loss = f"{s['final_train_loss']:.4f}"
    result = "trained"
elif "at its peak in the first step" in out:
    m = re.search(r"held ([0-9.]+) MB at its peak", out)
    peak = m.group(1) if m else ""
    result = "refused: measured peak after step 1"
elif "the run needs about" in out:
    result = "refused: estimate"
else:
    result = f"failed (exit {rc})"
buffer = {"memory": "", "overlap": "64", "serial": "64", "small": small, "values": "64"}[mode]
print(f"{mode},{buffer},{role},{w},{params},{est},{result},{peak},{rss},{loss}")
PY
  echo "offload: limit $mode width $w ($role): exit $rc" >&2
  [[ $rc -eq 0 ]]
}

if [[ -z "${SKIP_LIMIT:-}" && -z "${TABLE_ONLY:-}" ]]; then
  echo "mode,buffer_mb,role,width,parameters,estimate_mb,result,counted_peak_mb,max_rss_mb,final_loss" >"$limit_csv"
  for mode in "${limit_modes[@]}"; do
    # Bisection over multiples of WIDTH_STEP: lo fits (or is the smallest step), hi does not.
    lo=1 hi=$((16384 / width_step))
    while ((hi - lo > 1)); do
      mid=$(((lo + hi) / 2))
      if [[ -n "$(estimate "$mode" $((mid * width_step)))" ]]; then lo=$mid; else hi=$mid; fi
    done
    w=$((lo * width_step))
    echo "offload: $mode: the estimate's largest width under $limit MB is $w" >&2
    # Confirm: step down while the real run is refused (the measured peak may exceed the estimate).
    tries=0 role="estimate's largest"
    until limit_run "$mode" "$w" "$role"; do
      tries=$((tries + 1)) role="one step down"
      ((tries < 4 && w > width_step)) || die "$mode: no width from $((w + tries * width_step)) down trained under $limit MB"
      w=$((w - width_step))
    done
    # The next width up: already refused above where the loop stepped down.
    ((tries > 0)) || limit_run "$mode" $((w + width_step)) "next up" || true
  done
fi

# ---- the table ---------------------------------------------------------------------------------
[[ -n "${TABLE_ONLY:-}" ]] || cut -d' ' -f1-3 /proc/loadavg >>"$sitting"
/usr/bin/python3 - "$dd_csv" "$step_csv" "$limit_csv" "$md" "$sitting" \
  "$offload_dir" "$(df -T "$offload_dir" | awk 'NR == 2 { print $2 " on " $1 }')" \
  "$width" "$layers" "$context" "$batch" "$steps" "$warmup" "$zero" "$limit" "$search_layers" "$search_context" \
  "$search_batch" "$small_buffer" <<'PY'
import csv, os, re, statistics, sys
(dd_csv, step_csv, limit_csv, md, sitting, path, fs, width, layers, context, batch, steps, warmup, zero,
 limit, s_layers, s_context, s_batch, small) = sys.argv[1:]
day, load0, load1 = ((open(sitting).read().splitlines() if os.path.exists(sitting) else []) + ["?"] * 3)[:3]
read = lambda p: list(csv.DictReader(open(p))) if os.path.exists(p) else []
cpuinfo = open("/proc/cpuinfo").read()
field = lambda k: re.search(rf"^{k}\s*:\s*(.*)$", cpuinfo, re.M).group(1)
flags = set(field("flags").split())
isa = ", ".join(f for f in ("avx512f", "avx512_bf16", "amx_tile", "amx_bf16") if f in flags) or "no AVX-512"
isa += "" if "amx_tile" in flags else "; no AMX"
lines = [f"{day}: {field('model name')} (family {field('cpu family')}, model {field('model')}; "
         f"{isa}), {os.cpu_count()} cores shared with other jobs, load average {load0} at the start, "
         f"{load1} at the end. Offload path {path} ({fs}).", ""]
med = lambda xs: statistics.median(xs)
num = lambda x, digits: "-" if x != x else f"{x:.{digits}f}"  # NaN: a column an older CSV lacks

dd = read(dd_csv)
bw = {}
if dd:
    lines += ["dd on the offload path, O_DIRECT, bs=64M, GB/s (median, range over runs):", "",
              "| what | GB/s | range |", "| --- | ---: | --- |"]
    for what, label in (("write", "write into a new file"), ("overwrite", "overwrite (conv=notrunc)"),
                        ("read", "read (iflag=direct)")):
        xs = [float(r["gbps"]) for r in dd if r["what"] == what]
        bw[what] = med(xs)
        lines.append(f"| {label} | {bw[what]:.2f} | {min(xs):.2f}-{max(xs):.2f} |")
    lines.append("")

step = read(step_csv)
if step:
    n = len({r["rep"] for r in step})
    lines += [f"Step time, GPT {layers} blocks x width {width}, context {context}, global batch {batch}, AdamW; "
              f"medians over {n} runs of the per-step medians (fastest step: of each run's fastest step) of steps "
              f"{int(warmup) + 1}-{steps}; "
              f"more than one rank: ZeRO {zero}, but the values rows are ZeRO 3 on every rank count (1 rank too). "
              "`read + written MB per step` = summary.json's bytes over the steps, all ranks summed (the values "
              "rows' read includes the gathers'); `gather MB per step` = gather_bytes_read_per_step, what the "
              "gathers (forward and backward) read of the values, all ranks summed. `I/O at dd speed` = the "
              "update's read MB (without the gathers') / dd read + written MB / dd overwrite, the time the disk "
              "itself needs for the update's bytes; `of t_optimizer` = that over t_optimizer, the share of the "
              "optimizer phase the disk's own speed explains; `gathers at dd speed` = gather MB / dd read; "
              "`memory step + extra t_optimizer` = (step in memory + t_optimizer - t_optimizer in memory) / step "
              "in memory, the ratio with the other phases' noise taken out.", "",
              "| ranks | state | step s | fastest step s | t_optimizer s | fwd+bwd s | step / memory | fastest / memory "
              "| memory step + extra t_optimizer | t_optimizer / memory | read + written MB per step | I/O at dd speed s "
              "| of t_optimizer | gather MB per step | gathers at dd speed s | I/O |",
              "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
              "| --- |"]
    names = {"memory": "memory", "overlap": "disk, overlap", "serial": "disk, no overlap",
             "small": f"disk, overlap, {small} MB buffer", "values": "disk + values, overlap (ZeRO 3)"}
    order = [k for k in names if any(r["mode"] == k for r in step)]
    hidden = []
    for ranks in sorted({r["ranks"] for r in step}, key=int):
        def m(mode, k):
            xs = [float(r.get(k) or "nan") for r in step if r["ranks"] == ranks and r["mode"] == mode]
            return med(xs) if xs else float("nan")
        base_step, base_opt = m("memory", "step_s"), m("memory", "t_optimizer_s")
        base_fast = m("memory", "fastest_step_s")
        for mode in order:
            if not any(r["ranks"] == ranks and r["mode"] == mode for r in step):
                continue
            rd, wr, g = m(mode, "read_mb_per_step"), m(mode, "written_mb_per_step"), m(mode, "gather_mb_per_step")
            upd = rd - (g if g == g else 0.0)
            io = next(r["io_mode"] for r in step if r["ranks"] == ranks and r["mode"] == mode)
            ideal = upd / 1e3 / bw["read"] + wr / 1e3 / bw["overwrite"] if bw and rd > 0 else 0.0
            frac = f"{ideal / m(mode, 't_optimizer_s'):.0%}" if ideal > 0 else "-"
            g_ideal = num(g / 1e3 / bw["read"], 3) if bw and g == g else "-"
            lines.append(f"| {ranks} | {names[mode]} | {m(mode, 'step_s'):.3f} | {num(m(mode, 'fastest_step_s'), 3)} | "
                         f"{m(mode, 't_optimizer_s'):.3f} | {m(mode, 't_fwd_bwd_s'):.3f} | "
                         f"{num(m(mode, 'step_s') / base_step, 2)} | {num(m(mode, 'fastest_step_s') / base_fast, 2)} | "
                         f"{num((base_step + m(mode, 't_optimizer_s') - base_opt) / base_step, 2)} | "
                         f"{num(m(mode, 't_optimizer_s') / base_opt, 1)} | {rd:.1f} + {wr:.1f} | "
                         f"{ideal:.3f} | {frac} | {num(g, 1)} | {g_ideal} | {io} |")
        e_on, e_off = m("overlap", "t_optimizer_s") - base_opt, m("serial", "t_optimizer_s") - base_opt
        if e_on == e_on and e_off == e_off:
            hidden.append(f"{ranks} rank(s): exposed I/O {e_off:.3f} s without overlap, {e_on:.3f} s with it: "
                          f"hidden share {1 - e_on / e_off:.0%}")
    if hidden:
        lines += ["", "Overlap (exposed = t_optimizer on disk - t_optimizer in memory): " + "; ".join(hidden) + "."]
    lines.append("")

lim = read(limit_csv)
if lim:
    states = {"memory": "memory", "overlap": "disk", "serial": "disk, no overlap", "small": "disk",
              "values": "disk + values (ZeRO 3)"}
    lines += [f"Largest GPT that trains 5 steps on 1 rank under run.memory_limit_mb = {limit} ({s_layers} blocks, "
              f"context {s_context}, global batch and eval batch {s_batch}, AdamW; model.width in steps searched "
              "with `tessera check`, then run; `disk + values`: the state and the parameter values on disk, "
              "ZeRO 3):", "",
              "| state | buffer MB | role | width | parameters | estimate MB | result | counted peak MB | max RSS MB |",
              "| --- | ---: | --- | ---: | ---: | ---: | --- | ---: | ---: |"]
    for r in lim:
        lines.append(f"| {states.get(r['mode'], r['mode'])} | {r['buffer_mb'] or '-'} | "
                     f"{r['role']} | {r['width']} | {int(r['parameters']):,} | {r['estimate_mb'] or '>' + limit} | "
                     f"{r['result']} | {r['counted_peak_mb'] or '-'} | {r['max_rss_mb'] or '-'} |")
    largest = {r["mode"]: int(r["parameters"]) for r in lim if r["result"] == "trained"}
    what = {"overlap": "on disk (buffer 64 MB)", "small": f"on disk (buffer {small} MB)",
            "values": "with state and values on disk (buffer 64 MB, ZeRO 3)"}
    if "memory" in largest:
        lines += [""] + [f"Parameters trained {what[k]} / in memory: {largest[k]:,} / {largest['memory']:,} = "
                         f"{largest[k] / largest['memory']:.2f}x" for k in what if k in largest]
    cell = lambda k: f"{largest[k] / 1e6:.1f}M" if k in largest else "-"
    ratio = lambda k: f"{largest[k] / largest['memory']:.2f}x" if k in largest and "memory" in largest else "-"
    lines += ["", "| blocks | in memory | state on disk, 64 MB buffer | ratio | state on disk, "
              f"{small} MB buffer | ratio | state + values on disk | ratio |",
              "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
              f"| {s_layers} | {cell('memory')} | {cell('overlap')} | {ratio('overlap')} | {cell('small')} | "
              f"{ratio('small')} | {cell('values')} | {ratio('values')} |"]
open(md, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
