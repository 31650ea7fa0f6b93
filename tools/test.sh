#!/usr/bin/env bash
# From a fresh clone: install, build (Release, CUDA wrappers on where the toolkit exists) and run
# the whole test suite; then the suite's memory-relevant part under AddressSanitizer + UBSan
# (Debug, scope below); then each fuzz target for a bounded time (TESSERA_FUZZ_SECONDS per target,
# default 40; 0 skips them). Every build goes through the machine's compiler cache
# (tools/ccache.sh). A failing pass does not stop the later ones; the script ends with a table of
# its stages and their times and one closing line counting every test passed, failed and skipped
# (a test ctest did not run is never counted as passed), and exits non-zero if anything failed.
#   TESSERA_SKIP_SANITIZERS=1   no sanitizer build and pass
#   TESSERA_SANITIZE_ALL=1      the sanitizer pass runs every label (as the Release pass)
# shellcheck disable=SC2317  # report and ctest_pass are called indirectly (trap, stage)
set -euo pipefail
cd "$(dirname "$0")/.."

counts=$(mktemp)
stages=()
status=0
start=$SECONDS
report() {
  echo
  echo "=== tools/test.sh stages ($(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores) ==="
  printf '%-44s %8s  %s\n' stage seconds result
  local s
  for s in "${stages[@]}"; do
    IFS='|' read -r name secs rc <<<"$s"
    printf '%-44s %8d  %s\n' "$name" "$secs" "$([[ $rc == 0 ]] && echo ok || echo "FAILED (exit $rc)")"
  done
  printf '%-44s %8d\n' "all" "$((SECONDS - start))"
  awk '{p += $2; f += $3; s += $4} END {printf "total: %d passed, %d failed, %d skipped\n", p, f, s}' "$counts"
  rm -f "$counts"
}
trap report EXIT
# stage NAME COMMAND...: runs and times one stage; a failure is remembered, not fatal.
stage() {
  local name=$1 t0=$SECONDS rc=0
  shift
  "$@" || rc=$?
  stages+=("$name|$((SECONDS - t0))|$rc")
  ((rc == 0)) || status=1
  return "$rc"
}
# ctest_pass NAME BUILD_DIR [ctest args]: one ctest pass at -j 2, summarised by tools/ctest_report.py.
ctest_pass() {
  local name=$1 dir=$2 rc=0
  shift 2
  ctest --test-dir "$dir" --output-on-failure --timeout 900 -j 2 --output-junit "$PWD/$dir/ctest-junit.xml" "$@" || rc=$?
  python3 tools/ctest_report.py "$dir" "$dir/ctest-junit.xml" "$name" --counts "$counts" || rc=1
  return "$rc"
}

# A build that fails ends the script: nothing after it could run.
stage "set-up and Release build" tools/setup.sh build -DTESSERA_WERROR=ON || exit 1
# In CI every test must run: the Slurm and cluster tests fail on a reason to skip (no root, no
# network namespaces, a daemon that does not start), and a googletest case that skips fails unless
# it is listed as hardware-dependent (tests/CMakeLists.txt, docs/testing.md).
if [[ ${CI:-} == true ]]; then export TESSERA_REQUIRE_SLURM=1 TESSERA_REQUIRE_CLUSTER=1 TESSERA_REQUIRE_TESTS=1; fi
if [[ ! -f data/fashion-mnist.h5 ]]; then
  stage "data (Fashion-MNIST)" build/tessera prepare fashion-mnist --out data/fashion-mnist.h5 || exit 1
fi
stage "Release pass (ctest -j 2)" ctest_pass release build || true

if [[ ${TESSERA_SKIP_SANITIZERS:-0} != 1 ]]; then
  # Debug (assertions on) at -O1, ASan's recommended level: its checks survive, and the training
  # loops of the integration tests run several times faster than at -O0. Line tables only (-g1):
  # every report still names each frame's function, file and line, and a translation unit compiles
  # in less than half the time of -g (src/nn/gpt.cpp: 53 s against 124 s). No CUDA wrappers.
  stage "sanitizer build (ASan + UBSan, Debug -O1)" \
    env TESSERA_BUILD_TYPE=Debug TESSERA_CUDA=OFF tools/setup.sh build-asan -DTESSERA_SANITIZE=ON -DTESSERA_WERROR=ON \
    "-DCMAKE_CXX_FLAGS_DEBUG=-g1 -O1" "-DCMAKE_C_FLAGS_DEBUG=-g1 -O1" || exit 1
  # The scope: the sanitizers look for memory errors and undefined behaviour in Tessera's own code
  # paths, so the pass runs the labels that reach them: unit, mpi (the MPI tests on 1, 2 and 4
  # ranks and the integration tests, which run the whole program) and fuzz (every fuzz seed and
  # every input that ever was a finding). It leaves out, unless TESSERA_SANITIZE_ALL=1:
  #   cluster  launchers, placement, Slurm across nodes, node failures: what mpirun, srun and Slurm
  #            do with Tessera's processes, through code paths the single-node tests run;
  #   damage   170 whole commands on damaged files: the readers that the fuzz replays and
  #            test_robustness run here, and that the fuzzing stage runs under ASan + UBSan;
  #   slurm, tools, lint  shell and Python (job scripts, analysis tools, shellcheck), which run
  #            Tessera only as the integration tests do;
  #   layouts  context parallelism's layout matrix (test_context_layouts: 18 training runs whose
  #            point is equal losses); the same ring, halo and all-to-all code runs under the
  #            sanitizers in test_context_ring, test_context_messages and test_context_runs.
  # Leak checking is off: Open MPI and HDF5 keep allocations alive until exit by design.
  exclude=()
  [[ ${TESSERA_SANITIZE_ALL:-0} == 1 ]] || exclude=(-LE "cluster|damage|slurm|tools|lint|layouts")
  export ASAN_OPTIONS=detect_leaks=0
  stage "sanitizer pass (ctest -j 2)" ctest_pass sanitizer build-asan "${exclude[@]}" || true
fi

# The fuzz targets from their seeds and regression cases; a finding fails CI and is kept under
# build-fuzz/findings/ (docs/robustness.md).
fuzz_seconds=${TESSERA_FUZZ_SECONDS:-40}
if ((fuzz_seconds > 0)); then
  rc=0
  stage "fuzzing (clang build + 3 x ${fuzz_seconds} s)" tests/fuzz/run_fuzzers.sh "$fuzz_seconds" || rc=$?
  echo "fuzzing $((rc == 0 ? 1 : 0)) $((rc == 0 ? 0 : 1)) 0" >>"$counts"
fi
exit "$status"
