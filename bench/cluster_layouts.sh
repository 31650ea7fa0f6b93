#!/usr/bin/env bash
# Step time and bytes crossing nodes per step of the exchange options, on the namespace cluster of
# tests/cluster/ (docs/slurm.md) with links shaped to RATE (tc tbf on both ends of every link):
# 2 nodes x 2 ranks and 4 nodes x 2 ranks, the MLP and the GPT decks, for
#   zero0         flat data parallelism (allreduce per bucket)
#   zero3         ZeRO-3 over all ranks
#   hybrid3       ZeRO-3 within each node, replicated across nodes (parallel.zero_group = node)
#   hybrid1       ZeRO-1 within each node
#   bf16          zero0 with comm.reduce_dtype = bf16
#   hier          zero0 with comm.allreduce = hierarchical
#   overlap       zero0 with comm.overlap = true and no clipping (priority's baseline)
#   priority      zero0 with comm.priority = true (pieces, first layers first, updates deferred
#                 into the next forward) and no clipping (comm.priority refuses it): the GPT deck
#                 clips at 1.0, so compare priority with overlap there, not zero0
# (a configuration this build refuses, exit 2, is reported as such and skipped).
# Bytes crossing nodes are read from the links themselves: the sum over the nodes of what the host
# end of each node's link sent to it (/sys/class/net/NODE/statistics/tx_bytes) during the run,
# divided by the steps (start-up traffic included: a few KB). Beside each: what `tessera plan`
# predicts for the layout (bytes per node link, and the step between "exchange hidden" and "not
# hidden") from that run's own compute phases.
# Every node shares this machine's 2 cores: these are behaviour figures (bytes, what a slow link
# does to a step), not a real cluster's speed.
# Usage (as root, from the repository root, after a build):
#   bench/cluster_layouts.sh        env: RATE (1gbit), STEPS (12), CONFIGS, NODES ("2 4"),
#                                        DECKS ("mlp gpt"), BUILD_DIR (build), NAME (cluster_layouts),
#                                        BASE (zero0: the configuration the ratios divide by)
# Writes bench/results/NAME.{csv,md}.
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$top"
rate=${RATE:-1gbit}
steps=${STEPS:-12}
configs=${CONFIGS:-zero0 zero3 hybrid3 hybrid1 bf16 hier priority}
node_counts=${NODES:-2 4}
decks=${DECKS:-mlp gpt}
build=${BUILD_DIR:-build}
tessera=$(realpath "$build/tessera")
results=bench/results
mkdir -p "$results"
export TESSERA_CLUSTER=lay TESSERA_CLUSTER_SUBNET=10.77.31
cluster=tests/cluster/cluster.sh
trap '"$cluster" down >/dev/null 2>&1 || true' EXIT
"$cluster" up 4 >/dev/null
eval "$("$cluster" env)"
"$cluster" shape "$rate" >/dev/null
work=$results/tmp/${NAME:-cluster_layouts}  # the runs stay for inspection (ignored by git)
rm -rf "$work" && mkdir -p "$work"
gbps=$(awk -v r="$rate" 'BEGIN { v = r + 0; if (r ~ /gbit$/) print v; else if (r ~ /mbit$/) print v / 1000; else print v / 1e9 }')

fmnist=$work/fashion-mnist.h5
kjv=$work/corpus.h5
"$tessera" prepare fashion-mnist --out "$fmnist" >/dev/null
DATA_DIR=$work TESSERA=$tessera tools/prepare_corpus.sh >/dev/null

deck_args() {
  case $1 in
    mlp) echo "inputs/fashion_mnist_mlp.toml --set data.path=$fmnist --set train.global_batch=256" ;;
    gpt) echo "inputs/kjv_gpt.toml --set data.path=$kjv --set train.global_batch=16 --set model.layers=4 --set model.width=256 --set model.heads=4 --set model.context=128" ;;
  esac
}
config_args() {
  case $1 in
    zero0) echo "" ;;
    zero3) echo "--set parallel.zero=3" ;;
    hybrid3) echo "--set parallel.zero=3 --set parallel.zero_group=node" ;;
    hybrid1) echo "--set parallel.zero=1 --set parallel.zero_group=node" ;;
    bf16) echo "--set comm.reduce_dtype=bf16" ;;
    hier) echo "--set comm.allreduce=hierarchical" ;;
    overlap) echo "--set comm.overlap=true --set optimizer.clip_grad_norm=0" ;;
    priority) echo "--set comm.priority=true --set optimizer.clip_grad_norm=0" ;;
  esac
}
crossing_bytes() {
  local n total=0
  for ((n = 1; n <= 4; n++)); do total=$((total + $(cat "/sys/class/net/$TESSERA_CLUSTER-n$n/statistics/tx_bytes"))); done
  echo "$total"
}

name=${NAME:-cluster_layouts}
csv=$results/$name.csv
echo "deck,nodes,ranks,config,exit,step_s,crossing_mb_per_step,samples_per_s,first_loss,last_loss,plan_mb_per_node,plan_step_lo,plan_step_hi" >"$csv"
for deck in $decks; do
  for nodes in $node_counts; do
    hosts=$(for ((i = 1; i <= nodes; i++)); do printf '%s-n%d:2,' "$TESSERA_CLUSTER" "$i"; done)
    ranks=$((2 * nodes))
    for config in $configs; do
      run=$work/$deck-$nodes-$config
      before=$(crossing_bytes)
      # shellcheck disable=SC2046
      set +e
      OMPI_MCA_mpi_yield_when_idle=1 mpirun -n "$ranks" --host "${hosts%,}" --bind-to none \
        -x OPENBLAS_NUM_THREADS=1 "$tessera" train $(deck_args "$deck") $(config_args "$config") \
        --set train.steps="$steps" --set train.log_every=1 --set eval.every_epoch=false \
        --set eval.at_end=false --set checkpoint.at_end=false --set checkpoint.every_steps=0 \
        --set run.output_dir="$run" >"$run.out" 2>&1
      code=$?
      set -e
      after=$(crossing_bytes)
      if ((code != 0)); then
        echo "$deck,$nodes,$ranks,$config,$code,,,,,,,," >>"$csv"
        echo "bench: $deck $nodes nodes $config: exit $code ($(grep -m 1 'error' "$run.out" || true))"
        continue
      fi
            # The median step time of the logged steps after the first 2 (start-up), from metrics.csv's wall_s.
      step_s=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "wall_s") w = i; next }
                        $1 == "train" { n++; if (n >= 3) print $w - prev; prev = $w }' "$run/metrics.csv" |
               sort -g | awk '{ d[NR] = $1 } END { print (NR % 2 ? d[(NR + 1) / 2] : (d[NR / 2] + d[NR / 2 + 1]) / 2) }')
      sps=$(grep -o '"samples_per_s": [0-9.e+-]*' "$run/summary.json" | awk '{print $2}')
      losses=$(awk -F, '$1 == "train" { if (!f) f = $4; l = $4 } END { print f "," l }' "$run/metrics.csv")
      mb=$(awk -v b="$((after - before))" -v s="$steps" 'BEGIN { printf "%.3f", b / s / 1e6 }')
      # What `tessera plan` predicts for this layout from this run's own compute time (metrics.csv).
      # shellcheck disable=SC2046
      plan=$(mpirun -n 1 "$tessera" plan $(deck_args "$deck") $(config_args "$config") --nodes "$nodes" \
               --gpus-per-node 2 --link-gbps "$gbps" --from "$run" | awk -F'|' '/^\| this deck/ {
                 split($5, r, " [.][.] "); printf "%s,%s,%s", $3 + 0, r[1] + 0, r[2] + 0 }')
      echo "$deck,$nodes,$ranks,$config,0,$step_s,$mb,$sps,$losses,$plan" >>"$csv"
      echo "bench: $deck $nodes nodes x 2 ranks $config: step $step_s s, $mb MB crossing nodes per step"
    done
  done
done
{
  echo "| deck | nodes x ranks | config | step (s) | MB crossing nodes / step | step / base | bytes / base | plan: MB per node | plan: step (s) |"
  echo "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"
  awk -F, -v base="${BASE:-zero0}" 'NR > 1 { key = $1 "," $2; if ($4 == base && $5 == 0) { s0[key] = $6; b0[key] = $7 }
                    row[NR] = $0 }
           END { for (i = 2; i <= NR; i++) { split(row[i], f, ",")
                   key = f[1] "," f[2]
                   if (f[5] != 0) { printf "| %s | %s x 2 | %s | exit %s | | | | | |\n", f[1], f[2], f[4], f[5]; continue }
                   printf "| %s | %s x 2 | %s | %.3f | %.2f | %.2f | %.2f | %.2f | %.3f .. %.3f |\n", f[1], f[2], f[4], f[6], f[7],
                          (s0[key] > 0 ? f[6] / s0[key] : 0), (b0[key] > 0 ? f[7] / b0[key] : 0), f[11], f[12], f[13] } }' "$csv"
} >"$results/$name.md"
cat "$results/$name.md"
echo "bench: links shaped to $rate; CPU $(grep -m 1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores shared by all nodes"
