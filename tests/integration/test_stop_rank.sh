#!/usr/bin/env bash
# A rank that stalls without dying: `kill -STOP` of rank 1 of a 2-rank mpirun run. Rank 0 must end
# the run by itself (the watchdog, comm.timeout_s = 8): exit code 5, one line naming the operation,
# its flight record, and `tessera doctor` naming rank 1. The script only waits for the run; ctest's
# TIMEOUT is the safety net. Environment (tests/integration/CMakeLists.txt): TESSERA_BINARY,
# MPIEXEC, SOURCE_DIR, WORK_DIR.
set -euo pipefail

work=$WORK_DIR/stop_rank
rm -rf "$work"
mkdir -p "$work"
fail() { echo "test_stop_rank: FAIL: $*" >&2; exit 1; }

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1 OPENBLAS_NUM_THREADS=1
data=$work/fashion-mnist.h5
"$TESSERA_BINARY" prepare fashion-mnist --out "$data" >/dev/null

run=$work/run
"$MPIEXEC" -n 2 --oversubscribe --bind-to none "$TESSERA_BINARY" train "$SOURCE_DIR/tests/integration/mlp_test.toml" \
  --set data.path="$data" --set run.output_dir="$run" --set train.steps=1000000 --set train.log_every=1 \
  --set eval.every_steps=0 --set checkpoint.every_steps=0 --set comm.timeout_s=8 >"$work/out.txt" 2>&1 &
launcher=$!
stopped=
cleanup() {
  if [[ -n $stopped ]]; then kill -CONT "$stopped" 2>/dev/null || true; fi
  kill "$launcher" 2>/dev/null || true
}
trap cleanup EXIT

# Rank 1's process: the launcher's child whose environment says OMPI_COMM_WORLD_RANK=1.
rank_pid() {
  local pid
  for pid in $(pgrep -P "$launcher"); do
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1"; then
      echo "$pid"
      return
    fi
  done
}

# Wait until training runs (three logged steps), then stop rank 1 where it is. Assumes: no healthy
# wait comes near 8 s (no evaluation or checkpoint in the way); rank 1 may be stopped anywhere in a
# step, so rank 0 blocks in whichever world or data operation comes next and times out 8 s later.
until [[ $(grep -c '^train,' "$run/metrics.csv" 2>/dev/null || true) -ge 3 ]]; do
  kill -0 "$launcher" 2>/dev/null || { cat "$work/out.txt"; fail "the run ended before it was stopped"; }
  sleep 0.2
done
stopped=$(rank_pid 1)
[[ -n $stopped ]] || fail "rank 1's process not found among the children of mpirun $launcher"
kill -STOP "$stopped"
echo "test_stop_rank: stopped rank 1 (pid $stopped) after $(grep -c '^train,' "$run/metrics.csv") steps"

rc=0
wait "$launcher" || rc=$?
trap - EXIT
kill -CONT "$stopped" 2>/dev/null || true
cat "$work/out.txt"
[[ $rc -eq 5 ]] || fail "exit code $rc, expected 5"
grep -Eq 'tessera: error: rank 0: .+ #[0-9]+ of the (world|data) group .*did not complete within comm.timeout_s = 8 s' \
  "$work/out.txt" || fail "no timeout line from rank 0"
[[ -f $run/flight/rank_0.json ]] || fail "no flight record from rank 0"
/usr/bin/python3 -c "import json, sys; r = json.load(open(sys.argv[1])); assert r['reason'] == 'timeout' and r['waiting_on']" \
  "$run/flight/rank_0.json" || fail "rank 0's flight record is not a timeout record"
"$TESSERA_BINARY" doctor "$run" >"$work/doctor.txt" 2>&1 || { cat "$work/doctor.txt"; fail "tessera doctor failed"; }
cat "$work/doctor.txt"
grep -q 'rank 1' "$work/doctor.txt" || fail "tessera doctor does not name rank 1"
# mpirun ended the stopped rank too (SIGCONT, SIGTERM, SIGKILL): it is gone, or a zombie about to
# be reaped, not stopped or running. Assumes it is gone within 30 s of mpirun's exit (a loaded
# machine may take seconds to run a SIGKILLed process's exit); a stopped rank would stay forever.
alive() { [[ -e /proc/$1 ]] && ! grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null; }
for _ in $(seq 150); do alive "$stopped" || break; sleep 0.2; done
if alive "$stopped"; then fail "rank 1 (pid $stopped) outlived the run: $(grep '^State:' "/proc/$stopped/status")"; fi
echo "test_stop_rank: passed"
