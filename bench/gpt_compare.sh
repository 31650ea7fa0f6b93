#!/usr/bin/env bash
# Side-by-side training throughput of Tessera's GPT and the fixed PyTorch peer gpt_mini.py (4 blocks,
# 4 heads, width 256, context 128, byte vocabulary, batch 16, AdamW) on the King James Bible, in one
# sitting, alternating the runs so that they share the machine's noise.
#
# For each coretype (OPENBLAS_CORETYPE=Haswell and unset):
#   - build/bench/peak_flops writes bench/results/peak_flops_<coretype>.csv (the MFU yardsticks);
# then REPS times, for each coretype in turn:
#   - the Debian peer (python3-torch 1.13 over OpenBLAS): OPENBLAS_NUM_THREADS=2 gpt_mini.py
#     --threads 1 --steps STEPS (its best configuration); tokens/s is its SUMMARY median-step figure;
#   - the PyPI peer (a current torch with MKL, bench/peer_venv.sh), where .venv has it:
#     gpt_mini.py --threads 2 (its best: 1 thread runs at half the speed); OPENBLAS_CORETYPE does
#     not reach MKL, so it is the same program under both coretypes;
#   - tessera on 1 rank (OPENBLAS_NUM_THREADS=2) and on 2 ranks (1 each):
#       tools/mpirun.sh -n N build/tessera train inputs/kjv_gpt.toml --set train.steps=STEPS
#         --set train.log_every=5 (no evaluation, no checkpoint, no warm-up: the peer has none)
#     tokens/s = context x the median samples_per_s of metrics.csv's rows after the first 10 steps.
# Writes bench/results/gpt_compare.csv (who,config,coretype,rep,tokens_per_s) and
# bench/results/gpt_compare.md (medians, ratio to the faster peer under the same coretype and to the
# Debian peer, GFLOP/s and MFU
# counting 6N + 12LTC FLOPs per token as the peer and nanoGPT do).
#
# Usage: bench/gpt_compare.sh   (needs build/tessera, build/bench/peak_flops, data/kjv.txt and
#        data/corpus.h5 from tools/prepare_corpus.sh)
# env: REPS (3), STEPS (40), CORETYPES ("Haswell unset"), BUILD_DIR (build), PEERS_DIR,
#      PYPI_PEER (auto: run it where .venv has torch; 0: never; 1: required)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$here/lib.sh"
top=$(cd "$here/.." && pwd)
cd "$top"

reps=${REPS:-3}
steps=${STEPS:-40}
read -r -a coretypes <<<"${CORETYPES:-Haswell unset}"
build=${BUILD_DIR:-build}
results=bench/results
logs=$results/logs
runs=$results/tmp
csv=$results/gpt_compare.csv
md=$results/gpt_compare.md

check_gpt_sitting "$reps" "$steps"
[[ -x "$build/tessera" ]] || die "$build/tessera not found" "cmake -S . -B $build && cmake --build $build"
[[ -x "$build/bench/peak_flops" ]] || die "$build/bench/peak_flops not found" "cmake --build $build --target peak_flops"
[[ -f data/kjv.txt && -f data/corpus.h5 ]] || die "data/kjv.txt or data/corpus.h5 missing" "tools/prepare_corpus.sh"
peers=$(peers_dir)
mkdir -p "$logs" "$runs"

case ${PYPI_PEER:-auto} in
  auto) if have_pypi_peer; then pypi=1; else pypi=0; fi ;;
  0) pypi=0 ;;
  1) have_pypi_peer || die "no torch in $PYPI_PEER_PYTHON" "bench/peer_venv.sh"; pypi=1 ;;
  *) die "PYPI_PEER='${PYPI_PEER}': expected auto, 0 or 1" ;;
esac

# \brief Run a peer once; print its median-step tokens/s.
# \param $1 coretype, $2 log, $3 python, $4 torch threads, $5 OpenBLAS threads
run_peer_gpt() {
  local coretype=$1 log=$2 python=$3 threads=$4 ob_threads=$5
  if ! with_coretype "$coretype" env OPENBLAS_NUM_THREADS="$ob_threads" "$python" "$peers/gpt_mini.py" \
      --threads "$threads" --data data/kjv.txt --steps "$steps" --warm 10 >"$log" 2>&1; then
    echo "error: peer failed; see $log" >&2
    tail -n 5 "$log" >&2
    return 1
  fi
  sed -n 's/.*tokens\/s median-step=\([0-9.]*\).*/\1/p' "$log"
}

load_start=$(cut -d' ' -f1-3 /proc/loadavg)
for coretype in "${coretypes[@]}"; do
  echo "== peak_flops, coretype $coretype"
  with_coretype "$coretype" "$build/bench/peak_flops" --csv "$results/peak_flops_$coretype.csv" >"$logs/peak_flops_$coretype.log"
done

echo "who,config,coretype,rep,tokens_per_s" >"$csv"
for ((rep = 1; rep <= reps; rep++)); do
  for coretype in "${coretypes[@]}"; do
    r=$(run_peer_gpt "$coretype" "$logs/gpt_peer_${coretype}_rep$rep.log" "$PEER_PYTHON" 1 2)
    echo "torch_gpt,torch1_ob2,$coretype,$rep,$r" | tee -a "$csv"
    if ((pypi)); then
      r=$(run_peer_gpt "$coretype" "$logs/gpt_pypi_peer_${coretype}_rep$rep.log" "$PYPI_PEER_PYTHON" 2 1)
      echo "torch_pypi_gpt,torch2,$coretype,$rep,$r" | tee -a "$csv"
    fi
    r=$(run_tessera_gpt 1 2 "$coretype" "tessera_gpt_mpi1_ob2_${coretype}_rep$rep" "$steps")
    echo "tessera,mpi1_ob2,$coretype,$rep,$r" | tee -a "$csv"
    r=$(run_tessera_gpt 2 1 "$coretype" "tessera_gpt_mpi2_ob1_${coretype}_rep$rep" "$steps")
    echo "tessera,mpi2_ob1,$coretype,$rep,$r" | tee -a "$csv"
  done
done

load_end=$(cut -d' ' -f1-3 /proc/loadavg)
versions=$("$PEER_PYTHON" -c 'import torch; print(torch.__version__)')
((pypi)) && versions+=" / $("$PYPI_PEER_PYTHON" -c 'import torch; print(torch.__version__)')"
"$PEER_PYTHON" - "$csv" "$results" "$steps" "$reps" "$load_start" "$load_end" "$versions" >"$md" <<'PY'
import csv, statistics, sys
rows, results, steps, reps, load_start, load_end, versions = list(csv.DictReader(open(sys.argv[1]))), *sys.argv[2:]
L, T, C, V = 4, 128, 256, 256
N = 12 * L * C * C + 13 * L * C + 2 * C + V * C   # non-embedding params as the peer counts (wte tied, wpe out)
flops = 6 * N + 12 * L * T * C
print("# GPT (4 blocks, 4 heads, width 256, context 128, batch 16): Tessera vs the PyTorch peers\n")
print(f"{steps} steps per run (the first 10 not timed), median of {reps} runs. FLOPs per token 6N + 12LTC = "
      f"{flops / 1e6:.2f} M (N = {N:,}). Load average at the start {load_start}, at the end {load_end}. "
      f"Peers: torch_gpt is Debian's python3-torch over OpenBLAS, torch_pypi_gpt a current torch from PyPI "
      f"with MKL (torch {versions}); 'vs best peer' divides by the faster of the two under the same "
      f"coretype.\n")
for coretype in dict.fromkeys(r['coretype'] for r in rows):
    peak = list(csv.DictReader(open(f"{results}/peak_flops_{coretype}.csv")))
    fma = max(float(p['gflops']) for p in peak if p['what'].startswith('fma_') and p['threads'] == '2')
    gemm = next(float(p['gflops']) for p in peak
                if p['what'] == 'sgemm_square' and p['threads'] == '2' and p['m'] == '2048')
    med = {}
    for r in rows:
        if r['coretype'] == coretype:
            med.setdefault((r['who'], r['config']), []).append(float(r['tokens_per_s']))
    debian = statistics.median(med[('torch_gpt', 'torch1_ob2')])
    peer = max(statistics.median(v) for (who, _), v in med.items() if who.startswith('torch'))
    print(f"## OPENBLAS_CORETYPE={coretype} (OpenBLAS kernels: {peak[0]['coretype']})\n")
    print(f"Yardsticks: 2-core FMA peak {fma:.0f} GFLOP/s; 2-thread SGEMM 2048^3 {gemm:.0f} GFLOP/s.\n")
    print("| who | config | runs | tokens/s | vs best peer | vs Debian peer | GFLOP/s | MFU (FMA peak) | MFU (SGEMM 2048) |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for (who, config), v in sorted(med.items()):
        tps = statistics.median(v)
        gf = tps * flops * 1e-9
        print(f"| {who} | {config} | {len(v)} | {tps:.0f} | {tps / peer:.2f} | {tps / debian:.2f} | {gf:.1f} | "
              f"{gf / fma:.1%} | {gf / gemm:.1%} |")
    print()
PY
echo "wrote $csv and $md"
