# Shared by the tests of tests/cluster/ (sourced): a cluster of cluster.sh brought up under a
# name no other test holds and torn down on any exit, Slurm job helpers, loss comparisons.
#
# Environment (tests/cluster/CMakeLists.txt): TESSERA_BINARY, SOURCE_DIR, WORK_DIR (this test's
# own directory). Without root, namespaces or Slurm the test prints why and exits 77 (ctest:
# skipped); TESSERA_REQUIRE_CLUSTER=1 (tools/test.sh sets it under CI=true) makes that a failure.
# shellcheck shell=bash

: "${TESSERA_BINARY:?} ${SOURCE_DIR:?} ${WORK_DIR:?}"
readonly skip_code=77
readonly cluster_sh=$SOURCE_DIR/tests/cluster/cluster.sh
start_time=$SECONDS

say() { echo "cluster-test: [$((SECONDS - start_time))s] $*"; }
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
skip() {
  if [[ ${TESSERA_REQUIRE_CLUSTER:-0} == 1 ]]; then
    echo "FAIL: $* (TESSERA_REQUIRE_CLUSTER=1: the cluster must run here)" >&2
    exit 1
  fi
  echo "SKIP: $*"
  exit "$skip_code"
}

# Waits up to $1 seconds for the command after it to succeed.
wait_for() {
  local seconds=$1
  shift
  local deadline=$((SECONDS + seconds))
  until "$@"; do
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
}

# Process $1 lives (a zombie does not: daemons outlive cluster.sh, and what reaps them may be slow).
alive() { kill -0 "$1" 2>/dev/null && [[ $(ps -o stat= -p "$1" 2>/dev/null) != Z* ]]; }

# Seconds since the epoch, with milliseconds.
now() { date +%s.%3N; }
# $2 - $1 in seconds, one decimal.
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

# Nothing from an enclosing Slurm job may leak into the cluster's.
while read -r var; do unset "$var"; done < <(compgen -e | grep -E '^(SLURM|SBATCH|SALLOC|SRUN)_' || true)

rm -rf "$WORK_DIR"
mkdir -p "$WORK_DIR"

# On any exit: the daemons' logs to WORK_DIR/daemon-logs (their last lines printed after a
# failure), then the cluster down.
cluster_exit() {
  local status=$?
  set +e
  trap - EXIT INT TERM
  if [[ -n ${TESSERA_CLUSTER_DIR:-} && -d $TESSERA_CLUSTER_DIR/log ]]; then
    cp -r "$TESSERA_CLUSTER_DIR/log" "$WORK_DIR/daemon-logs"
    if ((status != 0 && status != skip_code)); then
      for f in "$WORK_DIR"/daemon-logs/*.log; do
        echo "--- last lines of $f"
        tail -n 8 "$f"
      done
    fi
  fi
  # Only a cluster this test made (its recorded owner): a name that `up` could not claim may
  # be another test's.
  if [[ -n ${TESSERA_CLUSTER:-} && $(cat "/tmp/tessera-cluster.$TESSERA_CLUSTER/owner" 2>/dev/null) == "$WORK_DIR" ]]; then
    "$cluster_sh" down
  fi
  say "done (exit $status)"
  exit "$status"
}

# Brings up a cluster of $1 nodes under the first free name tt1..tt8 (subnet 10.77.11-18), so
# that the same tests in another build tree may run at once; exports its environment (SLURM_CONF,
# Open MPI's rsh agent and interfaces) and tears it down when the test exits.
cluster_up() {
  local n=$1 k status=0
  export TESSERA_CLUSTER_OWNER=$WORK_DIR
  for ((k = 1; k <= 8; k++)); do
    export TESSERA_CLUSTER=tt$k TESSERA_CLUSTER_SUBNET=10.77.$((10 + k))
    status=0
    "$cluster_sh" up "$n" >"$WORK_DIR/cluster-up.txt" 2>&1 || status=$?
    ((status == 4)) && continue  # the name is taken
    break
  done
  trap cluster_exit EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  cat "$WORK_DIR/cluster-up.txt"
  case $status in
    0) ;;
    3) skip "$(grep 'cannot run here' "$WORK_DIR/cluster-up.txt" | head -n 1)" ;;
    4) skip "the names tt1..tt8 are all taken by clusters that are up" ;;
    *) fail "cluster.sh up $n failed" ;;
  esac
  eval "$("$cluster_sh" env)"
}

# The nodes of the cluster, n1 first (node i is $(node i)).
node() { echo "$TESSERA_CLUSTER-n$1"; }

# --- Slurm jobs ---------------------------------------------------------------------------------------
job_field() { scontrol show job "$1" 2>/dev/null | grep -o "\b$2=[^ ]*" | head -n 1 | cut -d= -f2; }
job_state() { job_field "$1" JobState; }
job_ended() { [[ $(job_state "$1") =~ ^(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE)$ ]]; }
job_running() { [[ $(job_state "$1") == RUNNING ]]; }
# Waits for job $1 to end within $2 seconds and checks it ended $3 (default COMPLETED).
wait_job() {
  local jid=$1 seconds=$2 want=${3:-COMPLETED}
  wait_for "$seconds" job_ended "$jid" || fail "job $jid did not end within $seconds s (state $(job_state "$jid"))"
  [[ $(job_state "$jid") == "$want" ]] ||
    fail "job $jid ended $(job_state "$jid") (exit code $(job_field "$jid" ExitCode)), not $want"
}
# Every node of the cluster is idle.
all_idle() { [[ -z $(sinfo -h -N -o '%N %T' | awk '$2 != "idle"') ]]; }

# What a job printed, less the resolved deck, the layout and the per-step lines.
show_output() {
  echo "--- $1"
  grep -E '^(tessera|stop requested|checkpoint|resumed|done|srun|deck |eval |gpt-3d)' "$1" || true
}

# --- Runs and their losses -----------------------------------------------------------------------------
data_path() {
  local data=$WORK_DIR/../fashion-mnist.h5
  if [[ ! -f $data ]]; then
    "$TESSERA_BINARY" prepare fashion-mnist --out "$data.part.$$" >/dev/null
    mv "$data.part.$$" "$data"
  fi
  echo "$data"
}
completed() { grep -qs '"status": "completed"' "$1/summary.json"; }
# Rows "kind step loss grad_norm accuracy" of a run's metrics.csv, as printed (9 digits: exact);
# "-" where a row has no value (an eval row's gradient norm).
loss_rows() {
  awk -F, 'NR > 1 { print $1, $2, $4, ($6 == "" ? "-" : $6), ($8 == "" ? "-" : $8) }' "$1/metrics.csv"
}
# Run $2 is run $1 bit for bit: the same metrics rows (losses, gradient norms, accuracies) and the
# same final parameters and optimizer state (tessera diff --tolerance 0). Only for two runs of the
# same layout (ranks, dp/tp/pp, node split where the exchange depends on it) with run.blas_threads
# fixed: DESIGN.md guarantees bitwise equality there and nowhere else; other layouts: same_losses.
same_bits() {
  local a=$1 b=$2
  completed "$a" || fail "$a did not complete"
  completed "$b" || fail "$b did not complete"
  [[ -n $(loss_rows "$a") ]] || fail "$a/metrics.csv has no rows"
  diff <(loss_rows "$a") <(loss_rows "$b") >"$WORK_DIR/diff.txt" ||
    fail "the losses of $b differ from $a's: $(head -n 4 "$WORK_DIR/diff.txt")"
  local ckpt
  ckpt=$(cat "$a/checkpoints/latest")
  [[ $(cat "$b/checkpoints/latest") == "$ckpt" ]] || fail "$b ended at $(cat "$b/checkpoints/latest"), $a at $ckpt"
  "$TESSERA_BINARY" diff "$a/checkpoints/$ckpt" "$b/checkpoints/$ckpt" --tolerance 0 >"$WORK_DIR/diff.txt" 2>&1 ||
    fail "the final checkpoints of $a and $b differ: $(tail -n 2 "$WORK_DIR/diff.txt")"
}
# The losses of run $2 equal run $1's within relative $3 at every logged step (a layout with a
# different data-replica count sums the gradients in another order: DESIGN.md allows 1e-5).
same_losses() {
  local a=$1 b=$2 tolerance=$3
  paste -d' ' <(loss_rows "$a") <(loss_rows "$b") | awk -v a="$a" -v b="$b" -v tol="$tolerance" '
    { n++
      if ($1 != $6 || $2 != $7) { print "row " n ": " $1 " " $2 " vs " $6 " " $7; bad = 1; next }
      d = $3 - $8; if (d < 0) d = -d; m = ($3 < 0 ? -$3 : $3); if (m < 1e-30) m = 1e-30
      if (d / m > tol) { print "step " $2 " " $1 " loss " $3 " vs " $8; bad = 1 } }
    END { if (n == 0) { print "no rows"; bad = 1 } exit bad }' ||
    fail "the losses of $b differ from $a's by more than $tolerance"
}
