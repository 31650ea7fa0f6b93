#!/usr/bin/env bash
# A/B of two Tessera builds on the GPT of issue 17 (inputs/kjv_gpt.toml: 4 layers, 4 heads,
# width 256, context 128, batch 16) in bf16 through oneDNN on 2 ranks: tokens/s (context x the
# median samples/s after step 10, as bench/gpt_onednn.sh) and summary.json's
# memory.act_peak_bytes, the two builds alternating REPS times in one sitting so that they share
# the machine's noise. Made for the bf16 operands kept in bf16 (docs/performance.md, "oneDNN for
# bf16 and fp32"): A the build before, B the build after.
#
# Usage: A=<build dir> B=<build dir> bench/gpt_bf16_ab.sh   (needs data/corpus.h5 from
#        tools/prepare_corpus.sh). One build against itself with the packing path on one side:
#        A=build B=build A_ENV=TESSERA_TEST_PACK_BF16=1 bench/gpt_bf16_ab.sh
# env: REPS (3), STEPS (40), LABEL (names the files gpt_bf16_ab_LABEL.*), EXTRA (more --set
#      arguments for both, e.g. "--set train.recompute=true"), A_ENV / B_ENV (one NAME=VALUE
#      exported for that side's runs).
# Writes bench/results/gpt_bf16_ab[_LABEL].csv (build,rep,tokens_per_s,act_peak_bytes) and prints
# the medians with the load averages at start and end.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$here/lib.sh"
top=$(cd "$here/.." && pwd)
cd "$top"

reps=${REPS:-3}
steps=${STEPS:-40}
check_gpt_sitting "$reps" "$steps"
[[ -n "${A:-}" && -n "${B:-}" ]] || die "A and B must name the two build directories"
for b in "$A" "$B"; do [[ -x "$b/tessera" ]] || die "$b/tessera not found"; done
[[ "${LABEL:-x}" =~ ^[A-Za-z0-9_.-]+$ ]] || die "LABEL='$LABEL': letters, digits, '.', '_' and '-' only"
[[ -f data/corpus.h5 ]] || die "data/corpus.h5 missing" "tools/prepare_corpus.sh"
csv=bench/results/gpt_bf16_ab${LABEL:+_$LABEL}.csv
mkdir -p bench/results
echo "build,rep,tokens_per_s,act_peak_bytes" >"$csv"
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
read -r -a extra <<<"${EXTRA:-}"
for rep in $(seq 1 "$reps"); do
  for side in A B; do
    dir=${!side}
    tag=gpt_bf16_ab${LABEL:+_$LABEL}_${side}_$rep
    side_env=${side}_ENV
    tps=$(
      [[ -n ${!side_env:-} ]] && export "${!side_env}"
      BUILD_DIR=$dir run_tessera_gpt 2 1 unset "$tag" "$steps" --set 'train.precision="bf16"' \
        --set 'run.gemm="onednn"' "${extra[@]}"
    )
    act=$(sed -n 's/.*"act_peak_bytes": *\([0-9]*\).*/\1/p' "bench/results/tmp/$tag/summary.json" | head -n 1)
    echo "$side,$rep,$tps,$act" >>"$csv"
    echo "$side rep $rep: $tps tokens/s, act_peak_bytes $act"
  done
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
for side in A B; do
  mapfile -t t < <(awk -F, -v s="$side" '$1 == s {print $3}' "$csv")
  side_env=${side}_ENV
  echo "$side (${!side} ${!side_env:-}): median $(median "${t[@]}") tokens/s over ${#t[@]} runs ($(IFS=' '; echo "${t[*]}"))"
done
echo "load average at start: $load_start; at end: $load_end"
