#!/usr/bin/env bash
# Tokens/s of Tessera's GPT (inputs/kjv_gpt.toml) from one or more builds (say Debian's Serial
# Kokkos 3.4 and an OpenMP Kokkos 4), each as 1 rank with 2 threads and as 2 ranks with 1 thread
# each, alternated REPS times in one sitting. "Threads" are OpenBLAS's (OPENBLAS_NUM_THREADS) and,
# in an OpenMP build, Kokkos's too (OMP_NUM_THREADS); a Serial build runs its own kernels on one.
# Each run under every OMP_WAIT_POLICY of POLICIES: OpenMP threads that spin between kernels take
# the cores from OpenBLAS's threads (a Serial build ignores the setting).
# Writes bench/results/gpt_threads.csv (build,ranks,threads,omp_wait_policy,rep,tokens_per_s) and
# .md (medians).
#
# Usage: BUILDS="serial=build openmp=/path/to/build-omp" bench/gpt_threads.sh
# env: BUILDS ("serial=build"; label=build-dir[@dir-of-another-libopenblas.so.0], e.g.
#      openmp-ob=build-omp@/usr/lib/x86_64-linux-gnu/openblas-openmp for OpenBLAS's OpenMP build), REPS (3), STEPS (40), CORETYPE (unset),
#      POLICIES ("passive active")
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$here/lib.sh"
top=$(cd "$here/.." && pwd)
cd "$top"

reps=${REPS:-3}
steps=${STEPS:-40}
coretype=${CORETYPE:-unset}
read -r -a builds <<<"${BUILDS:-serial=build}"
read -r -a policies <<<"${POLICIES:-passive active}"
csv=bench/results/gpt_threads.csv
md=bench/results/gpt_threads.md
check_gpt_sitting "$reps" "$steps"
[[ -f data/corpus.h5 ]] || die "data/corpus.h5 missing" "tools/prepare_corpus.sh"
for b in "${builds[@]}"; do
  [[ "$b" == *=* ]] || die "BUILDS entry '$b' is not label=build-dir[@openblas-dir]"
  dir=${b#*=} dir=${dir%%@*}
  [[ -x "$dir/tessera" ]] || die "$dir/tessera not found (BUILDS entry '$b')"
  [[ "$b" != *@* || -e "${b#*@}/libopenblas.so.0" ]] || die "no libopenblas.so.0 in ${b#*@} (BUILDS entry '$b')"
done

echo "build,ranks,threads,omp_wait_policy,rep,tokens_per_s" >"$csv"
for ((rep = 1; rep <= reps; rep++)); do
  for b in "${builds[@]}"; do
    label=${b%%=*} dir=${b#*=} libs=
    [[ "$dir" != *@* ]] || libs=${dir#*@} dir=${dir%%@*}
    for layout in "1 2" "2 1"; do
      read -r ranks threads <<<"$layout"
      for policy in "${policies[@]}"; do
        tag=gpt_threads_${label}_${ranks}x${threads}_${policy}_rep$rep
        r=$(LD_LIBRARY_PATH=${libs:+$libs:}${LD_LIBRARY_PATH:-} OMP_NUM_THREADS=$threads \
          OMP_PROC_BIND=false OMP_WAIT_POLICY=$policy BUILD_DIR=$dir \
          run_tessera_gpt "$ranks" "$threads" "$coretype" "$tag" "$steps")
        echo "$label,$ranks,$threads,$policy,$rep,$r" | tee -a "$csv"
      done
    done
  done
done

"$PEER_PYTHON" - "$csv" "$steps" "$coretype" "${builds[*]}" >"$md" <<'PY'
import csv, statistics, sys
rows, steps, coretype, builds = list(csv.DictReader(open(sys.argv[1]))), *sys.argv[2:]
med = {}
for r in rows:
    med.setdefault((r['build'], r['ranks'], r['threads'], r['omp_wait_policy']), []).append(float(r['tokens_per_s']))
print("# GPT tokens/s by Kokkos build and ranks x threads\n")
print(f"Builds: {builds}; OPENBLAS_CORETYPE {coretype}; {steps} steps per run, the first 10 untimed; medians.\n")
print("| build | ranks x threads | OMP_WAIT_POLICY | runs | tokens/s |")
print("| --- | --- | --- | ---: | ---: |")
for (b, n, t, p), v in med.items():
    print(f"| {b} | {n} x {t} | {p} | {len(v)} | {statistics.median(v):.0f} |")
PY
echo "wrote $csv and $md"
