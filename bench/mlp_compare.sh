#!/usr/bin/env bash
# Side-by-side throughput of Tessera and the fixed PyTorch peer on the MLP 784-512-512-10
# (Fashion-MNIST), in one sitting, alternating the runs so that they share the machine's noise.
#
# For each coretype (OPENBLAS_CORETYPE=Haswell and unset):
#   - build/bench/peak_flops writes bench/results/peak_flops_<coretype>.csv (the MFU yardsticks);
# then REPS times, for each coretype in turn:
#   - the peer (mlp_torch.py, SGD) in each of PEER_CONFIGS (see lib.sh for the names);
#   - tessera on 1 rank (OPENBLAS_NUM_THREADS=2) and on 2 ranks (OPENBLAS_NUM_THREADS=1 each):
#       tools/mpirun.sh -n N build/tessera train inputs/fashion_mnist_mlp.toml
#         --set train.epochs=EPOCHS --set run.output_dir=DIR --set run.overwrite=true
#     reading samples_per_s and test_accuracy from DIR/summary.json.
# Writes bench/results/mlp_compare.csv (who,config,coretype,rep,samples_per_s,test_acc) and
# bench/results/mlp_compare.md (medians, ratio to the best peer under the same coretype, MFU).
#
# Usage: bench/mlp_compare.sh     (from anywhere; needs build/tessera and build/bench/peak_flops)
# env: REPS (3), EPOCHS (3), CORETYPES ("Haswell unset"), PEER_CONFIGS ("torch1_ob1 torch1_ob2"),
#      BUILD_DIR (build), DECK (inputs/fashion_mnist_mlp.toml), SKIP_TESSERA=1 (peers only),
#      PEERS_DIR (when ../shared/peers is not next to the repository)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$here/lib.sh"
top=$(cd "$here/.." && pwd)
cd "$top"

reps=${REPS:-3}
epochs=${EPOCHS:-3}
read -r -a coretypes <<<"${CORETYPES:-Haswell unset}"
read -r -a peer_configs <<<"${PEER_CONFIGS:-torch1_ob1 torch1_ob2}"
build=${BUILD_DIR:-build}
deck=${DECK:-inputs/fashion_mnist_mlp.toml}
skip_tessera=${SKIP_TESSERA:-0}
results=bench/results
logs=$results/logs
runs=$results/tmp
csv=$results/mlp_compare.csv
md=$results/mlp_compare.md

# Check everything up front: a missing piece should fail now, not after an hour of peers.
[[ "$reps" =~ ^[1-9][0-9]*$ ]] || die "REPS='$reps' is not a positive integer"
[[ "$epochs" =~ ^[1-9][0-9]*$ ]] || die "EPOCHS='$epochs' is not a positive integer"
[[ -x "$build/bench/peak_flops" ]] ||
  die "$build/bench/peak_flops not found" "cmake -S . -B $build && cmake --build $build --target peak_flops"
if [[ "$skip_tessera" != 1 ]]; then
  [[ -x "$build/tessera" ]] ||
    die "$build/tessera not found (SKIP_TESSERA=1 runs the peers only)" "cmake -S . -B $build && cmake --build $build --target tessera"
  [[ -f "$deck" ]] || die "deck $deck not found" "set DECK=path/to/deck.toml"
  [[ -x tools/mpirun.sh ]] || die "tools/mpirun.sh not found or not executable"
fi
for config in "${peer_configs[@]}"; do peer_config_args "$config" >/dev/null; done
peers_dir >/dev/null
mkdir -p "$logs" "$runs"

# \brief Run tessera once and print "samples_per_s,test_acc" from its summary.json.
# \param $1 ranks, $2 OpenBLAS threads per rank, $3 coretype label, $4 tag for the log and output dir
run_tessera_mlp() {
  local ranks=$1 ob_threads=$2 coretype=$3 tag=$4
  local out=$runs/$tag log=$logs/$tag.log
  if ! with_coretype "$coretype" env OPENBLAS_NUM_THREADS="$ob_threads" OMP_NUM_THREADS="$ob_threads" \
      tools/mpirun.sh -n "$ranks" "$build/tessera" train "$deck" --set "train.epochs=$epochs" \
      --set "run.output_dir=$out" --set run.overwrite=true >"$log" 2>&1; then
    echo "error: tessera $tag failed; see $log" >&2
    tail -n 5 "$log" >&2
    return 1
  fi
  "$PEER_PYTHON" - "$out/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"{float(s['samples_per_s']):.0f},{float(s['test_accuracy']):.4f}")
PY
}

# The machine is shared: record its load so that the table says how quiet the sitting was.
load_start=$(cut -d' ' -f1-3 /proc/loadavg)

# Yardsticks first, under each coretype.
for coretype in "${coretypes[@]}"; do
  echo "== peak_flops, coretype $coretype"
  with_coretype "$coretype" "$build/bench/peak_flops" --csv "$results/peak_flops_$coretype.csv" |
    tee "$logs/peak_flops_$coretype.log"
done

# The runs, alternating who and coretype within each repetition.
echo "who,config,coretype,rep,samples_per_s,test_acc" >"$csv"
for ((rep = 1; rep <= reps; rep++)); do
  for coretype in "${coretypes[@]}"; do
    for config in "${peer_configs[@]}"; do
      r=$(run_peer_mlp "$config" sgd "$coretype" "$epochs" "$logs/compare_${config}_${coretype}_rep$rep.log")
      echo "torch_mlp,$config,$coretype,$rep,$r" | tee -a "$csv"
    done
    if [[ "$skip_tessera" != 1 ]]; then
      r=$(run_tessera_mlp 1 2 "$coretype" "tessera_mpi1_ob2_${coretype}_rep$rep")
      echo "tessera,mpi1_ob2,$coretype,$rep,$r" | tee -a "$csv"
      r=$(run_tessera_mlp 2 1 "$coretype" "tessera_mpi2_ob1_${coretype}_rep$rep")
      echo "tessera,mpi2_ob1,$coretype,$rep,$r" | tee -a "$csv"
    fi
  done
done

# The table: medians, ratio to the best peer, MFU against both yardsticks.
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
"$PEER_PYTHON" - "$csv" "$results" "$epochs" "$reps" "$load_start" "$load_end" >"$md" <<'PY'
import csv, statistics, sys
rows, results, epochs, reps = list(csv.DictReader(open(sys.argv[1]))), sys.argv[2], sys.argv[3], sys.argv[4]
load_start, load_end = sys.argv[5], sys.argv[6]
# FLOPs per training sample of the MLP 784-512-512-10 (matrix products only): forward 2*sum(in*out);
# backward = weight gradients (2*in*out each) + input gradients (2*in*out each, none for layer 1).
layers = [(784, 512), (512, 512), (512, 10)]
fwd = sum(2 * i * o for i, o in layers)
bwd = 2 * fwd - 2 * layers[0][0] * layers[0][1]
per_sample = fwd + bwd
print(f"# MLP 784-512-512-10: Tessera vs the PyTorch peer\n")
print(f"{epochs} epochs per run, median of {reps} runs, peers with SGD. FLOPs per training sample "
      f"(matrix products only): forward {fwd:,} + backward {bwd:,} (twice the forward, less the "
      f"first layer's input gradient) = {per_sample:,}. Load average (1, 5, 15 min) at the start "
      f"{load_start}, at the end {load_end}.\n")
for coretype in dict.fromkeys(r['coretype'] for r in rows):
    peak = list(csv.DictReader(open(f"{results}/peak_flops_{coretype}.csv")))
    fma = max(float(p['gflops']) for p in peak if p['what'].startswith('fma_') and p['threads'] == '2')
    gemm = next(float(p['gflops']) for p in peak
                if p['what'] == 'sgemm_square' and p['threads'] == '2' and p['m'] == '2048')
    core = peak[0]['coretype']
    groups = {}
    for r in rows:
        if r['coretype'] == coretype:
            groups.setdefault((r['who'], r['config']), []).append(r)
    med = {k: (statistics.median(float(r['samples_per_s']) for r in v),
               statistics.median(float(r['test_acc']) for r in v), len(v)) for k, v in groups.items()}
    best_peer = max((v[0], k) for k, v in med.items() if k[0] != 'tessera')
    print(f"## OPENBLAS_CORETYPE={coretype} (OpenBLAS kernels: {core})\n")
    print(f"Yardsticks: 2-core FMA peak (best ISA) {fma:.0f} GFLOP/s; 2-thread SGEMM 2048^3 {gemm:.0f} GFLOP/s. "
          f"Best peer: {best_peer[1][1]} ({best_peer[0]:.0f} samples/s).\n")
    print("| who | config | runs | samples/s | test acc | vs best peer | GFLOP/s | MFU (FMA peak) | MFU (SGEMM 2048) |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for (who, config), (sps, acc, n) in sorted(med.items()):
        gf = sps * per_sample * 1e-9
        print(f"| {who} | {config} | {n} | {sps:.0f} | {acc:.4f} | {sps / best_peer[0]:.2f} | {gf:.1f} | "
              f"{gf / fma:.1%} | {gf / gemm:.1%} |")
    print()
PY
echo "wrote $csv and $md"
