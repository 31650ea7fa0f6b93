# Shared by the job scripts in jobscripts/ (sourced, not submitted): validate the deck, start the
# ranks, pass Slurm's warning signal on to them, and requeue the job when they stopped with a
# checkpoint (exit code 4). See docs/slurm.md.
#
#   source jobscripts/tessera-job.sh     # installs the USR1 trap at once
#   tessera_job_ranks RANKS_PER_NODE     # (whole-node jobs) the ranks of this start
#   tessera_check DECK [tessera check args...]
#   tessera_run LAUNCHER... -- tessera train DECK --resume auto [args...]
#
# Environment: TESSERA (the binary, default build/tessera), TESSERA_REQUEUE (1: requeue on exit
# code 4, the default; 0: just exit 4, as a link of a chain of dependent jobs does),
# TESSERA_CHECK_LAUNCHER (empty: `tessera check` runs as one plain process on the batch node;
# "srun -n 1" where the MPI cannot start a process that srun did not launch); OMP_WAIT_POLICY
# (passive unless set).
# shellcheck shell=bash

TESSERA=${TESSERA:-build/tessera}
TESSERA_REQUEUE=${TESSERA_REQUEUE:-1}
# With an OpenMP Kokkos, OpenMP threads that spin between kernels take the cores from OpenBLAS's
# own threads (the GPT at 1 rank x 2 threads: half speed; docs/performance.md); passive waiting
# costs a Serial Kokkos nothing. The trainer's "threads:" log line says what a run had.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

tessera_job_step_pid=
tessera_job_warned=0
TESSERA_CHECK_ENV=()

# Slurm's warning (--signal=B:USR1@SECONDS) goes to this batch shell only; the ranks get it from
# here. Before the ranks exist there is nothing to forward; tessera_run then declines to start.
tessera_job_forward_signal() {
  tessera_job_warned=1
  if [[ -n $tessera_job_step_pid ]]; then
    echo "tessera-job: $(date +%T) warning signal: the ranks checkpoint and stop after this step"
    kill -USR1 "$tessera_job_step_pid" 2>/dev/null || true
  fi
}
trap tessera_job_forward_signal USR1

# Prints a line with the job's identity: which link of the run this is.
tessera_job_banner() {
  echo "tessera-job: $(date -Is) job ${SLURM_JOB_ID:-?} on ${SLURM_JOB_NUM_NODES:-?} node(s)" \
    "(${SLURM_JOB_NODELIST:-?})${SLURM_NTASKS:+, $SLURM_NTASKS task(s)}, restart ${SLURM_RESTART_COUNT:-0}"
}

# Sets the ranks of this start: TESSERA_RANKS, and the task options for them, TESSERA_SRUN_TASKS
# (srun) and TESSERA_MPIRUN_TASKS (mpirun). A job that asked Slurm for tasks (--ntasks,
# --ntasks-per-node) runs those. A job of whole nodes without a task count (--exclusive, as
# cpu.sbatch asks) runs $1 ranks on each node it has now: submitted with a node range
# (--nodes=3-4) and requeued after a node failure, it restarts on the nodes that are left, with
# fewer ranks. (Slurm keeps a requeued job's first task count: a job that asked for
# --ntasks-per-node waits for as many nodes as it first had.)
# shellcheck disable=SC2034  # the TESSERA_*_TASKS arrays are for the job scripts
tessera_job_ranks() {
  local per_node=$1
  if [[ -n ${SLURM_NTASKS:-} ]]; then
    TESSERA_RANKS=$SLURM_NTASKS
    TESSERA_SRUN_TASKS=()
    TESSERA_MPIRUN_TASKS=()
    TESSERA_CHECK_ENV=()
  else
    TESSERA_RANKS=$((${SLURM_JOB_NUM_NODES:?not inside a Slurm job} * per_node))
    TESSERA_SRUN_TASKS=(--ntasks="$TESSERA_RANKS" --ntasks-per-node="$per_node")
    TESSERA_MPIRUN_TASKS=(-n "$TESSERA_RANKS" --map-by "ppr:$per_node:node")
    # Slurm's SLURM_TASKS_PER_NODE counts a whole node's CPUs here; `tessera check` places the
    # ranks from it, so it gets the tasks per node the launcher will start.
    TESSERA_CHECK_ENV=("SLURM_TASKS_PER_NODE=$per_node(x$SLURM_JOB_NUM_NODES)")
  fi
  echo "tessera-job: $TESSERA_RANKS rank(s) on ${SLURM_JOB_NUM_NODES:-?} node(s)"
}

# Validates the deck for the job's rank count before the expensive part: a bad deck fails here in
# seconds, on one process, with one `tessera: error:` line. Prints the resolved deck and sets
# TESSERA_OUTPUT_DIR to its run.output_dir.
tessera_check() {
  local resolved
  local launcher=()
  read -r -a launcher <<<"${TESSERA_CHECK_LAUNCHER:-}"
  resolved=$(env "${TESSERA_CHECK_ENV[@]}" "${launcher[@]}" "$TESSERA" check "$@" \
    --ranks "${TESSERA_RANKS:-${SLURM_NTASKS:?not inside a Slurm job}}")
  echo "$resolved"
  TESSERA_OUTPUT_DIR=$(sed -n 's/^output_dir = "\(.*\)"$/\1/p' <<<"$resolved")
}

# True when the run in TESSERA_OUTPUT_DIR has finished (its summary.json says "completed").
tessera_run_completed() {
  grep -qs '"status": "completed"' "${TESSERA_OUTPUT_DIR:?call tessera_check first}/summary.json"
}

# Runs LAUNCHER... (srun or mpirun and their options) with the command after `--` in the
# background, forwards the warning signal, waits, and on exit code 4 requeues the job
# (TESSERA_REQUEUE=1). Returns the ranks' exit code.
tessera_run() {
  local launcher=()
  while (($#)) && [[ $1 != -- ]]; do
    launcher+=("$1")
    shift
  done
  shift  # the --
  if ((tessera_job_warned)); then
    echo "tessera-job: the warning signal came before the ranks started: is --time shorter than" \
      "the --signal offset? Not starting." >&2
    return 1
  fi
  "${launcher[@]}" "$@" &
  tessera_job_step_pid=$!
  local status
  while :; do
    status=0
    wait "$tessera_job_step_pid" || status=$?
    # A trapped signal interrupts `wait` (status > 128) while the ranks go on: wait again.
    ((status > 128)) && kill -0 "$tessera_job_step_pid" 2>/dev/null && continue
    break
  done
  tessera_job_step_pid=
  echo "tessera-job: $(date +%T) the ranks exited with code $status"
  if ((status == 4)) && ((TESSERA_REQUEUE)); then
    echo "tessera-job: stopped with a checkpoint before the time limit; requeueing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID"
  fi
  return "$status"
}
