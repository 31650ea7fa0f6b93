#!/usr/bin/env bash
# Issue 17's sitting: tokens/s of Tessera's GPT (inputs/kjv_gpt.toml: 4 layers, 4 heads, width
# 256, context 128, batch 16) on 2 ranks in fp32 and bf16 with run.gemm = openblas and onednn,
# and on 1 rank whose oneDNN products use both cores (config mpi1_onednn), in bf16 also with the
# gradients summed in bf16 on the wire (mpi2_onednn_bf16_reduce: comm.reduce_dtype = "bf16"),
# against the PyTorch peer ../shared/peers/gpt_mini.py on 2 threads in fp32 and with --amp bf16
# (torch.autocast), each eager, with --sdpa and, where torch.compile works in the peer's Python,
# with --sdpa --compile. The runs alternate REPS times in one sitting, so that they share the
# machine's noise; the table has medians.
#
# Tessera: tools/mpirun.sh -n 2 build/tessera train inputs/kjv_gpt.toml --set train.steps=STEPS
#   --set train.precision=P --set run.gemm=G (OPENBLAS_NUM_THREADS=1 per rank; no evaluation,
#   checkpoint or warm-up: see run_tessera_gpt in lib.sh); tokens/s = context x the median
#   samples/s after step 10. The run log's "gemm:" line (what each library runs) goes in the CSV.
# Peer: gpt_mini.py --threads 2 --steps STEPS --warm 10 [--amp bf16] [--sdpa] [--compile];
#   tokens/s is its SUMMARY median-step figure. The peer's Python is .venv (bench/peer_venv.sh, a
#   current torch from PyPI with MKL and oneDNN), else Debian's python3-torch.
# Yardsticks first: build/bench/peak_flops --reps 3 (2-core fp32 FMA peak and, where the CPU has
# AVX512-BF16, the 2-core vdpbf16ps peak) into bench/results/peak_flops_onednn[_LABEL].csv.
# Writes bench/results/gpt_onednn[_LABEL].csv (who,config,precision,rep,tokens_per_s,note) and
# bench/results/gpt_onednn[_LABEL].md (CPU model and ISA flags, load, medians, ratios to the peer's best
# in the same precision, GFLOP/s at 6N + 12LTC FLOPs per token and the fraction of the peak of
# that precision).
#
# Usage: bench/gpt_onednn.sh   (needs build/tessera, data/kjv.txt and data/corpus.h5 from
#        tools/prepare_corpus.sh)
# env: REPS (3), STEPS (40), COMPILE (auto: try a short --compile run first; 0: never; 1: always),
#      BUILD_DIR (build), PEERS_DIR, LABEL (names the files gpt_onednn_LABEL.*), TABLE_ONLY=1 (rewrite the .md from the existing .csv and
#      peak_flops_onednn[_LABEL].csv; LOADS="start / end" then says the sitting's load averages)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$here/lib.sh"
top=$(cd "$here/.." && pwd)
cd "$top"

reps=${REPS:-3}
steps=${STEPS:-40}
build=${BUILD_DIR:-build}
results=bench/results
logs=$results/logs
csv=$results/gpt_onednn${LABEL:+_$LABEL}.csv
md=$results/gpt_onednn${LABEL:+_$LABEL}.md
peak=$results/peak_flops_onednn${LABEL:+_$LABEL}.csv
check_gpt_sitting "$reps" "$steps"
[[ -x "$build/tessera" ]] || die "$build/tessera not found" "tools/setup.sh"
[[ -x "$build/bench/peak_flops" ]] || die "$build/bench/peak_flops not found" "cmake --build $build --target peak_flops"
[[ "${LABEL:-x}" =~ ^[A-Za-z0-9_.-]+$ ]] || die "LABEL='$LABEL': letters, digits, '.', '_' and '-' only"
[[ -f data/kjv.txt && -f data/corpus.h5 ]] || die "data/kjv.txt or data/corpus.h5 missing" "tools/prepare_corpus.sh"
peers=$(peers_dir)
mkdir -p "$logs"
if have_pypi_peer; then python=$PYPI_PEER_PYTHON; else python=$PEER_PYTHON; fi

# \brief Run the peer once with extra arguments; print its median-step tokens/s.
# \param $1 log; the rest: gpt_mini.py arguments beyond the common ones
run_peer() {
  local log=$1
  shift
  if ! env -u OPENBLAS_CORETYPE OPENBLAS_NUM_THREADS=2 "$python" "$peers/gpt_mini.py" --threads 2 \
      --data data/kjv.txt --steps "$steps" --warm 10 "$@" >"$log" 2>&1; then
    echo "error: peer $* failed; see $log" >&2
    tail -n 5 "$log" >&2
    return 1
  fi
  sed -n 's/.*tokens\/s median-step=\([0-9.]*\).*/\1/p' "$log"
}

if [[ ${TABLE_ONLY:-0} == 1 ]]; then
  [[ -f $csv && -f $peak ]] || die "TABLE_ONLY=1: no $csv or $peak"
  COMPILE=0
fi
case ${COMPILE:-auto} in
  auto)
    if run_peer "$logs/gpt_onednn_compile_probe.log" --amp bf16 --sdpa --compile >/dev/null 2>&1; then
      compile=1
    else
      compile=0
      echo "note: torch.compile fails in $python (see $logs/gpt_onednn_compile_probe.log); no --compile runs"
    fi
    ;;
  0 | 1) compile=$COMPILE ;;
  *) die "COMPILE='$COMPILE': expected auto, 0 or 1" ;;
esac

peer_configs=("eager" "sdpa")
((compile)) && peer_configs+=("sdpa_compile")
if [[ ${TABLE_ONLY:-0} != 1 ]]; then
  load_start=$(cut -d' ' -f1-3 /proc/loadavg)
  echo "== peak_flops"
  env -u OPENBLAS_CORETYPE "$build/bench/peak_flops" --reps 3 --csv "$peak" >"$logs/peak_flops_onednn${LABEL:+_$LABEL}.log"
  echo "who,config,precision,rep,tokens_per_s,note" >"$csv"
  for ((rep = 1; rep <= reps; rep++)); do
    for precision in fp32 bf16; do
      for gemm in openblas onednn; do
        tag=gpt_onednn_${precision}_${gemm}_rep$rep
        r=$(run_tessera_gpt 2 1 unset "$tag" "$steps" --set "train.precision=\"$precision\"" --set "run.gemm=\"$gemm\"")
        line=$(grep -m1 -o 'gemm: .*' "$logs/$tag.log" | sed 's/; run.gemm.*//' | tr -d '",')
        echo "tessera,mpi2_$gemm,$precision,$rep,$r,\"$line\"" | tee -a "$csv"
      done
      if [[ $precision == bf16 ]]; then  # the gradients' sums travel in bf16 as well (half the bytes)
        tag=gpt_onednn_bf16_onednn_wire_rep$rep
        r=$(run_tessera_gpt 2 1 unset "$tag" "$steps" --set 'train.precision="bf16"' --set 'run.gemm="onednn"' \
          --set 'comm.reduce_dtype="bf16"')
        echo "tessera,mpi2_onednn_bf16_reduce,bf16,$rep,$r,\"comm.reduce_dtype = bf16\"" | tee -a "$csv"
      fi
      # One rank whose oneDNN products use both cores (run.blas_threads = cores / ranks = 2).
      tag=gpt_onednn_${precision}_onednn_1rank_rep$rep
      r=$(run_tessera_gpt 1 2 unset "$tag" "$steps" --set "train.precision=\"$precision\"" --set 'run.gemm="onednn"')
      echo "tessera,mpi1_onednn,$precision,$rep,$r,\"1 rank, 2 threads\"" | tee -a "$csv"
      for config in "${peer_configs[@]}"; do
        args=()
        [[ $precision == bf16 ]] && args+=(--amp bf16)
        [[ $config == sdpa* ]] && args+=(--sdpa)
        [[ $config == *compile ]] && args+=(--compile)
        r=$(run_peer "$logs/gpt_onednn_peer_${precision}_${config}_rep$rep.log" "${args[@]}")
        echo "torch,threads2_$config,$precision,$rep,$r,\"${args[*]}\"" | tee -a "$csv"
      done
    done
  done
  load_end=$(cut -d' ' -f1-3 /proc/loadavg)
else
  load_start=${LOADS%% / *} load_end=${LOADS##* / }
fi

cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
family=$(sed -n 's/^cpu family[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
model=$(sed -n 's/^model[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|avx512f|avx512_bf16|avx512_vnni|amx_bf16|amx_tile)$' | tr '\n' ' ')
version=$("$python" -c 'import torch; print(torch.__version__)')
"$PEER_PYTHON" - "$csv" "$peak" "$steps" "$reps" "$load_start" "$load_end" "$cpu (family $family, model $model; $(nproc) cores seen)" \
  "$flags" "$version" >"$md" <<'PY'
import csv, statistics, sys
rows, peak_rows, steps, reps, load_start, load_end, cpu, flags, version = (list(csv.DictReader(open(sys.argv[1]))),
                                                                      list(csv.DictReader(open(sys.argv[2]))), *sys.argv[3:])
L, T, C, V = 4, 128, 256, 256
N = 12 * L * C * C + 13 * L * C + 2 * C + V * C   # non-embedding parameters as the peer counts them
flops = 6 * N + 12 * L * T * C
def peak(what):
    one = [float(p['gflops']) for p in peak_rows if p['what'] == what and p['threads'] == '1']
    two = [float(p['gflops']) for p in peak_rows if p['what'] == what and p['threads'] == '2']
    return (2 * one[0], one[0], two[0]) if one and two else None
fma = max((peak(w) for w in ('fma_avx512', 'fma_avx2') if peak(w)), key=lambda x: x[0])
bf16 = peak('dpbf16_avx512')
yard = {'fp32': (fma[0], 'fp32 FMA'), 'bf16': (bf16[0], 'vdpbf16ps') if bf16 else (fma[0], 'fp32 FMA: no AVX512-BF16')}
print("# GPT (4 layers, 4 heads, width 256, context 128, batch 16): Tessera with OpenBLAS or oneDNN vs torch\n")
print(f"CPU: {cpu}; flags: {flags.strip()}. Torch {version} on 2 threads; Tessera on 2 ranks of 1 thread. "
      f"{steps} steps per run (the first 10 not timed), median of {reps} runs, alternated. "
      f"Load average at the start {load_start}, at the end {load_end} (the machine is shared: noisy). "
      f"{flops / 1e6:.2f} MFLOP per token (6N + 12LTC). Peaks (bench/peak_flops, register-resident chains): "
      f"fp32 FMA {fma[1]:.0f} GFLOP/s on 1 core ({fma[2]:.0f} with 2 threads)"
      + (f", bf16 vdpbf16ps {bf16[1]:.0f} on 1 core ({bf16[2]:.0f} with 2 threads)" if bf16 else "")
      + "; the 2-core peak is taken as twice the 1-core figure (a 2-thread figure taken while other "
      "programs load the machine can come out near the 1-core one).\n")
med = {}
for r in rows:
    med.setdefault((r['precision'], r['who'], r['config']), []).append(r)
for precision in ('fp32', 'bf16'):
    peer = max((statistics.median(float(r['tokens_per_s']) for r in v), cfg)
               for (p, who, cfg), v in med.items() if p == precision and who == 'torch')
    base = statistics.median(float(r['tokens_per_s']) for r in med[(precision, 'tessera', 'mpi2_openblas')])
    # Per repetition: the run over torch's best run of the same repetition (drifting load cancels).
    best = {}
    for r in rows:
        if r['precision'] == precision and r['who'] == 'torch':
            best[r['rep']] = max(best.get(r['rep'], 0.0), float(r['tokens_per_s']))
    print(f"## {precision}: torch's best is {peer[1]} at {peer[0]:.0f} tokens/s\n")
    print(f"| who | config | runs | tokens/s (median) | range | vs torch's best | same-round ratio (median) | vs Tessera openblas | GFLOP/s | of the 2-core {yard[precision][1]} peak | what ran |")
    print("| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for (p, who, cfg), v in med.items():
        if p != precision:
            continue
        tps = statistics.median(float(r['tokens_per_s']) for r in v)
        paired = statistics.median(float(r['tokens_per_s']) / best[r['rep']] for r in v)
        gf = tps * flops * 1e-9
        xs = [float(r['tokens_per_s']) for r in v]
        print(f"| {who} | {cfg} | {len(v)} | {tps:.0f} | {min(xs):.0f}-{max(xs):.0f} | {tps / peer[0]:.2f} | {paired:.2f} | {tps / base:.2f} | {gf:.1f} | "
              f"{gf / yard[precision][0]:.1%} | {v[0]['note']} |")
    print()
PY
echo "wrote $csv and $md"
