#!/usr/bin/env bash
# The job scripts of jobscripts/ under a real Slurm: a private one-node cluster (its own munged,
# slurmctld and slurmd, everything in a temporary directory, ports chosen free), then
#   a) cpu.sbatch runs the CI deck to the end (ranks started by mpirun inside the allocation);
#   b) cpu.sbatch again (ranks started by srun --mpi=pmix) with --time=2 --signal=B:USR1@40:
#      Slurm's own warning before the time limit reaches the batch shell mid-run; the ranks
#      checkpoint, exit 4, the job requeues itself, starts again, resumes and completes, and its
#      train and eval losses equal run a)'s;
#   c) chained.sbatch submits a chain of two dependent jobs; the first link gets the same USR1
#      at once from `scancel --batch --signal=USR1` and exits 4, the second resumes and
#      completes, again with a)'s losses.
# slurmctld checks warning deadlines only every 30 s, so b)'s warning lands anywhere from 50 to
# 80 s after the start. "Mid-run" is made exact, on a fast Release build and a slow sanitizer
# build alike, by the test hook TESSERA_TEST_PAUSE_IN_CHECKPOINT=20 (io/checkpoint_file.cpp):
# the ranks wait inside the step-20 checkpoint until a signal comes (at most 180 s), so they stop
# after step 21. That every job script asks for --signal=B:USR1@N is checked by
# tests/slurm/lint_jobscripts.sh.
#
# Needs root, munge and Slurm (tools/setup.sh installs munge, slurmctld, slurmd, slurm-client);
# where they are missing or the daemons do not start, it prints why and exits 77, which ctest
# reports as skipped (a failure with TESSERA_REQUIRE_SLURM=1, as in CI). Environment
# (tests/slurm/CMakeLists.txt): TESSERA_BINARY, SOURCE_DIR, WORK_DIR.
set -euo pipefail

: "${TESSERA_BINARY:?} ${SOURCE_DIR:?} ${WORK_DIR:?}"
readonly skip_code=77
start_time=$SECONDS

say() { echo "slurm-test: [$((SECONDS - start_time))s] $*"; }
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
# TESSERA_REQUIRE_SLURM=1 (tools/test.sh sets it under CI=true) turns a skip into a failure.
skip() {
  if [[ ${TESSERA_REQUIRE_SLURM:-0} == 1 ]]; then
    echo "FAIL: $* (TESSERA_REQUIRE_SLURM=1: Slurm must run here)" >&2
    exit 1
  fi
  echo "SKIP: $*"
  exit "$skip_code"
}

# Nothing from an enclosing Slurm job (ctest run inside an allocation) may leak into ours.
while read -r var; do unset "$var"; done < <(compgen -e | grep -E '^(SLURM|SBATCH|SALLOC|SRUN)_' || true)

# --- Prerequisites ----------------------------------------------------------------------------
missing=()
for cmd in munged mungekey slurmctld slurmd sbatch squeue scontrol scancel sinfo; do
  command -v "$cmd" >/dev/null || missing+=("$cmd")
done
((${#missing[@]} == 0)) ||
  skip "not installed: ${missing[*]} (tools/setup.sh installs munge slurmctld slurmd slurm-client)"
[[ $(id -u) -eq 0 ]] || skip "needs root: slurmd starts every job as its owner"

# Daemon state lives in a short path (munge's socket path must stay under 108 bytes); the runs
# in WORK_DIR.
tmp=$(mktemp -d /tmp/tessera-slurm.XXXXXX)
chmod 755 "$tmp"
mkdir -p "$tmp"/{munge,state,spool,log,run,etc}
chmod 700 "$tmp/munge"
rm -rf "$WORK_DIR/jobs"
mkdir -p "$WORK_DIR/jobs"
jobs_dir=$WORK_DIR/jobs
export SLURM_CONF=$tmp/etc/slurm.conf

daemon_pids=()
cleanup() {
  local status=$?
  set +e
  if [[ -f $tmp/run/slurmctld.started ]]; then
    # Jobs first, so no slurmstepd outlives its slurmd.
    scancel --full --quiet --partition=tessera 2>/dev/null
    for _ in $(seq 1 20); do
      [[ -z $(squeue -h -o %i 2>/dev/null) ]] && break
      sleep 0.5
    done
  fi
  for pid in "${daemon_pids[@]}"; do kill "$pid" 2>/dev/null; done
  [[ -f $tmp/munge/munged.pid ]] && kill "$(cat "$tmp/munge/munged.pid")" 2>/dev/null
  for pid in "${daemon_pids[@]}"; do
    for _ in $(seq 1 20); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.2
    done
  done
  # The daemons' logs stay in WORK_DIR/daemon-logs for a look after a failure.
  rm -rf "$WORK_DIR/daemon-logs"
  cp -r "$tmp/log" "$WORK_DIR/daemon-logs" 2>/dev/null
  if ((status != 0 && status != skip_code)); then
    for f in "$WORK_DIR"/daemon-logs/*.log; do
      echo "--- last lines of $f"
      tail -n 15 "$f"
    done
  fi
  rm -rf "$tmp"
  say "done (exit $status)"
}
trap cleanup EXIT

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

free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# --- munge: its own key and socket ------------------------------------------------------------
mungekey --create --keyfile="$tmp/munge/munge.key" --bits=1024 --force ||
  skip "mungekey cannot create a key"
chmod 600 "$tmp/munge/munge.key"
socket=$tmp/munge/munge.socket
munged --force --socket="$socket" --key-file="$tmp/munge/munge.key" \
  --pid-file="$tmp/munge/munged.pid" --log-file="$tmp/log/munged.log" \
  --seed-file="$tmp/munge/munged.seed" ||
  skip "munged does not start: $(tail -n 3 "$tmp/log/munged.log" 2>/dev/null)"
munge --socket="$socket" --no-input | unmunge --socket="$socket" >/dev/null ||
  skip "munge credentials do not round-trip through $socket"

# --- slurm.conf ---------------------------------------------------------------------------------
host=$(hostname -s)
# The CPUs this process may run on. GNU nproc honours OMP_NUM_THREADS, which an OpenMP build's
# test run often sets to 1: the node would then be too small for the jobs' two tasks.
cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
((cpus >= 2)) || skip "the jobs need 2 CPUs for their 2 tasks; this machine has $cpus"
ctld_port=$(free_port)
slurmd_port=$(free_port)
[[ $ctld_port != "$slurmd_port" ]] || slurmd_port=$(free_port)
cat >"$SLURM_CONF" <<EOF
ClusterName=tessera-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire also delays a requeued job's next start (default 120 s).
AuthInfo=socket=$socket,cred_expire=10
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/run/slurmctld.pid
SlurmdPidFile=$tmp/run/slurmd.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd.log
SlurmctldDebug=debug
SlurmdDebug=debug
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
MpiDefault=none
ReturnToService=2
JobRequeue=1
MinJobAge=300
KillWait=5
InactiveLimit=0
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=tessera Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF

# --- slurmctld and slurmd, in the foreground of background shells ------------------------------
slurmctld -D -i -c -f "$SLURM_CONF" >"$tmp/log/slurmctld.out" 2>&1 &
daemon_pids+=($!)
touch "$tmp/run/slurmctld.started"
slurmd -D -f "$SLURM_CONF" >"$tmp/log/slurmd.out" 2>&1 &
daemon_pids+=($!)
node_idle() { [[ $(sinfo -h -n "$host" -o %T 2>/dev/null) == idle ]]; }
if ! wait_for 30 node_idle; then
  echo "--- slurmctld:"; tail -n 20 "$tmp/log/slurmctld.log" "$tmp/log/slurmctld.out" 2>/dev/null
  echo "--- slurmd:"; tail -n 20 "$tmp/log/slurmd.log" "$tmp/log/slurmd.out" 2>/dev/null
  skip "the node did not become idle within 30 s (sinfo: $(sinfo -h -o '%T %E' 2>&1 | head -n 1))"
fi
say "Slurm $(sinfo -V | cut -d' ' -f2) is up: node $host, $cpus CPUs, ports $ctld_port/$slurmd_port"

# --- The deck and the data ------------------------------------------------------------------------
data=$WORK_DIR/fashion-mnist.h5
if [[ ! -f $data ]]; then
  "$TESSERA_BINARY" prepare fashion-mnist --out "$data.part" >/dev/null
  mv "$data.part" "$data"
fi
deck=$SOURCE_DIR/inputs/fashion_mnist_mlp-ci.toml
# The CI deck (a train row every 5 steps; evaluation and a checkpoint every 20), 60 steps, every
# checkpoint kept; the signalled runs pause in the step-20 checkpoint until the signal comes.
steps=60
log_every=5
pause_step=20
deck_args=(--set "data.path=$data" --set "train.steps=$steps" --set "train.log_every=$log_every"
  --set checkpoint.keep=0)
export TESSERA=$TESSERA_BINARY TESSERA_JOBSCRIPTS=$SOURCE_DIR/jobscripts DECK=$deck
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
cd "$jobs_dir"

job_field() { scontrol show job "$1" 2>/dev/null | grep -o "\b$2=[^ ]*" | head -n 1 | cut -d= -f2; }
job_state() { job_field "$1" JobState; }
job_ended() { [[ $(job_state "$1") =~ ^(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY)$ ]]; }
# Train (and eval) rows "kind step loss" of a run's metrics.csv.
losses() { awk -F, 'NR > 1 { print $1, $2, $4 }' "$1/metrics.csv"; }
# The losses of run $1 equal those of run $2 (relative difference <= 1e-7, same steps).
same_losses() {
  paste -d' ' <(losses "$1") <(losses "$2") | awk -v a="$1" -v b="$2" '
    { n++
      if ($1 != $4 || $2 != $5) { print "row " n ": " $1 " " $2 " vs " $4 " " $5; bad = 1; next }
      d = $3 - $6; if (d < 0) d = -d; m = ($3 < 0 ? -$3 : $3); if (m < 1e-30) m = 1e-30
      if (d / m > 1e-7) { print "step " $2 " " $1 " loss " $3 " vs " $6; bad = 1 } }
    END { if (n == 0) { print "no rows"; bad = 1 } exit bad }'
}
completed() { grep -qs '"status": "completed"' "$1/summary.json"; }
# What a job printed, less the resolved deck and the per-step lines.
show_output() {
  echo "--- $1"
  grep -E '^(tessera|stop requested|checkpoint|resumed|done|srun|deck |eval )' "$1" || true
}

# --- a) one job to the end -------------------------------------------------------------------
ref=$WORK_DIR/run_ref
rm -rf "$ref"
jid=$(TESSERA_LAUNCHER=mpirun sbatch --parsable --time=10 "$SOURCE_DIR/jobscripts/cpu.sbatch" \
  "${deck_args[@]}" --set "run.output_dir=$ref")
say "a) job $jid: cpu.sbatch, mpirun, $steps steps"
[[ $(scontrol show job "$jid" | grep -o 'Requeue=[0-9]') == Requeue=1 ]] ||
  fail "cpu.sbatch did not ask for --requeue"
wait_for 300 job_ended "$jid" || fail "job $jid did not end within 300 s (state $(job_state "$jid"))"
out=$jobs_dir/tessera-$jid.out
show_output "$out"
[[ $(job_state "$jid") == COMPLETED ]] || fail "job $jid ended $(job_state "$jid"), not COMPLETED"
completed "$ref" || fail "$ref/summary.json does not say completed"
[[ $(grep -c '^train,' "$ref/metrics.csv") -eq $((steps / log_every)) ]] ||
  fail "$ref: expected $((steps / log_every)) train rows"
grep -q 'is valid for 2 ranks' "$out" || fail "the job did not run tessera check first"
say "a) passed: job $jid COMPLETED, summary.json completed"

# Both ranks of the job writing output file $1 wait in the pause hook.
paused() { [[ $(grep -c 'TESSERA_TEST_PAUSE_IN_CHECKPOINT: waiting' "$1" 2>/dev/null) -eq 2 ]]; }
# Sends the batch shell of job $1 USR1, as --signal=B:USR1@N would, while both of its ranks wait
# in the step-20 checkpoint (output file $2).
signal_mid_run() {
  wait_for 300 paused "$2" || fail "job $1: its ranks did not reach the step-$pause_step checkpoint within 300 s"
  scancel --batch --signal=USR1 "$1"
  say "signalled job $1 in the step-$pause_step checkpoint"
}
# The log of run $1 shows one stop by signal with a checkpoint, and a resume from it.
check_stop_and_resume() {
  local stop_step
  stop_step=$(sed -n 's/^stop requested by signal: stopping after step \([0-9]*\),.*/\1/p' "$1/log.txt")
  [[ $(wc -w <<<"$stop_step") -eq 1 ]] || fail "$1/log.txt: expected one stop by signal, got '$stop_step'"
  local ckpt
  ckpt=$(printf 'step_%08d.h5' "$stop_step")
  [[ -f $1/checkpoints/$ckpt ]] || fail "no checkpoint $ckpt after the stop at step $stop_step"
  grep -q "^resumed from .*$ckpt at step $stop_step " "$1/log.txt" ||
    fail "$1/log.txt: the second start did not resume from $ckpt"
  ((stop_step == pause_step + 1)) || fail "stopped after step $stop_step, expected $((pause_step + 1))"
  say "stopped after step $stop_step with $ckpt, resumed from it"
}

# --- b) Slurm's own warning before the time limit: checkpoint, exit 4, requeue, resume ----------
# --time=2 --signal=B:USR1@40 (the command line overrides the script's @120). slurmctld checks
# warning deadlines every 30 s and sends the warning at the first check at or after
# end - 40 s - 30 s, i.e. 50 to 80 s after the start (measured with --time=1: both @30 and @50
# arrived at the same check). What this may assume: the ranks reach the step-20 checkpoint
# within 50 s of the start (seconds unloaded; --time=1 --signal=B:USR1@10 gave a loaded machine
# only 20 s), the pause (180 s) outlasts the latest warning, the second start completes within
# 50 s (its own warning), and the stop and requeue take less than the 40 s left.
run=$WORK_DIR/run_requeue
rm -rf "$run"
jid=$(TESSERA_TEST_PAUSE_IN_CHECKPOINT=$pause_step sbatch --parsable --time=2 --signal=B:USR1@40 \
  "$SOURCE_DIR/jobscripts/cpu.sbatch" "${deck_args[@]}" --set "run.output_dir=$run")
out=$jobs_dir/tessera-$jid.out
say "b) job $jid: cpu.sbatch, srun --mpi=pmix, --time=2 --signal=B:USR1@40"
wait_for 120 paused "$out" || fail "job $jid: its ranks did not reach the step-$pause_step checkpoint within 120 s"
say "b) both ranks wait in the step-$pause_step checkpoint; Slurm's warning is due 50 to 80 s after the start"
requeued() { [[ $(job_field "$jid" Restarts) -ge 1 ]]; }
wait_for 180 requeued || fail "job $jid was not requeued within 180 s (state $(job_state "$jid"))"
grep -q 'warning signal: the ranks checkpoint' "$out" || fail "$out: the warning did not reach the job script"
say "b) job $jid requeued ($(job_state "$jid"), $(job_field "$jid" Reason)); waiting for its second start"
wait_for 300 job_ended "$jid" || fail "job $jid did not end within 300 s (state $(job_state "$jid"))"
show_output "$out"
[[ $(job_state "$jid") == COMPLETED ]] || fail "job $jid ended $(job_state "$jid"), not COMPLETED"
[[ $(job_field "$jid" Restarts) -eq 1 ]] || fail "job $jid restarted $(job_field "$jid" Restarts) times, expected once"
grep -q 'the ranks exited with code 4' "$out" || fail "$out: the ranks did not exit with code 4"
grep -q "requeueing job $jid" "$out" || fail "$out: the job script did not requeue the job"
completed "$run" || fail "$run/summary.json does not say completed"
check_stop_and_resume "$run"
same_losses "$ref" "$run" || fail "the requeued run's losses differ from the uninterrupted run's"
say "b) passed: Slurm's warning, exit 4, requeued once, resumed, losses equal the uninterrupted run's"

# --- c) a chain of two dependent jobs, the first signalled now (scancel) --------------------------
run=$WORK_DIR/run_chain
rm -rf "$run"
LINKS=2 SBATCH_TIMELIMIT=10 TESSERA_TEST_PAUSE_IN_CHECKPOINT=$pause_step \
  "$SOURCE_DIR/jobscripts/chained.sbatch" "${deck_args[@]}" --set "run.output_dir=$run" |
  tee "$jobs_dir/chain.txt"
first=$(awk '/^link 1 of 2: job/ { print $NF }' "$jobs_dir/chain.txt")
second=$(awk '/^link 2 of 2: job/ { print $NF }' "$jobs_dir/chain.txt")
[[ -n $first && -n $second ]] || fail "chained.sbatch did not submit two links"
[[ $(job_field "$second" Dependency) == "afterany:$first"* ]] ||
  fail "link 2 (job $second) depends on '$(job_field "$second" Dependency)', not afterany:$first"
say "c) jobs $first -> $second: chained.sbatch, the first link signalled mid-run"
signal_mid_run "$first" "$jobs_dir/tessera-chain-$first.out"
wait_for 300 job_ended "$second" || fail "link 2 (job $second) did not end within 300 s"
show_output "$jobs_dir/tessera-chain-$first.out"
show_output "$jobs_dir/tessera-chain-$second.out"
grep -q 'the ranks exited with code 4' "$jobs_dir/tessera-chain-$first.out" ||
  fail "link 1: the ranks did not exit with code 4"
grep -q 'requeueing' "$jobs_dir/tessera-chain-$first.out" && fail "link 1 requeued itself"
[[ $(job_state "$second") == COMPLETED ]] || fail "link 2 ended $(job_state "$second")"
completed "$run" || fail "$run/summary.json does not say completed"
check_stop_and_resume "$run"
same_losses "$ref" "$run" || fail "the chained run's losses differ from the uninterrupted run's"
say "c) passed: link 1 stopped with exit 4, link 2 resumed and completed, losses equal"
echo "PASS: Slurm $(sinfo -V | cut -d' ' -f2), $((SECONDS - start_time)) s"
