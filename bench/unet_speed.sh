#!/usr/bin/env bash
# The Darcy U-Net's training speed against its PyTorch peer, one sitting: samples/s of Tessera
# (inputs/darcy_unet.toml on data/darcy64.h5: 64 x 64 fields, global batch 20, no evaluation or
# checkpoint) on 2 ranks of 1 thread and on 1 rank whose oneDNN products and convolutions run on
# 2 threads, against bench/unet_torch.py on 2 threads under Debian's python3-torch and, where
# bench/peer_venv.sh made one, a current torch from PyPI. The runs alternate REPS times; the
# table has medians and each configuration's ratio to the faster peer.
#
# Tessera: samples/s from summary.json (steps only). Peer: its SUMMARY median-epoch samples/s.
# Writes bench/results/unet_speed.csv (who,config,rep,samples_per_s) and unet_speed.md.
#
# Usage: bench/unet_speed.sh   (needs build/tessera; makes data/darcy64.h5 if missing)
# env: REPS (3), EPOCHS (2), BUILD_DIR (build)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$here/lib.sh"
top=$(cd "$here/.." && pwd)
cd "$top"

reps=${REPS:-3}
epochs=${EPOCHS:-2}
build=${BUILD_DIR:-build}
res=bench/results
runs=$res/tmp/unet_speed
csv=$res/unet_speed.csv
md=$res/unet_speed.md
[[ "$reps" =~ ^[1-9][0-9]*$ ]] || die "REPS='$reps' is not a positive integer"
[[ "$epochs" =~ ^[1-9][0-9]*$ ]] || die "EPOCHS='$epochs' is not a positive integer"
[[ -x "$build/tessera" ]] || die "$build/tessera not found" "tools/setup.sh"
mkdir -p "$res/logs" "$runs" data
[[ -f data/darcy64.h5 ]] || tools/mpirun.sh -n 2 "$build/tessera" prepare darcy --out data/darcy64.h5 --size 64 --train 1000 --test 100
declare -A pythons=([debian]=$PEER_PYTHON)
if have_pypi_peer && "$PYPI_PEER_PYTHON" -c "import h5py" 2>/dev/null; then pythons[pypi]=$PYPI_PEER_PYTHON; fi
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
echo "who,config,rep,samples_per_s" >"$csv"
for ((rep = 1; rep <= reps; rep++)); do
  for ranks in 2 1; do
    threads=$((2 / ranks)) out=$runs/mpi$ranks log=$res/logs/unet_speed_mpi${ranks}_rep$rep.log
    env -u OPENBLAS_CORETYPE OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads tools/mpirun.sh -n "$ranks" \
      "$build/tessera" train inputs/darcy_unet.toml --set "train.epochs=$epochs" --set eval.every_epoch=false \
      --set eval.at_end=false --set checkpoint.at_end=false --set checkpoint.every_steps=0 \
      --set "run.output_dir=\"$out\"" --set run.overwrite=true >"$log" 2>&1 || die "tessera failed: see $log"
    sps=$("$PEER_PYTHON" -c 'import json, sys; print("%.1f" % json.load(open(sys.argv[1]))["samples_per_s"])' "$out/summary.json")
    echo "tessera,mpi$ranks,$rep,$sps" | tee -a "$csv"
  done
  for peer in "${!pythons[@]}"; do
    log=$res/logs/unet_speed_torch_${peer}_rep$rep.log
    env -u OPENBLAS_CORETYPE OPENBLAS_NUM_THREADS=2 "${pythons[$peer]}" bench/unet_torch.py --data data/darcy64.h5 \
      --epochs "$epochs" --threads 2 --seed 1234 --order torch --normalize channel >"$log" 2>&1 || die "peer failed: see $log"
    sps=$("$PEER_PYTHON" -c 'import json, sys
line = [l for l in open(sys.argv[1]) if l.startswith("SUMMARY ")][-1]
print("%.1f" % json.loads(line[8:])["samples_per_s_median"])' "$log")
    echo "torch,$peer,$rep,$sps" | tee -a "$csv"
  done
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
versions=""
for peer in "${!pythons[@]}"; do versions+=" $peer: torch $("${pythons[$peer]}" -c 'import torch; print(torch.__version__)')."; done
"$PEER_PYTHON" - "$csv" "$reps" "$epochs" "$cpu" "$versions" "$load_start" "$load_end" >"$md" <<'PY'
import csv, statistics, sys
rows, reps, epochs, cpu, versions, load_start, load_end = list(csv.DictReader(open(sys.argv[1]))), *sys.argv[2:]
med = {}
for r in rows:
    med.setdefault((r['who'], r['config']), []).append(float(r['samples_per_s']))
best_peer = max(statistics.median(v) for (who, _), v in med.items() if who == 'torch')
print("# Darcy U-Net 64 x 64 (inputs/darcy_unet.toml, global batch 20): Tessera vs bench/unet_torch.py\n")
print(f"CPU: {cpu}. {epochs} epochs per run, median of {reps} alternated runs. Tessera mpi2: 2 ranks of "
      f"1 thread; mpi1: 1 rank, oneDNN on 2 threads. Peers on 2 threads;{versions} Load average at "
      f"the start {load_start}, at the end {load_end}.\n")
print("| who | config | samples/s (median) | range | vs the faster peer |")
print("| --- | --- | ---: | --- | ---: |")
for (who, cfg), v in med.items():
    m = statistics.median(v)
    print(f"| {who} | {cfg} | {m:.1f} | {min(v):.1f}-{max(v):.1f} | {m / best_peer:.2f} |")
PY
echo "wrote $csv and $md"
