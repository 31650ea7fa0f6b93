#!/usr/bin/env bash
# Builds the fuzz targets with clang and libFuzzer (TESSERA_FUZZ=ON) and runs each for a bounded
# time, starting from its seeds and regression cases (docs/robustness.md). Fails when a target
# finds a crash, a sanitizer report, a finding of its own, a slow input or an out-of-memory; the
# reproducers are kept under BUILD/findings/<target>/, listed, and grouped by report (triage.sh).
#   tests/fuzz/run_fuzzers.sh [SECONDS_PER_TARGET [TARGET...]]    (default: 40 s; deck dataset checkpoint)
# Environment: TESSERA_FUZZ_BUILD (build-fuzz), TESSERA_FUZZ_TIMEOUT (seconds one input may take:
# 3 for a deck, 10 for an HDF5 file), TESSERA_FUZZ_RSS_MB (2048), TESSERA_FUZZ_JOBS (parallel
# fuzzing processes, 1).
# Each target runs in libFuzzer's fork mode, ignoring what it finds so that one known bug does
# not end the run: every finding of the time budget is kept.
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${1:-40}
shift || true
targets=("$@")
((${#targets[@]})) || targets=(deck dataset checkpoint)
build=${TESSERA_FUZZ_BUILD:-build-fuzz}

source tools/ccache.sh
# Line tables only (-g1): a report's frames keep their function, file and line, and the build
# compiles in about half the time of -g.
CC=clang CXX=clang++ cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTESSERA_FUZZ=ON \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" \
  -DTESSERA_ENABLE_TESTS=OFF -DTESSERA_ENABLE_CUDA=OFF "${ccache_launcher[@]}" >/dev/null
cmake --build "$build" -j "$(nproc)" --target "${targets[@]/#/fuzz_}"

# Open MPI and HDF5 keep allocations until exit: no leak checking. A huge allocation returns
# null (HDF5 then fails as it would in the real program) instead of ending the input.
export ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1
export UBSAN_OPTIONS=print_stacktrace=1
# libFuzzer's per-malloc limit (-malloc_limit_mb, by default the RSS limit) is lifted: its hook
# would take a damaged file's huge allocation inside the metadata probe's child (io/h5_probe,
# which limits its own address space) for the target's; -rss_limit_mb still bounds the target.
# A looping file's metadata probe (io/h5_probe) gives up after 2 s: 4 opens fit the 10 s per input.
export TESSERA_PROBE_SECONDS=2
export OPENBLAS_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

status=0
summary=()
for t in "${targets[@]}"; do
  corpus=$build/corpus/$t findings=$build/findings/$t log=$build/fuzz_$t.log
  mkdir -p "$corpus" "$findings" tests/fuzz/regressions/"$t"
  dict=tests/fuzz/hdf5.dict max_len=65536 timeout=10
  [[ $t == deck ]] && dict=tests/fuzz/deck.dict max_len=4096 timeout=3
  echo "fuzz_$t: $seconds s from tests/fuzz/seeds/$t and tests/fuzz/regressions/$t (log: $log)"
  rc=0
  "$build/tests/fuzz/fuzz_$t" "$corpus" "tests/fuzz/seeds/$t" "tests/fuzz/regressions/$t" \
    -fork="${TESSERA_FUZZ_JOBS:-1}" -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 \
    -max_total_time="$seconds" -timeout="${TESSERA_FUZZ_TIMEOUT:-$timeout}" \
    -rss_limit_mb="${TESSERA_FUZZ_RSS_MB:-2048}" -malloc_limit_mb=1048576 -max_len="$max_len" -dict="$dict" \
    -artifact_prefix="$findings/" -print_final_stats=1 >"$log" 2>&1 || rc=$?
  # The last status line of the fork mode: "#<executions>: cov: ... crash/timeout/oom ...".
  execs=$(grep -Eo '^#[0-9]+' "$log" | tail -1 | tr -d '#' || true)
  found=$(find "$findings" -type f | wc -l)
  summary+=("fuzz_$t: ${execs:-0} executions in $seconds s, $found finding(s) in $findings/ (exit $rc)")
  if ((found > 0 || rc != 0)); then
    status=1
    echo "fuzz_$t: FOUND $found input(s) that break the promise (exit $rc); reproduce one with"
    echo "  $build/tests/fuzz/fuzz_$t FILE   or   build/tests/fuzz/fuzz_replay_$t FILE"
    find "$findings" -type f | sed 's/^/  /'
    echo "fuzz_$t: the findings grouped by report (tests/fuzz/triage.sh):"
    tests/fuzz/triage.sh "$t" || true
  fi
done
printf '%s\n' "${summary[@]}"
exit "$status"
