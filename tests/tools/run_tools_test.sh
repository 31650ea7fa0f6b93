#!/usr/bin/env bash
# Runs the analysis tools in tools/ on a real run of the tessera binary and checks their output.
#   run_tools_test.sh STEP
# STEP: run | plot_metrics | plot_checkpoints | compare_checkpoints. `run` prepares Fashion-MNIST
# and trains tests/integration/mlp_test.toml on 2 ranks into $WORK_DIR/run, keeping every
# checkpoint (steps 10, 20, 30); the other steps need that run (a ctest fixture).
# Environment (set by tests/tools/CMakeLists.txt): TESSERA_BINARY, MPIEXEC, TOOLS_PYTHON,
# SOURCE_DIR, WORK_DIR.
set -euo pipefail

: "${TESSERA_BINARY:?} ${MPIEXEC:?} ${TOOLS_PYTHON:?} ${SOURCE_DIR:?} ${WORK_DIR:?}"
tools=$SOURCE_DIR/tools
run=$WORK_DIR/run
ckpt=$run/checkpoints

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# A file that exists, starts with the 8-byte PNG signature and is larger than 10 KB.
check_png() {
  [[ -s $1 ]] || fail "$1 is missing or empty"
  local size sig
  size=$(stat -c %s "$1")
  ((size > 10240)) || fail "$1 is only $size bytes (expected > 10 KB)"
  sig=$(head -c 8 "$1" | od -An -tx1 | tr -d ' \n')
  [[ $sig == 89504e470d0a1a0a ]] || fail "$1 does not start with the PNG signature (got $sig)"
  echo "ok: $1 is a PNG of $size bytes"
}

# Runs a command that must exit with the given code; its output goes to $WORK_DIR/last.txt.
expect_exit() {
  local want=$1 got=0
  shift
  "$@" >"$WORK_DIR/last.txt" 2>&1 || got=$?
  cat "$WORK_DIR/last.txt"
  ((got == want)) || fail "exit code $got, expected $want: $*"
}

step_run() {
  rm -rf "$WORK_DIR"
  mkdir -p "$WORK_DIR"
  "$MPIEXEC" -n 1 --oversubscribe "$TESSERA_BINARY" prepare fashion-mnist --out "$WORK_DIR/fm.h5"
  "$MPIEXEC" -n 2 --oversubscribe --bind-to none "$TESSERA_BINARY" train \
    "$SOURCE_DIR/tests/integration/mlp_test.toml" --set "data.path=$WORK_DIR/fm.h5" \
    --set "run.output_dir=$run" --set checkpoint.keep=0
  for s in 10 20 30; do
    [[ -f $ckpt/step_000000$s.h5 ]] || fail "the run wrote no checkpoint for step $s"
  done
  [[ -f $run/metrics.csv ]] || fail "the run wrote no metrics.csv"
}

step_plot_metrics() {
  "$TOOLS_PYTHON" "$tools/plot_metrics.py" "$run" --out "$WORK_DIR/metrics.png" --title test --logy
  check_png "$WORK_DIR/metrics.png"
  # Two runs with the same directory name are told apart by their layout.
  "$TOOLS_PYTHON" "$tools/plot_metrics.py" "$run" "$run/" --out "$WORK_DIR/metrics2.png"
  check_png "$WORK_DIR/metrics2.png"

  # metrics.h5 by name, and next to the run's metrics.csv.
  "$TOOLS_PYTHON" "$tools/plot_metrics.py" "$run/metrics.h5" --out "$WORK_DIR/metrics_h5.png"
  check_png "$WORK_DIR/metrics_h5.png"
  "$TOOLS_PYTHON" "$tools/plot_metrics.py" "$run/metrics.csv" "$run/metrics.h5" \
    --out "$WORK_DIR/metrics_both.png"
  check_png "$WORK_DIR/metrics_both.png"
  # metrics.h5 holds metrics.csv's rows, column by column (h5py, as a user would read it).
  "$TOOLS_PYTHON" - "$run" <<'PY' || fail "metrics.h5 and metrics.csv disagree"
import csv, math, sys
import h5py
run = sys.argv[1]
with open(f"{run}/metrics.csv", newline="") as f:
    rows = list(csv.DictReader(f))
with h5py.File(f"{run}/metrics.h5", "r") as h5:
    assert h5.attrs["format"] == "tessera-metrics", dict(h5.attrs)
    for kind in ("train", "eval"):
        mine = [r for r in rows if r["kind"] == kind]
        group = h5[kind]
        assert len(mine) > 0, kind
        for name, ds in group.items():
            assert ds.shape == (len(mine),), (kind, name, ds.shape, len(mine))
            for r, v in zip(mine, ds[()]):
                cell = r[name]
                if cell == "":
                    assert math.isnan(v), (kind, name, r["step"], v)
                else:
                    assert math.isclose(float(cell), float(v), rel_tol=1e-8, abs_tol=1e-3 if name == "wall_s" else 0.0), (kind, name, r["step"], cell, v)
        print(f"ok: /{kind}: {len(mine)} rows x {len(group)} columns equal metrics.csv")
PY

  # A missing directory: exit 2, one error line.
  expect_exit 2 "$TOOLS_PYTHON" "$tools/plot_metrics.py" "$WORK_DIR/no_such_run" \
    --out "$WORK_DIR/x.png"
  [[ $(wc -l <"$WORK_DIR/last.txt") -eq 1 ]] || fail "expected one error line"
  grep -q '^plot_metrics: error: .*no_such_run' "$WORK_DIR/last.txt" ||
    fail "error line does not name the directory"

  # A metrics.csv without the expected header: exit 2, one error line.
  mkdir -p "$WORK_DIR/bad_run"
  printf 'step,value\n1,2\n' >"$WORK_DIR/bad_run/metrics.csv"
  expect_exit 2 "$TOOLS_PYTHON" "$tools/plot_metrics.py" "$WORK_DIR/bad_run" \
    --out "$WORK_DIR/x.png"
  [[ $(wc -l <"$WORK_DIR/last.txt") -eq 1 ]] || fail "expected one error line"
  grep -q 'expected a header' "$WORK_DIR/last.txt" || fail "error line does not mention the header"
}

step_plot_checkpoints() {
  "$TOOLS_PYTHON" "$tools/plot_checkpoints.py" "$run" --out "$WORK_DIR/checkpoints.png" |
    tee "$WORK_DIR/table.txt"
  check_png "$WORK_DIR/checkpoints.png"
  grep -q '3 checkpoints' "$WORK_DIR/table.txt" || fail "expected the 3 checkpoints of the run"
  # Files given explicitly, out of order: sorted by step.
  "$TOOLS_PYTHON" "$tools/plot_checkpoints.py" "$ckpt/step_00000030.h5" "$ckpt/step_00000010.h5" \
    --out "$WORK_DIR/checkpoints2.png" | tee "$WORK_DIR/table2.txt"
  check_png "$WORK_DIR/checkpoints2.png"
  grep -Eq '^layers\.0\.weight +10 ' "$WORK_DIR/table2.txt" || fail "no row for step 10"
  expect_exit 2 "$TOOLS_PYTHON" "$tools/plot_checkpoints.py" "$WORK_DIR/no_such_run" \
    --out "$WORK_DIR/x.png"

  # --parallel on 2 ranks reads through MPI-IO (python3-h5py-mpi, python3-mpi4py from
  # tools/setup.sh) and prints the serial run's table; on one process it says what it needs.
  # The tables are compared exactly: each tensor's norms are computed whole by one rank with the
  # serial code (no sum is split across ranks), so the rank count changes no arithmetic.
  "$MPIEXEC" -n 2 --oversubscribe --bind-to none "$TOOLS_PYTHON" "$tools/plot_checkpoints.py" \
    "$run" --out "$WORK_DIR/checkpoints_mpi.png" --parallel | tee "$WORK_DIR/table_mpi.txt"
  check_png "$WORK_DIR/checkpoints_mpi.png"
  grep -q 'read on 2 ranks through MPI-IO' "$WORK_DIR/table_mpi.txt" || fail "not read through MPI-IO"
  diff <(grep -v '^plot_checkpoints:' "$WORK_DIR/table.txt") \
    <(grep -v '^plot_checkpoints:' "$WORK_DIR/table_mpi.txt") || fail "the 2-rank table differs"
  expect_exit 2 "$TOOLS_PYTHON" "$tools/plot_checkpoints.py" "$run" --out "$WORK_DIR/x.png" --parallel
  grep -q 'needs several ranks' "$WORK_DIR/last.txt" || fail "--parallel alone does not say why"
}

step_compare_checkpoints() {
  local a=$ckpt/step_00000010.h5 b=$ckpt/step_00000030.h5
  # A file against itself: every difference is zero, exit 0 even at tolerance 0.
  expect_exit 0 "$TOOLS_PYTHON" "$tools/compare_checkpoints.py" "$a" "$a" --tolerance 0
  local rows
  rows=$(grep -Ec '^(model|optimizer)/' "$WORK_DIR/last.txt")
  ((rows > 0)) || fail "no tensors compared"
  awk '/^(model|optimizer)\// && ($3 != 0 || $4 != 0) { bad = 1; print "nonzero: " $0 }
       END { exit bad }' "$WORK_DIR/last.txt" || fail "a checkpoint differs from itself"

  # Two different steps: nonzero differences; exit 0 without a tolerance, 1 with 1e-12.
  expect_exit 0 "$TOOLS_PYTHON" "$tools/compare_checkpoints.py" "$a" "$b"
  awk '/^model\// && $4 > 0 { n++ } END { exit n == 0 }' "$WORK_DIR/last.txt" ||
    fail "steps 10 and 30 compare as equal"
  expect_exit 1 "$TOOLS_PYTHON" "$tools/compare_checkpoints.py" "$a" "$b" --tolerance 1e-12
  expect_exit 2 "$TOOLS_PYTHON" "$tools/compare_checkpoints.py" "$a" "$WORK_DIR/missing.h5"
}

case ${1:-} in
  run | plot_metrics | plot_checkpoints | compare_checkpoints) "step_$1" ;;
  *) fail "usage: $0 run|plot_metrics|plot_checkpoints|compare_checkpoints" ;;
esac
echo "PASS: $1"
