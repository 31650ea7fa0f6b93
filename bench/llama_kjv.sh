#!/usr/bin/env bash
# Tessera's Llama (inputs/kjv_llama.toml: byte vocabulary, 4 blocks, 8 heads, 4 kv heads, width
# 256, ffn 704, context 128, untied, global batch 16) on 2 ranks beside the PyTorch peer
# bench/llama_torch.py (Hugging Face transformers' LlamaForCausalLM of the same dimensions,
# AdamW at the deck's optimizer.lr, constant, no clipping; 2 torch threads), in one sitting, as
# bench/gpt_kjv.sh does for the GPT:
#   tools/mpirun.sh -n 2 build/tessera train DECK --set run.output_dir=...
#     [--set train.steps=STEPS] [--set train.precision=PRECISION] [--set run.gemm=GEMM]
#   the peer: llama_torch.py --threads 2 --lr LR --data data/kjv.txt --steps 20 --warm 5 (its speed), then
#     as many steps as fit in Tessera's wall-clock time [PEER_ARGS]
# Writes bench/results/llama_kjv[_LABEL].csv (who,step,wall_s,val_loss,tokens_per_s: Tessera's
# every evaluation of the whole /val split and its median tokens/s over the logged steps after the
# first 10; the peer's final 5-batch estimate and its median-step tokens/s) and
# bench/results/llama_kjv[_LABEL].md, with GFLOP/s at the peer's count of FLOPs per token
# (6N + 12LTC, N = the parameters but the embedding; 19.67 M for this model) and the fraction of
# the 2-core FMA peak of build/bench/peak_flops (run here, coretype unset).
# env: DECK (inputs/kjv_llama.toml), BUILD_DIR (build), STEPS (Tessera's train.steps; the deck's when unset),
#      PRECISION (fp32 | bf16: Tessera's train.precision; the peer gets --amp bf16 unless PEER_ARGS
#                 says otherwise), GEMM (run.gemm; the deck's when unset),
#      PEER_ARGS (more llama_torch.py arguments; default "--attn eager", the faster attention on the
#                 machine of 2026-11-28 under load, see docs/performance.md; e.g. "--attn sdpa --compile"),
#      LABEL (names the files llama_kjv_LABEL.*).
# Needs build/tessera with model.kind = "llama", data/kjv.txt and data/corpus.h5
# (tools/prepare_corpus.sh), and .venv with torch and transformers (bench/peer_venv.sh, then
# .venv/bin/pip install transformers).
#   STEPS=200 bench/llama_kjv.sh
#   STEPS=200 PRECISION=bf16 GEMM=onednn LABEL=bf16 bench/llama_kjv.sh
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$here/lib.sh"
top=$(cd "$here/.." && pwd)
cd "$top"
build=${BUILD_DIR:-build}
deck=${DECK:-inputs/kjv_llama.toml}
precision=${PRECISION:-fp32}
results=bench/results
logs=$results/logs
name=llama_kjv${LABEL:+_$LABEL}
out=$results/tmp/$name
csv=$results/$name.csv
md=$results/$name.md
[[ -x "$build/tessera" ]] || die "$build/tessera not found" "tools/setup.sh"
[[ -f $deck ]] || die "$deck not found"
[[ -f data/kjv.txt && -f data/corpus.h5 ]] || die "data/kjv.txt or data/corpus.h5 missing" "tools/prepare_corpus.sh"
[[ "${LABEL:-x}" =~ ^[A-Za-z0-9_.-]+$ ]] || die "LABEL='$LABEL': letters, digits, '.', '_' and '-' only"
[[ $precision == fp32 || $precision == bf16 ]] || die "PRECISION='$precision': expected fp32 or bf16"
[[ -z ${STEPS:-} || ${STEPS:-} =~ ^[1-9][0-9]*$ ]] || die "STEPS='$STEPS': expected a positive whole number"
have_pypi_peer || die "no torch in $PYPI_PEER_PYTHON" "bench/peer_venv.sh"
"$PYPI_PEER_PYTHON" -c 'import transformers' 2>/dev/null ||
  die "no transformers in $PYPI_PEER_PYTHON" "$PYPI_PEER_PYTHON -m pip install transformers"
python=$PYPI_PEER_PYTHON
lr=$("$python" -c "import sys, tomllib; print(tomllib.load(open(sys.argv[1], 'rb'))['optimizer']['lr'])" "$deck")
peer_args_default="--attn eager"
[[ $precision == bf16 ]] && peer_args_default+=" --amp bf16"
read -r -a peer_args <<<"${PEER_ARGS:-$peer_args_default}"
mkdir -p "$logs" "$out"

peak_csv=$results/peak_flops_${name}.csv
if [[ -x "$build/bench/peak_flops" ]]; then
  with_coretype unset "$build/bench/peak_flops" --csv "$peak_csv" >"$logs/${name}_peak_flops.log" 2>&1 || rm -f "$peak_csv"
fi

sets=(--set "run.output_dir=\"$out\"" --set run.overwrite=true --set "train.precision=\"$precision\"")
[[ -n ${STEPS:-} ]] && sets+=(--set "train.steps=$STEPS" --set "eval.every_steps=$(((STEPS + 4) / 5))" \
  --set "checkpoint.every_steps=0")
[[ -n ${GEMM:-} ]] && sets+=(--set "run.gemm=\"$GEMM\"")
env OPENBLAS_NUM_THREADS=1 tools/mpirun.sh -n 2 "$build/tessera" train "$deck" \
  "${sets[@]}" >"$logs/${name}_tessera.log" 2>&1
wall=$("$python" -c "import json,sys; print(json.load(open(sys.argv[1]))['wall_s'])" "$out/summary.json")

# The peer's speed, then as many steps as fit in Tessera's wall-clock time.
"$python" bench/llama_torch.py --threads 2 --lr "$lr" --data data/kjv.txt --steps 20 --warm 5 "${peer_args[@]}" \
  >"$logs/${name}_peer_calibration.log" 2>&1
tps=$(sed -n 's/.*mean(all 20)=\([0-9.]*\).*/\1/p' "$logs/${name}_peer_calibration.log")
peer_steps=$("$python" -c "import sys; print(max(20, int(float(sys.argv[1]) * float(sys.argv[2]) / 2048)))" "$wall" "$tps")
start=$(date +%s)
"$python" bench/llama_torch.py --threads 2 --lr "$lr" --data data/kjv.txt --steps "$peer_steps" "${peer_args[@]}" \
  >"$logs/${name}_peer.log" 2>&1
peer_wall=$(($(date +%s) - start))
peer_val=$(sed -n 's/.*val_loss [0-9.]*->\([0-9.]*\).*/\1/p' "$logs/${name}_peer.log")
peer_tps=$(sed -n 's/.*tokens\/s median-step=\([0-9.]*\).*/\1/p' "$logs/${name}_peer.log")
flops=$(sed -n 's/.*flops\/token(6N+12LTC)=\([0-9.]*\)M.*/\1/p' "$logs/${name}_peer.log")
versions=$("$python" -c 'import torch, transformers; print(f"torch {torch.__version__}, transformers {transformers.__version__}")')
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|avx512f|avx512_bf16|amx_bf16)$' | tr '\n' ' ')
gemm_line=$(grep -m1 -o 'gemm: .*' "$logs/${name}_tessera.log" || true)

"$python" - "$out/metrics.csv" "$csv" "$md" "$peer_steps" "$peer_wall" "$peer_val" "$peer_tps" "$flops" "$wall" \
  "$precision" "$versions, 2 threads, lr $lr, ${peer_args[*]}" "$deck" "$cpu; $flags" "$gemm_line" "$peak_csv" <<'PY'
import csv, os, statistics, sys
(metrics, out_csv, out_md, peer_steps, peer_wall, peer_val, peer_tps, flops, wall, precision, peer, deck, cpu, gemm,
 peak_csv) = sys.argv[1:]
rows = list(csv.DictReader(open(metrics)))
evals = [r for r in rows if r['kind'] == 'eval']
train = [r for r in rows if r['kind'] == 'train' and int(r['step']) > 10]
def tokens_per_s(r):  # tokens_per_s where Tessera writes it, else samples/s x context (128)
    return float(r['tokens_per_s']) if r.get('tokens_per_s') else float(r['samples_per_s']) * 128
tps = statistics.median(tokens_per_s(r) for r in train) if train else float('nan')
flops = float(flops) * 1e6
fma = None
if os.path.exists(peak_csv):
    peak = list(csv.DictReader(open(peak_csv)))
    fma = max(float(p['gflops']) for p in peak if p['what'].startswith('fma_') and p['threads'] == '2')
def rate(t):
    g = t * flops / 1e9
    return f"{g:.1f}" + (f" | {100 * g / fma:.1f}%" if fma else " | -")
with open(out_csv, 'w') as f:
    f.write("who,step,wall_s,val_loss,tokens_per_s\n")
    for r in evals:
        f.write(f"tessera,{r['step']},{float(r['wall_s']):.0f},{float(r['loss']):.4f},\n")
    f.write(f"tessera,,,,{tps:.0f}\n")
    f.write(f"torch_llama,{peer_steps},{peer_wall},{peer_val},{peer_tps}\n")
with open(out_md, 'w') as f:
    f.write("# Llama on the King James Bible: validation loss (nats per byte) against wall-clock, and tokens/s\n\n")
    f.write(f"CPU: {cpu}. Tessera on 2 ranks, {deck} in {precision} (its wall time {float(wall):.0f} s; "
            f"{gemm}); the PyTorch peer bench/llama_torch.py ({peer}) for {peer_steps} steps at its calibrated "
            f"speed ({peer_wall} s). FLOPs per token 6N + 12LTC = {flops / 1e6:.2f} M"
            + (f"; 2-core FMA peak {fma:.0f} GFLOP/s (build/bench/peak_flops).\n\n" if fma else ".\n\n"))
    f.write("| who | step | wall s | val loss |\n| --- | ---: | ---: | ---: |\n")
    for r in evals:
        f.write(f"| tessera | {r['step']} | {float(r['wall_s']):.0f} | {float(r['loss']):.4f} |\n")
    f.write(f"| torch peer (5 random val batches) | {peer_steps} | {peer_wall} | {peer_val} |\n\n")
    f.write("| who | tokens/s (median step) | GFLOP/s | of 2-core FMA peak |\n| --- | ---: | ---: | ---: |\n")
    f.write(f"| tessera, 2 ranks | {tps:.0f} | {rate(tps)} |\n")
    f.write(f"| torch peer | {float(peer_tps):.0f} | {rate(float(peer_tps))} |\n")
PY
echo "wrote $csv and $md"
