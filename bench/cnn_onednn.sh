#!/usr/bin/env bash
# Issue 17's convolution sitting: samples/s of the CNN (inputs/fashion_mnist_cnn.toml: conv3x3 16
# and 32 channels on 28x28 Fashion-MNIST, batch 128) and of the Darcy U-Net (inputs/darcy_unet.toml
# at 64x64, levels 16/32/64, batch 20) with run.conv = im2col and onednn, in train.precision fp32
# (and bf16 with PRECISIONS="fp32 bf16": oneDNN's bf16 convolutions against im2col with bf16
# GEMMs), on 1 and 2 ranks (data parallel, 1 thread each). The configurations alternate REPS times in one sitting; the
# table has medians and ranges, with the CPU, its flags and the load averages.
#
#   OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 tools/mpirun.sh -n R build/tessera train DECK
#     --set train.steps=STEPS|UNET_STEPS --set run.conv=C --set run.blas_threads=1
#     --set train.precision=P (no evaluation, no checkpoint); samples/s from summary.json.
# Writes bench/results/cnn_onednn[_LABEL].csv (model,ranks,conv,precision,rep,samples_per_s) and
# cnn_onednn[_LABEL].md.
#
# Usage: bench/cnn_onednn.sh   (needs build/tessera and data/fashion-mnist.h5; makes
#        data/darcy64.h5 if missing)
# env: REPS (3), STEPS (40 CNN steps), UNET_STEPS (10), BUILD_DIR (build), SKIP_UNET=1,
#      PRECISIONS ("fp32"; "fp32 bf16" adds bf16), LABEL (names the files)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$here/lib.sh"
top=$(cd "$here/.." && pwd)
cd "$top"

reps=${REPS:-3}
steps=${STEPS:-40}
unet_steps=${UNET_STEPS:-10}
build=${BUILD_DIR:-build}
results=bench/results
logs=$results/logs
runs=$results/tmp
csv=$results/cnn_onednn${LABEL:+_$LABEL}.csv
md=$results/cnn_onednn${LABEL:+_$LABEL}.md
read -r -a precisions <<<"${PRECISIONS:-fp32}"
for p in "${precisions[@]}"; do
  [[ $p == fp32 || $p == bf16 ]] || die "PRECISIONS='${PRECISIONS:-}': fp32 and/or bf16"
done
[[ "$reps" =~ ^[1-9][0-9]*$ ]] || die "REPS='$reps' is not a positive integer"
[[ "$steps" =~ ^[1-9][0-9]*$ ]] || die "STEPS='$steps' is not a positive integer"
[[ "$unet_steps" =~ ^[1-9][0-9]*$ ]] || die "UNET_STEPS='$unet_steps' is not a positive integer"
[[ -x "$build/tessera" ]] || die "$build/tessera not found" "tools/setup.sh"
[[ -f data/fashion-mnist.h5 ]] || die "data/fashion-mnist.h5 missing" "$build/tessera prepare fashion-mnist --out data/fashion-mnist.h5"
mkdir -p "$logs" "$runs"
models=(cnn)
if [[ ${SKIP_UNET:-0} != 1 ]]; then
  [[ -f data/darcy64.h5 ]] || tools/mpirun.sh -n 2 "$build/tessera" prepare darcy --out data/darcy64.h5 --size 64 \
    --train 1000 --test 100 >"$logs/darcy64_prepare.log" 2>&1
  models+=(unet)
fi

# \brief Run tessera once; print its samples/s from summary.json.
# \param $1 model (cnn|unet), $2 ranks, $3 run.conv, $4 tag, $5 train.precision
run_tessera() {
  local out=$runs/$4 log=$logs/$4.log deck=inputs/fashion_mnist_cnn.toml n=$steps
  [[ $1 == unet ]] && deck=inputs/darcy_unet.toml n=$unet_steps
  if ! env -u OPENBLAS_CORETYPE OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 tools/mpirun.sh -n "$2" \
      "$build/tessera" train "$deck" --set "train.steps=$n" --set "run.conv=\"$3\"" --set run.blas_threads=1 \
      --set "train.precision=\"$5\"" \
      --set eval.every_epoch=false --set eval.at_end=false --set checkpoint.at_end=false \
      --set checkpoint.every_steps=0 --set "run.output_dir=\"$out\"" --set run.overwrite=true >"$log" 2>&1; then
    echo "error: tessera $4 failed; see $log" >&2
    tail -n 5 "$log" >&2
    return 1
  fi
  grep -h '^conv:\|\] conv:' "$out/log.txt" | head -n 1 >&2 || true
  "$PEER_PYTHON" -c 'import json, sys; print("%.1f" % json.load(open(sys.argv[1]))["samples_per_s"])' "$out/summary.json"
}

load_start=$(cut -d' ' -f1-3 /proc/loadavg)
echo "model,ranks,conv,precision,rep,samples_per_s" >"$csv"
for ((rep = 1; rep <= reps; rep++)); do
  for model in "${models[@]}"; do
    for ranks in 1 2; do
      for precision in "${precisions[@]}"; do
        for conv in im2col onednn; do
          r=$(run_tessera "$model" "$ranks" "$conv" "conv_${model}_np${ranks}_${conv}_${precision}_rep$rep" "$precision")
          echo "$model,$ranks,$conv,$precision,$rep,$r" | tee -a "$csv"
        done
      done
    done
  done
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
flags=$(grep -m1 -o -w 'avx2\|fma\|avx512f\|avx512_bf16\|avx512_vnni\|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ')
"$PEER_PYTHON" - "$csv" "$reps" "$steps" "$unet_steps" "$load_start" "$load_end" "$cpu" "$flags" >"$md" <<'PY'
import csv, statistics, sys
rows, reps, steps, unet_steps, load_start, load_end, cpu, flags = list(csv.DictReader(open(sys.argv[1]))), *sys.argv[2:]
print("# Convolutions: im2col + GEMM against oneDNN (run.conv)\n")
print(f"CPU: {cpu}, flags {flags.strip()}. Ranks of 1 thread. CNN {steps} steps of 128, U-Net "
      f"{unet_steps} steps of 20; median of {reps} runs, alternated. Load average at the start "
      f"{load_start}, at the end {load_end} (shared machine).\n")
groups = {}
for r in rows:
    groups.setdefault((r['model'], r['ranks'], r.get('precision', 'fp32'), r['conv']), []).append(float(r['samples_per_s']))
print("| model | ranks | precision | im2col samples/s (range) | onednn samples/s (range) | onednn / im2col | vs fp32 onednn |")
print("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
for model in ('cnn', 'unet'):
    for ranks in ('1', '2'):
        for precision in ('fp32', 'bf16'):
            a, b = groups.get((model, ranks, precision, 'im2col')), groups.get((model, ranks, precision, 'onednn'))
            if not a or not b:
                continue
            ma, mb = statistics.median(a), statistics.median(b)
            f = groups.get((model, ranks, 'fp32', 'onednn'))
            rel = f"{mb / statistics.median(f):.2f}" if f else "-"
            print(f"| {model} | {ranks} | {precision} | {ma:.0f} ({min(a):.0f}-{max(a):.0f}) | {mb:.0f} ({min(b):.0f}-{max(b):.0f}) | {mb / ma:.2f} | {rel} |")
PY
cat "$md"
