#!/usr/bin/env bash
# Validation loss against wall-clock: Tessera's GPT on 2 ranks (inputs/kjv_gpt.toml), then the
# PyTorch peer gpt_mini.py for the same wall-clock time (its step count from a 20-step
# calibration of its speed), in one sitting.
#   tools/mpirun.sh -n 2 build/tessera train inputs/kjv_gpt.toml --set run.output_dir=...
#     [--set train.steps=STEPS] [--set train.precision=PRECISION] [--set run.gemm=GEMM]
#   the peer: gpt_mini.py --data data/kjv.txt --steps S [PEER_ARGS]
# Writes bench/results/gpt_kjv[_LABEL].csv (who,step,wall_s,val_loss: Tessera's every evaluation
# of the whole /val split, the peer's final 5-batch estimate) and bench/results/gpt_kjv[_LABEL].md.
# env: CORETYPE (Haswell; "unset" for OpenBLAS's own choice), BUILD_DIR (build), PEERS_DIR,
#      STEPS (Tessera's train.steps; the deck's 3500 when unset: about 14 min in fp32 here),
#      PRECISION (fp32 | bf16: Tessera's train.precision), GEMM (run.gemm; the deck's when unset),
#      PEER (debian: Debian's python3-torch, 1 torch thread over 2 OpenBLAS threads, the default;
#            pypi: bench/peer_venv.sh's torch on 2 threads),
#      PEER_ARGS (more gpt_mini.py arguments, e.g. "--amp bf16" or "--amp bf16 --sdpa"),
#      LABEL (names the files gpt_kjv_LABEL.*).
# The bf16 sitting of issue 17:
#   CORETYPE=unset STEPS=1500 PRECISION=bf16 GEMM=onednn PEER=pypi PEER_ARGS="--amp bf16" LABEL=bf16 bench/gpt_kjv.sh
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$here/lib.sh"
top=$(cd "$here/.." && pwd)
cd "$top"
build=${BUILD_DIR:-build}
coretype=${CORETYPE:-Haswell}
precision=${PRECISION:-fp32}
peer=${PEER:-debian}
read -r -a peer_args <<<"${PEER_ARGS:-}"
results=bench/results
logs=$results/logs
name=gpt_kjv${LABEL:+_$LABEL}
out=$results/tmp/$name
csv=$results/$name.csv
md=$results/$name.md
[[ -x "$build/tessera" ]] || die "$build/tessera not found" "tools/setup.sh"
[[ -f data/kjv.txt && -f data/corpus.h5 ]] || die "data/kjv.txt or data/corpus.h5 missing" "tools/prepare_corpus.sh"
[[ "${LABEL:-x}" =~ ^[A-Za-z0-9_.-]+$ ]] || die "LABEL='$LABEL': letters, digits, '.', '_' and '-' only"
[[ $precision == fp32 || $precision == bf16 ]] || die "PRECISION='$precision': expected fp32 or bf16"
[[ -z ${STEPS:-} || ${STEPS:-} =~ ^[1-9][0-9]*$ ]] || die "STEPS='$STEPS': expected a positive whole number"
case $peer in
  debian) python=$PEER_PYTHON peer_threads=(--threads 1) peer_ob=2 ;;
  pypi)
    have_pypi_peer || die "PEER=pypi: no torch in $PYPI_PEER_PYTHON" "bench/peer_venv.sh"
    python=$PYPI_PEER_PYTHON peer_threads=(--threads 2) peer_ob=2 ;;
  *) die "PEER='$peer': expected debian or pypi" ;;
esac
peers=$(peers_dir)
mkdir -p "$logs" "$out"

sets=(--set "run.output_dir=\"$out\"" --set run.overwrite=true --set "train.precision=\"$precision\"")
[[ -n ${STEPS:-} ]] && sets+=(--set "train.steps=$STEPS" --set "eval.every_steps=$(((STEPS + 4) / 5))" \
  --set "checkpoint.every_steps=0")
[[ -n ${GEMM:-} ]] && sets+=(--set "run.gemm=\"$GEMM\"")
with_coretype "$coretype" env OPENBLAS_NUM_THREADS=1 tools/mpirun.sh -n 2 "$build/tessera" train inputs/kjv_gpt.toml \
  "${sets[@]}" >"$logs/${name}_tessera.log" 2>&1
wall=$("$PEER_PYTHON" -c "import json,sys; print(json.load(open(sys.argv[1]))['wall_s'])" "$out/summary.json")

# The peer's speed, then as many steps as fit in Tessera's wall-clock time.
with_coretype "$coretype" env OPENBLAS_NUM_THREADS="$peer_ob" "$python" "$peers/gpt_mini.py" "${peer_threads[@]}" \
  --data data/kjv.txt --steps 20 --warm 5 "${peer_args[@]}" >"$logs/${name}_peer_calibration.log" 2>&1
tps=$(sed -n 's/.*mean(all 20)=\([0-9.]*\).*/\1/p' "$logs/${name}_peer_calibration.log")
peer_steps=$("$PEER_PYTHON" -c "import sys; print(int(float(sys.argv[1]) * float(sys.argv[2]) / 2048))" "$wall" "$tps")
start=$(date +%s)
with_coretype "$coretype" env OPENBLAS_NUM_THREADS="$peer_ob" "$python" "$peers/gpt_mini.py" "${peer_threads[@]}" \
  --data data/kjv.txt --steps "$peer_steps" "${peer_args[@]}" >"$logs/${name}_peer.log" 2>&1
peer_wall=$(($(date +%s) - start))
peer_val=$(sed -n 's/.*val_loss [0-9.]*->\([0-9.]*\).*/\1/p' "$logs/${name}_peer.log")
version=$("$python" -c 'import torch; print(torch.__version__)')
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|avx512f|avx512_bf16|amx_bf16)$' | tr '\n' ' ')
gemm_line=$(grep -m1 -o 'gemm: .*' "$logs/${name}_tessera.log" || true)

"$PEER_PYTHON" - "$out/metrics.csv" "$csv" "$md" "$peer_steps" "$peer_wall" "$peer_val" "$wall" "$coretype" \
  "$precision" "torch $version ($peer) ${peer_threads[*]} ${peer_args[*]}" "$cpu; $flags" "$gemm_line" <<'PY'
import csv, sys
metrics, out_csv, out_md, peer_steps, peer_wall, peer_val, wall, coretype, precision, peer, cpu, gemm = sys.argv[1:]
evals = [r for r in csv.DictReader(open(metrics)) if r['kind'] == 'eval']
with open(out_csv, 'w') as f:
    f.write("who,step,wall_s,val_loss\n")
    for r in evals:
        f.write(f"tessera,{r['step']},{float(r['wall_s']):.0f},{float(r['loss']):.4f}\n")
    f.write(f"torch_gpt,{peer_steps},{peer_wall},{peer_val}\n")
with open(out_md, 'w') as f:
    f.write(f"# GPT on the King James Bible: validation loss (nats per byte) against wall-clock\n\n")
    f.write(f"CPU: {cpu}. OPENBLAS_CORETYPE={coretype}. Tessera on 2 ranks, inputs/kjv_gpt.toml in {precision} "
            f"(its wall time {float(wall):.0f} s; {gemm}); the PyTorch peer ({peer}) for {peer_steps} steps at its "
            f"calibrated speed ({peer_wall} s).\n\n")
    f.write("| who | step | wall s | val loss |\n| --- | ---: | ---: | ---: |\n")
    for r in evals:
        f.write(f"| tessera | {r['step']} | {float(r['wall_s']):.0f} | {float(r['loss']):.4f} |\n")
    f.write(f"| torch peer (5 random val batches) | {peer_steps} | {peer_wall} | {peer_val} |\n")
PY
echo "wrote $csv and $md"
