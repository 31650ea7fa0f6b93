#!/usr/bin/env bash
# Tokens/s of Tessera's GPT (inputs/kjv_gpt.toml) on 2 ranks in fp32, bf16 and fp16, alternated
# REPS times in one sitting, with the GEMM path each run logged ("precision: bf16 matrix products
# (cblas_sbgemm)" or "(emulated ...)"). With OPENBLAS_DIR set, the runs load the libopenblas.so.0
# found there instead of the system's (LD_LIBRARY_PATH), e.g. an OpenBLAS built with
# BUILD_BFLOAT16=1, whose cblas_sbgemm Tessera then finds at run time.
# Writes bench/results/gpt_precision_<LABEL>.csv (label,precision,rep,tokens_per_s,gemm_path,
# loss_at_end) and .md (medians, ratio to fp32).
# env: REPS (3), STEPS (40), LABEL (system), OPENBLAS_DIR, CORETYPE (unset), PRECISIONS
#      ("fp32 bf16 fp16"), BUILD_DIR (build)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$here/lib.sh"
top=$(cd "$here/.." && pwd)
cd "$top"

reps=${REPS:-3}
steps=${STEPS:-40}
label=${LABEL:-system}
coretype=${CORETYPE:-unset}
read -r -a precisions <<<"${PRECISIONS:-fp32 bf16 fp16}"
csv=bench/results/gpt_precision_$label.csv
md=bench/results/gpt_precision_$label.md
check_gpt_sitting "$reps" "$steps"
[[ "$label" =~ ^[A-Za-z0-9_.-]+$ ]] || die "LABEL='$label': letters, digits, '.', '_' and '-' only"
[[ -x "${BUILD_DIR:-build}/tessera" ]] || die "${BUILD_DIR:-build}/tessera not found" "tools/setup.sh"
[[ -f data/corpus.h5 ]] || die "data/corpus.h5 missing" "tools/prepare_corpus.sh"
if [[ -n "${OPENBLAS_DIR:-}" ]]; then
  [[ -e "$OPENBLAS_DIR/libopenblas.so.0" ]] || die "no libopenblas.so.0 in OPENBLAS_DIR='$OPENBLAS_DIR'"
  export LD_LIBRARY_PATH="$OPENBLAS_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

echo "label,precision,rep,tokens_per_s,gemm_path,loss_at_end" >"$csv"
for ((rep = 1; rep <= reps; rep++)); do
  for p in "${precisions[@]}"; do
    tag=gpt_precision_${label}_${p}_rep$rep
    r=$(run_tessera_gpt 2 1 "$coretype" "$tag" "$steps" --set "train.precision=\"$p\"")
    path=$(sed -n 's/.*precision: [a-z0-9]* matrix products (\(.*\)), outputs stored.*/\1/p' "bench/results/tmp/$tag/log.txt")
    loss=$(sed -n 's/.*final train loss \([0-9.]*\).*/\1/p' "bench/results/tmp/$tag/log.txt")
    echo "$label,$p,$rep,$r,\"${path:-cblas_sgemm}\",$loss" | tee -a "$csv"
  done
done

"$PEER_PYTHON" - "$csv" "$label" "$steps" "${OPENBLAS_DIR:-<system>}" >"$md" <<'PY'
import csv, statistics, sys
rows, label, steps, ob = list(csv.DictReader(open(sys.argv[1]))), *sys.argv[2:]
med = {}
for r in rows:
    med.setdefault(r['precision'], []).append(r)
base = statistics.median(float(r['tokens_per_s']) for r in med['fp32']) if 'fp32' in med else None
print(f"# GPT precision sitting '{label}': tokens/s on 2 ranks\n")
print(f"OpenBLAS from {ob}; {steps} steps per run, the first 10 untimed; medians.\n")
print("| precision | runs | tokens/s | vs fp32 | GEMM path | train loss at the last step |")
print("| --- | ---: | ---: | ---: | --- | ---: |")
for p, rs in med.items():
    tps = statistics.median(float(r['tokens_per_s']) for r in rs)
    ratio = f"{tps / base:.2f}" if base else "-"
    print(f"| {p} | {len(rs)} | {tps:.0f} | {ratio} | {rs[0]['gemm_path']} | {rs[0]['loss_at_end']} |")
PY
echo "wrote $csv and $md"
