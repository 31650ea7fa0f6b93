#!/usr/bin/env bash
# Context parallelism across nodes, on the namespace cluster of tests/cluster/ (docs/slurm.md):
# the small llama of bench/context_llama.toml at parallel.spatial = 4 on 4 nodes of 1 rank each
# (every message of the context group crosses a link), links shaped to RATE, against 1 rank alone:
# the first STEPS losses and the largest relative difference from the 1-rank run; the bytes the
# nodes received over their links per step, and the same for a control run of the same model at
# parallel.data = 4 on the 4 nodes (the same gradient allreduce, no context group), whose
# difference is the context group's traffic on the wire, beside the formula's (`tessera check`:
# src/train/context_traffic.hpp, 4 x what a rank sends to the others) and the communicator's count.
# The wire adds TCP/IP headers and acknowledgements (a few percent) and each run's start-up
# (spread over the steps).
# The overlap (issue 34), for the context run: the seconds per step its link needs for what one
# rank sends per step (the formula's bytes x 8 / RATE in bit/s: each node sends through its own
# link shaped to RATE), the seconds rank 0 blocked per step on the context transfers in flight
# (summary.json's context.wait_s_per_step: the ring only; the all-to-all is a blocking collective
# and has no such count), the median step of rank 0 after the first (global batch / metrics.csv's
# samples_per_s, logged every step) and the fraction hidden, 1 - wait / link seconds clipped to
# 0..1 (0 for the all-to-all, which overlaps nothing). The wait depends on the compute speed (the
# slower the products, the more of the transfer they hide) and holds the time rank 0 waits for a
# neighbour that is behind, which no overlap hides (ranks time-sliced on shared cores): RATE=off
# gives that part alone.
# Usage (as root, from the repository root, after a build): bench/cluster_context.sh
# env: COMM (all_to_all or ring), CONTEXT (2048), BATCH (4: sequences per step),
#      STEPS (10), RATE (1gbit; "off" leaves the links unshaped), BUILD_DIR (build), LABEL
# Writes bench/results/cluster_context[_LABEL].{csv,md}; the runs stay in bench/results/tmp/cluster_context.
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$top"
# shellcheck source-path=SCRIPTDIR source=lib.sh
source bench/lib.sh
comm=${COMM:-all_to_all}
context=${CONTEXT:-2048}
batch=${BATCH:-4}
steps=${STEPS:-10}
rate=${RATE:-1gbit}
build=${BUILD_DIR:-build}
[[ $comm == all_to_all || $comm == ring ]] || die "COMM='$comm': expected all_to_all or ring"
[[ $batch =~ ^[1-9][0-9]*$ && $((batch % 4)) -eq 0 ]] || die "BATCH='$batch': a multiple of 4 (the control's data ranks)"
# RATE in bit/s (tc's units are decimal: 1gbit = 1e9 bit/s); empty when the links are unshaped.
rate_bps=
if [[ $rate =~ ^([0-9]+)(k|m|g)?bit$ ]]; then
  case ${BASH_REMATCH[2]} in
    k) rate_bps=$((BASH_REMATCH[1] * 1000)) ;;
    m) rate_bps=$((BASH_REMATCH[1] * 1000000)) ;;
    g) rate_bps=$((BASH_REMATCH[1] * 1000000000)) ;;
    *) rate_bps=${BASH_REMATCH[1]} ;;
  esac
elif [[ $rate != off ]]; then
  die "RATE='$rate': e.g. 1gbit, 500mbit, or off"
fi
tessera=$(realpath "$build/tessera")
results=bench/results
work=$results/tmp/cluster_context
result_name=cluster_context${LABEL:+_$LABEL}
[[ "${LABEL:-x}" =~ ^[A-Za-z0-9_.-]+$ ]] || die "LABEL='$LABEL': letters, digits, '.', '_' and '-' only"
rm -rf "$work" && mkdir -p "$work"
data=$work/docs.h5
"$tessera" prepare text --out "$data" README.md docs/*.md >/dev/null
export TESSERA_CLUSTER=ctx TESSERA_CLUSTER_SUBNET=10.77.33
cluster=tests/cluster/cluster.sh
trap '"$cluster" down >/dev/null 2>&1 || true' EXIT
"$cluster" up 4 >/dev/null
[[ $rate == off ]] || "$cluster" shape "$rate" >/dev/null
eval "$("$cluster" env)"

deck=(bench/context_llama.toml --set "data.path=\"$data\"" --set model.context="$context"
      --set train.global_batch="$batch" --set train.steps="$steps" --set run.blas_threads=1)
# \brief Train the deck into $work/$1 with the --set arguments of the array `extra` under the
# launcher that follows; print the bytes the nodes received per step meanwhile.
train() {
  local name=$1 before after
  shift
  before=$(cluster_received_bytes)
  "$@" "$tessera" train "${deck[@]}" "${extra[@]}" --set run.output_dir="\"$work/$name\"" >"$work/$name.out" 2>&1 ||
    die "$name: exit $? (see $work/$name.out)"
  after=$(cluster_received_bytes)
  echo $(((after - before) / steps))
}
nodes=(mpirun -n 4 --host "$TESSERA_CLUSTER-n1:1,$TESSERA_CLUSTER-n2:1,$TESSERA_CLUSTER-n3:1,$TESSERA_CLUSTER-n4:1"
       --bind-to none)
context4=(--set parallel.spatial=4 --set "parallel.context_comm=\"$comm\"")
sent=$("$tessera" check "${deck[@]}" "${context4[@]}" --ranks 4 |
  sed -nE 's/.* sends ([0-9.]+) MB per step to the other ranks.*/\1/p')
[[ -n $sent ]] || die "tessera check printed no context traffic for ${context4[*]}"
extra=()
one=$(train one_rank env)
extra=("${context4[@]}")
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
c4=$(train context4_4nodes env OMPI_MCA_mpi_yield_when_idle=1 "${nodes[@]}")
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
extra=(--set parallel.data=4)
d4=$(train data4_4nodes env OMPI_MCA_mpi_yield_when_idle=1 "${nodes[@]}")

"$PEER_PYTHON" - "$work" "$steps" "$sent" "$one" "$c4" "$d4" "$batch" "$rate_bps" \
  >"$results/$result_name.csv" <<'PY'
import csv, json, statistics, sys
work, steps, sent = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]) * 1e6
link = dict(zip(["one_rank", "context4_4nodes", "data4_4nodes"], map(int, sys.argv[4:7])))
batch, rate_bps = int(sys.argv[7]), float(sys.argv[8]) if sys.argv[8] else None
def rows(name):
    return [r for r in csv.DictReader(open(f"{work}/{name}/metrics.csv")) if r["kind"] == "train"]
def losses(name):
    return [float(r["loss"]) for r in rows(name)]
def step_s(name):  # rank 0's median step after the first (metrics.csv logs every step)
    return statistics.median(batch / float(r["samples_per_s"]) for r in rows(name)[1:])
ref = losses("one_rank")
print("layout,ranks,nodes,steps,max_rel_diff_vs_1rank,link_bytes_per_step,context_on_wire_per_step,"
      "formula_sent_per_step,counted_spatial_per_step,tokens_per_s,"
      "step_s,formula_sent_per_rank_per_step,counted_context_sent_per_step,link_s_per_step,"
      "wait_s_per_step,hidden_fraction")
for name, ranks, nodes in [("one_rank", 1, 1), ("context4_4nodes", 4, 4), ("data4_4nodes", 4, 4)]:
    s = json.load(open(f"{work}/{name}/summary.json"))
    diff = ""
    if name != "data4_4nodes":  # the control trains another batch split: its losses are its own
        got = losses(name)
        assert len(got) == len(ref) == steps, (name, len(got))
        diff = f"{max(abs(a - b) / abs(b) for a, b in zip(got, ref)):.2e}"
    ctx = name == "context4_4nodes"
    # The overlap, for the context run: its context object is rank 0's (the ring only).
    counted = wait = link_s = hidden = ""
    if ctx:
        c = s.get("context")
        if c is not None:
            counted, wait = f"{c['bytes_per_step']:.0f}", f"{c['wait_s_per_step']:.4f}"
        if rate_bps:
            link_s = sent * 8 / rate_bps
            hidden = (f"{min(1.0, max(0.0, 1 - c['wait_s_per_step'] / link_s)):.3f}" if c is not None
                      else "0")  # the all-to-all blocks: nothing overlaps
            link_s = f"{link_s:.4f}"
    print(f"{name},{ranks},{nodes},{steps},{diff},{link[name]},"
          f"{link[name] - link['data4_4nodes'] if ctx else ''},{f'{4 * sent:.0f}' if ctx else ''},"
          f"{(s['comm']['bytes_per_step_by_group'] or {}).get('spatial', 0):.0f},{s.get('tokens_per_s', 0):.0f},"
          f"{step_s(name):.3f},{f'{sent:.0f}' if ctx else ''},{counted},{link_s},{wait},{hidden}")
PY
{
  echo "# Context parallelism ($comm), parallel.spatial = 4 on the namespace cluster ($(date -u +%F)," \
    "$(grep -m 1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores shared by every node;" \
    "load average $load_before before the context run, $load_after after)"
  echo
  echo "bench/context_llama.toml at context $context, $batch sequences per step, $steps steps," \
    "run.blas_threads = 1; links: $rate. The context traffic on the wire is the context run's link bytes" \
    "less the data = 4 control's (the same gradient allreduce); the formula is 4 x what \`tessera check\`" \
    "says a rank sends to the others; the count is the communicator's (summary.json, own parts included)."
  echo "Speeds are those of 4 nodes sharing $(nproc) cores and shaped links: behaviour, not performance."
  echo
  echo "| layout | ranks | nodes | largest relative loss difference from 1 rank | link bytes / step |" \
    "context on the wire / step | formula / step | counted (spatial) / step | tokens/s |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
  awk -F, 'NR > 1 { printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $5, $6, $7, $8, $9, $10 }' \
    "$results/$result_name.csv"
  echo
  echo "The overlap of the context run ($comm): the link seconds are what one rank sends per step" \
    "(\`tessera check\`'s formula) x 8 / $rate; the wait is rank 0's seconds per step blocked on the" \
    "context transfers in flight (summary.json's context.wait_s_per_step, the ring only; the all-to-all" \
    "is a blocking collective: it overlaps nothing, hidden 0); hidden = 1 - wait / link seconds, clipped" \
    "to 0..1. The step is rank 0's median after the first. The wait depends on the compute speed" \
    "(slow products give the transfers more time to hide in) and holds the time rank 0 waits for a" \
    "neighbour that is behind (4 ranks time-sliced on $(nproc) shared cores), which no overlap hides;" \
    "a run with RATE=off gives that part alone."
  echo
  echo "| layout | step s | sent per rank / step | counted (context, rank 0) / step | link s / step |" \
    "waited s / step | hidden |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
  awk -F, '$1 == "context4_4nodes" { printf "| %s | %s | %s | %s | %s | %s | %s |\n", $1, $11, $12, $13, $14, $15, $16 }' \
    "$results/$result_name.csv"
} >"$results/$result_name.md"
cat "$results/$result_name.md"
