#!/usr/bin/env bash
# Validation loss against wall-clock: Tessera's GPT on 2 ranks (inputs/kjv_gpt.toml, about 14
# minutes here), then the PyTorch peer gpt_mini.py for the same wall-clock time (its step count
# from a 20-step calibration of its speed), in one sitting.
#   tools/mpirun.sh -n 2 build/tessera train inputs/kjv_gpt.toml --set run.output_dir=...
#   OPENBLAS_NUM_THREADS=2 gpt_mini.py --threads 1 --data data/kjv.txt --steps S
# Writes bench/results/gpt_kjv.csv (who,step,wall_s,val_loss: Tessera's every evaluation of the
# whole /val split, the peer's final 5-batch estimate) and bench/results/gpt_kjv.md.
# env: CORETYPE (Haswell; "unset" for OpenBLAS's own choice), BUILD_DIR (build), PEERS_DIR
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$here/lib.sh"
top=$(cd "$here/.." && pwd)
cd "$top"
build=${BUILD_DIR:-build}
coretype=${CORETYPE:-Haswell}
results=bench/results
logs=$results/logs
out=$results/tmp/gpt_kjv
csv=$results/gpt_kjv.csv
md=$results/gpt_kjv.md
[[ -x "$build/tessera" ]] || { echo "error: $build/tessera not found" >&2; exit 1; }
[[ -f data/kjv.txt && -f data/corpus.h5 ]] || { echo "error: run tools/prepare_corpus.sh first" >&2; exit 1; }
peers=$(peers_dir)
mkdir -p "$logs" "$out"

with_coretype "$coretype" env OPENBLAS_NUM_THREADS=1 tools/mpirun.sh -n 2 "$build/tessera" train inputs/kjv_gpt.toml \
  --set "run.output_dir=\"$out\"" --set run.overwrite=true >"$logs/gpt_kjv_tessera.log" 2>&1
wall=$("$PEER_PYTHON" -c "import json,sys; print(json.load(open(sys.argv[1]))['wall_s'])" "$out/summary.json")

# The peer's speed, then as many steps as fit in Tessera's wall-clock time.
with_coretype "$coretype" env OPENBLAS_NUM_THREADS=2 "$PEER_PYTHON" "$peers/gpt_mini.py" --threads 1 \
  --data data/kjv.txt --steps 20 --warm 5 >"$logs/gpt_kjv_peer_calibration.log" 2>&1
tps=$(sed -n 's/.*mean(all 20)=\([0-9.]*\).*/\1/p' "$logs/gpt_kjv_peer_calibration.log")
peer_steps=$("$PEER_PYTHON" -c "import sys; print(int(float(sys.argv[1]) * float(sys.argv[2]) / 2048))" "$wall" "$tps")
start=$(date +%s)
with_coretype "$coretype" env OPENBLAS_NUM_THREADS=2 "$PEER_PYTHON" "$peers/gpt_mini.py" --threads 1 \
  --data data/kjv.txt --steps "$peer_steps" >"$logs/gpt_kjv_peer.log" 2>&1
peer_wall=$(($(date +%s) - start))
peer_val=$(sed -n 's/.*val_loss [0-9.]*->\([0-9.]*\).*/\1/p' "$logs/gpt_kjv_peer.log")

"$PEER_PYTHON" - "$out/metrics.csv" "$csv" "$md" "$peer_steps" "$peer_wall" "$peer_val" "$wall" "$coretype" <<'PY'
import csv, sys
metrics, out_csv, out_md, peer_steps, peer_wall, peer_val, wall, coretype = sys.argv[1:]
evals = [r for r in csv.DictReader(open(metrics)) if r['kind'] == 'eval']
with open(out_csv, 'w') as f:
    f.write("who,step,wall_s,val_loss\n")
    for r in evals:
        f.write(f"tessera,{r['step']},{float(r['wall_s']):.0f},{float(r['loss']):.4f}\n")
    f.write(f"torch_gpt,{peer_steps},{peer_wall},{peer_val}\n")
with open(out_md, 'w') as f:
    f.write(f"# GPT on the King James Bible: validation loss (nats per byte) against wall-clock\n\n")
    f.write(f"OPENBLAS_CORETYPE={coretype}. Tessera on 2 ranks, inputs/kjv_gpt.toml (its wall time {float(wall):.0f} s); "
            f"the PyTorch peer for {peer_steps} steps at its calibrated speed ({peer_wall} s).\n\n")
    f.write("| who | step | wall s | val loss |\n| --- | ---: | ---: | ---: |\n")
    for r in evals:
        f.write(f"| tessera | {r['step']} | {float(r['wall_s']):.0f} | {float(r['loss']):.4f} |\n")
    f.write(f"| torch peer (5 random val batches) | {peer_steps} | {peer_wall} | {peer_val} |\n")
PY
echo "wrote $csv and $md"
