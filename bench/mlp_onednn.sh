#!/usr/bin/env bash
# Issue 17's MLP sitting: samples/s of Tessera's default deck (inputs/fashion_mnist_mlp.toml, MLP
# 784-512-512-10, SGD) on 2 ranks in fp32 and bf16 with run.gemm = openblas and onednn, and on 1
# rank whose products run on both cores (run.blas_threads defaults to cores / ranks), against the
# PyTorch peer ../shared/peers/mlp_torch.py on 2 threads in fp32 and in bf16 (bench/peer_amp.py
# runs it unchanged under torch.autocast, as gpt_mini.py's --amp bf16 does). The runs alternate
# REPS times in one sitting; the table has medians.
#
# Tessera: tools/mpirun.sh -n R build/tessera train
#   inputs/fashion_mnist_mlp.toml --set train.epochs=EPOCHS --set train.precision=P
#   --set run.gemm=G; samples/s and test accuracy from summary.json.
# Peer: OPENBLAS_NUM_THREADS=2 mlp_torch.py --threads 2 --epochs EPOCHS (SGD); its SUMMARY
#   median-epoch samples/s. Its Python is .venv (bench/peer_venv.sh) else Debian's python3-torch.
# Writes bench/results/mlp_onednn[_LABEL].csv (who,config,precision,rep,samples_per_s,test_acc)
# and bench/results/mlp_onednn[_LABEL].md.
#
# Usage: bench/mlp_onednn.sh   (needs build/tessera and data/fashion-mnist.h5)
# env: REPS (3), EPOCHS (2), BUILD_DIR (build), PEERS_DIR, LABEL (names the files), TABLE_ONLY=1 (rewrite the .md from the
#      existing .csv; LOADS="start / end" then says the sitting's load averages)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$here/lib.sh"
top=$(cd "$here/.." && pwd)
cd "$top"

reps=${REPS:-3}
epochs=${EPOCHS:-2}
build=${BUILD_DIR:-build}
deck=inputs/fashion_mnist_mlp.toml
results=bench/results
logs=$results/logs
runs=$results/tmp
csv=$results/mlp_onednn${LABEL:+_$LABEL}.csv
md=$results/mlp_onednn${LABEL:+_$LABEL}.md
[[ "$reps" =~ ^[1-9][0-9]*$ ]] || die "REPS='$reps' is not a positive integer"
[[ "$epochs" =~ ^[1-9][0-9]*$ ]] || die "EPOCHS='$epochs' is not a positive integer"
[[ -x "$build/tessera" ]] || die "$build/tessera not found" "tools/setup.sh"
[[ -f data/fashion-mnist.h5 ]] || die "data/fashion-mnist.h5 missing" "$build/tessera prepare fashion-mnist --out data/fashion-mnist.h5"
peers=$(peers_dir)
mkdir -p "$logs" "$runs"
if have_pypi_peer; then python=$PYPI_PEER_PYTHON; else python=$PEER_PYTHON; fi

# \brief Run tessera once; print "samples_per_s,test_acc" from its summary.json.
# \param $1 precision, $2 run.gemm, $3 tag, $4 ranks (2: one thread each; 1: two BLAS threads)
run_tessera() {
  local out=$runs/$3 log=$logs/$3.log threads=$((2 / $4))
  if ! env -u OPENBLAS_CORETYPE OPENBLAS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads tools/mpirun.sh -n "$4" \
      "$build/tessera" train "$deck" --set "train.epochs=$epochs" --set "train.precision=\"$1\"" \
      --set "run.gemm=\"$2\"" --set "run.output_dir=\"$out\"" --set run.overwrite=true >"$log" 2>&1; then
    echo "error: tessera $3 failed; see $log" >&2
    tail -n 5 "$log" >&2
    return 1
  fi
  "$PEER_PYTHON" - "$out/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"{float(s['samples_per_s']):.0f},{float(s['test_accuracy']):.4f}")
PY
}

# \brief Run the peer once; print "samples_per_s,test_acc".
# \param $1 precision, $2 log
run_peer() {
  local -a cmd=("$python")
  [[ $1 == bf16 ]] && cmd+=("$here/peer_amp.py")
  if ! env -u OPENBLAS_CORETYPE OPENBLAS_NUM_THREADS=2 "${cmd[@]}" "$peers/mlp_torch.py" --threads 2 \
      --opt sgd --epochs "$epochs" >"$2" 2>&1; then
    echo "error: peer $1 failed; see $2" >&2
    tail -n 5 "$2" >&2
    return 1
  fi
  parse_peer_summary "$2"
}

if [[ ${TABLE_ONLY:-0} != 1 ]]; then
  load_start=$(cut -d' ' -f1-3 /proc/loadavg)
  echo "who,config,precision,rep,samples_per_s,test_acc" >"$csv"
  for ((rep = 1; rep <= reps; rep++)); do
    for precision in fp32 bf16; do
      for config in 2:openblas 2:onednn 1:onednn; do
        ranks=${config%%:*} gemm=${config#*:}
        r=$(run_tessera "$precision" "$gemm" "mlp_onednn_${precision}_${gemm}_mpi${ranks}_rep$rep" "$ranks")
        echo "tessera,mpi${ranks}_$gemm,$precision,$rep,$r" | tee -a "$csv"
      done
      r=$(run_peer "$precision" "$logs/mlp_onednn_peer_${precision}_rep$rep.log")
      echo "torch,threads2,$precision,$rep,$r" | tee -a "$csv"
    done
  done
  load_end=$(cut -d' ' -f1-3 /proc/loadavg)
else
  [[ -f $csv ]] || die "TABLE_ONLY=1: no $csv"
  load_start=${LOADS%% / *} load_end=${LOADS##* / }
fi

cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
version=$("$python" -c 'import torch; print(torch.__version__)')
"$PEER_PYTHON" - "$csv" "$epochs" "$reps" "$load_start" "$load_end" "$cpu" "$version" >"$md" <<'PY'
import csv, statistics, sys
rows, epochs, reps, load_start, load_end, cpu, version = list(csv.DictReader(open(sys.argv[1]))), *sys.argv[2:]
layers = [(784, 512), (512, 512), (512, 10)]
fwd = sum(2 * i * o for i, o in layers)
per_sample = fwd + 2 * fwd - 2 * layers[0][0] * layers[0][1]   # as bench/mlp_compare.sh counts
print("# MLP 784-512-512-10 (default deck): Tessera with OpenBLAS or oneDNN vs torch\n")
print(f"CPU: {cpu}. Torch {version} on 2 threads; Tessera's mpi2 on 2 ranks of 1 thread, "
      f"mpi1 on 1 rank whose products run on 2 threads (its other kernels on 1). {epochs} epochs per "
      f"run, median of {reps} runs, alternated. {per_sample:,} FLOPs per sample (matrix products). "
      f"Load average at the start {load_start}, at the end {load_end} (shared machine: noisy).\n")
med = {}
for r in rows:
    med.setdefault((r['precision'], r['who'], r['config']), []).append(r)
print("| precision | who | config | runs | samples/s (median) | range | GFLOP/s | test acc | vs torch (same precision) |")
print("| --- | --- | --- | ---: | ---: | --- | ---: | ---: | ---: |")
for precision in ('fp32', 'bf16'):
    peer = statistics.median(float(r['samples_per_s']) for r in med[(precision, 'torch', 'threads2')])
    for (p, who, cfg), v in med.items():
        if p == precision:
            sps = statistics.median(float(r['samples_per_s']) for r in v)
            acc = statistics.median(float(r['test_acc']) for r in v)
            xs = [float(r['samples_per_s']) for r in v]
            print(f"| {p} | {who} | {cfg} | {len(v)} | {sps:.0f} | {min(xs):.0f}-{max(xs):.0f} | "
                  f"{sps * per_sample * 1e-9:.1f} | {acc:.4f} | {sps / peer:.2f} |")
PY
echo "wrote $csv and $md"
