#!/usr/bin/env bash
# The warning signal and a lost rank across nodes, with cpu.sbatch:
#   a) Slurm's warning before the time limit (--time=2 --signal=B:USR1@40) on a job of 4 nodes,
#      one rank each: every rank, on every node, waits in the step-20 checkpoint
#      (TESSERA_TEST_PAUSE_IN_CHECKPOINT) and leaves that wait when the warning comes, because the
#      signal reached it (its main thread is out of clock_nanosleep long before the 180-s pause
#      ends); the ranks stop after step 21 with a checkpoint, exit 4, the job requeues itself,
#      resumes and completes;
#   b) one rank of a 2-node job killed (SIGKILL) while its node lives, the ranks waiting in the
#      step-20 checkpoint: srun (--kill-on-bad-exit) ends the other ranks at once instead of
#      leaving them blocked until the time limit; the job fails without a requeue, the step-20
#      checkpoint is not taken for complete, and the job submitted again resumes from step 10;
#   c) the same outside Slurm: mpirun across 2 nodes, one rank killed, every rank ends.
# Each completed run is the uninterrupted 4-rank run bit for bit.
set -euo pipefail
# shellcheck source=tests/cluster/lib.sh
source "$(dirname "$0")/lib.sh"

cluster_up 4
jobs_dir=$WORK_DIR/jobs
mkdir -p "$jobs_dir"
cd "$jobs_dir"
export TESSERA=$TESSERA_BINARY TESSERA_JOBSCRIPTS=$SOURCE_DIR/jobscripts
export DECK=$SOURCE_DIR/inputs/fashion_mnist_mlp-ci.toml
args=(--set "data.path=$(data_path)" --set run.blas_threads=1 --set checkpoint.every_steps=10
  --set checkpoint.keep=0)
pause_step=20

srun --mpi=pmix --kill-on-bad-exit=1 -N 1 -n 4 --overcommit "$TESSERA_BINARY" train "$DECK" "${args[@]}" \
  --set "run.output_dir=$WORK_DIR/ref" >"$WORK_DIR/ref.out" 2>&1 || fail "the reference run failed"
say "reference: 4 ranks on 1 node: $(grep '^done' "$WORK_DIR/ref.out")"

# "pid node" of every running `tessera train` process of the cluster.
rank_pids() {
  local i pid argv=()
  for i in 1 2 3 4; do
    for pid in $(ip netns pids "$(node "$i")"); do
      mapfile -d '' -t argv <"/proc/$pid/cmdline" 2>/dev/null || continue
      [[ ${argv[0]:-} == */tessera && ${argv[1]:-} == train ]] && echo "$pid $i"
    done
  done
  return 0
}
# How many of those are in clock_nanosleep (the pause hook) now.
sleeping_ranks() {
  local pid node count=0
  while read -r pid node; do
    [[ $(cut -d' ' -f1 "/proc/$pid/syscall" 2>/dev/null) == 230 ]] && count=$((count + 1))
  done < <(rank_pids)
  echo "$count"
}
# All $2 ranks of the job writing output file $1 wait in the pause hook.
paused() { [[ $(grep -c 'TESSERA_TEST_PAUSE_IN_CHECKPOINT: waiting' "$1" 2>/dev/null) -eq $2 ]]; }

# --- a) the warning signal on 4 nodes ----------------------------------------------------------------
# slurmctld sends the warning at its first 30-s check at or after end - 40 s - 30 s: 50 to 80 s
# after the start. What this may assume: all 4 ranks sleep in the pause within 50 s of the start
# (seconds unloaded; --time=1 --signal=B:USR1@10, 20 to 50 s, left a loaded machine too little),
# the 180-s pause outlasts the latest warning, the second start completes within 50 s (its own
# warning) and the stop and requeue take less than the 40 s left before the limit.
run=$WORK_DIR/run_warning
jid=$(RANKS_PER_NODE=1 TESSERA_TEST_PAUSE_IN_CHECKPOINT=$pause_step sbatch --parsable -N 4 --time=2 \
  --signal=B:USR1@40 "$TESSERA_JOBSCRIPTS/cpu.sbatch" "${args[@]}" --set "run.output_dir=$run")
out=$jobs_dir/tessera-$jid.out
wait_for 120 paused "$out" 4 || fail "job $jid: its 4 ranks did not all reach the step-$pause_step checkpoint within 120 s"
t_paused=$(now)
declare -A rank_node=()
while read -r pid node; do rank_node[$pid]=$node; done < <(rank_pids)
[[ $(printf '%s\n' "${rank_node[@]}" | sort -u | paste -sd' ' -) == "1 2 3 4" ]] ||
  fail "job $jid: expected one rank on each of the 4 nodes, found nodes ${rank_node[*]}"
all_sleep() { [[ $(sleeping_ranks) -eq 4 ]]; }
wait_for 10 all_sleep || fail "job $jid: not every rank sleeps in the pause hook ($(sleeping_ranks) of 4)"
say "a) job $jid: one rank on each node, all 4 in clock_nanosleep in the step-$pause_step checkpoint; Slurm's warning is due 50-80 s after the start"
warned() { grep -q 'warning signal: the ranks checkpoint' "$out"; }
wait_for 120 warned || fail "job $jid: no warning reached the batch script within 120 s"
t_warned=$(now)
# A rank that the signal missed would sleep on until its 180-s pause ends.
none_sleep() { [[ $(sleeping_ranks) -eq 0 ]]; }
wait_for 30 none_sleep || fail "job $jid: $(sleeping_ranks) rank(s) still sleep in the pause after the warning: the signal missed them"
say "a) the warning came $(elapsed "$t_paused" "$t_warned") s into the pause; every rank left it within $(elapsed "$t_warned" "$(now)") s"
requeued() { [[ $(job_field "$jid" Restarts) -ge 1 ]]; }
wait_for 120 requeued || fail "job $jid was not requeued ($(job_state "$jid"))"
wait_job "$jid" 300
show_output "$out"
grep -q 'the ranks exited with code 4' "$out" || fail "$out: the ranks did not exit with code 4"
grep -q "^stop requested by signal: stopping after step $((pause_step + 1))," "$run/log.txt" ||
  fail "$run/log.txt: the ranks did not stop after step $((pause_step + 1))"
grep -q "^resumed from .*step_000000$((pause_step + 1)).h5" "$run/log.txt" || fail "$run: no resume from step $((pause_step + 1))"
same_bits "$WORK_DIR/ref" "$run"
say "a) passed: the warning reached every rank on 4 nodes; stop after step $((pause_step + 1)), requeue, resume, bit for bit"

# --- b) a rank killed while its node lives -------------------------------------------------------------
run=$WORK_DIR/run_rank
jid=$(TESSERA_TEST_PAUSE_IN_CHECKPOINT=$pause_step sbatch --parsable -N 2 --time=10 \
  "$TESSERA_JOBSCRIPTS/cpu.sbatch" "${args[@]}" --set "run.output_dir=$run")
out=$jobs_dir/tessera-$jid.out
wait_for 120 paused "$out" 4 || fail "job $jid: its 4 ranks did not all reach the step-$pause_step checkpoint within 120 s"
victim=$(rank_pids | awk '$2 == 2 { print $1; exit }')
[[ -n $victim ]] || fail "job $jid: no rank on $(node 2)"
t_kill=$(now)
kill -KILL "$victim"
say "b) job $jid: killed rank pid $victim on $(node 2), its node alive, every rank in the step-$pause_step checkpoint"
# Without --kill-on-bad-exit the others would wait out the 180-s pause and then block until the
# watchdog (600 s); with it the job ends within seconds (5.5 s unloaded): 90 s tells them apart.
wait_job "$jid" 90 FAILED
t_end=$(now)
show_output "$out"
# Killed ranks may take a moment to exit on a loaded machine; a blocked one would stay for good.
no_ranks() { [[ -z $(rank_pids) ]]; }
wait_for 30 no_ranks || fail "ranks of job $jid outlived it by 30 s: $(rank_pids | paste -sd' ' -)"
[[ $(job_field "$jid" Restarts) -eq 0 ]] || fail "job $jid was requeued after a rank crashed"
grep -q 'the ranks exited with code [1-9]' "$out" || fail "$out: the job script did not report the ranks' failure"
[[ $(cat "$run/checkpoints/latest") == step_00000010.h5 ]] ||
  fail "$run: latest is $(cat "$run/checkpoints/latest"), not the complete step-10 checkpoint"
say "b) the job ended FAILED $(elapsed "$t_kill" "$t_end") s after the kill, no requeue; latest checkpoint step 10"
jid=$(sbatch --parsable -N 2 --time=10 "$TESSERA_JOBSCRIPTS/cpu.sbatch" "${args[@]}" --set "run.output_dir=$run")
wait_job "$jid" 300
grep -q '^resumed from .*step_00000010.h5 at step 10 ' "$run/log.txt" || fail "$run: the second job did not resume from step 10"
same_bits "$WORK_DIR/ref" "$run"
say "b) passed: submitted again (job $jid), resumed from step 10, bit for bit the uninterrupted run"

# --- c) the same under mpirun, outside Slurm -------------------------------------------------------------
run=$WORK_DIR/run_mpirun
TESSERA_TEST_PAUSE_IN_CHECKPOINT=$pause_step mpirun -n 4 --host "$(node 1):2,$(node 2):2" "$TESSERA_BINARY" train \
  "$DECK" "${args[@]}" --set "run.output_dir=$run" >"$run.out" 2>&1 &
mpirun_pid=$!
wait_for 120 paused "$run.out" 4 || fail "mpirun: its 4 ranks did not all reach the step-$pause_step checkpoint"
victim=$(rank_pids | awk '$2 == 2 { print $1; exit }')
kill -KILL "$victim"
status=0
wait "$mpirun_pid" || status=$?
((status != 0)) || fail "mpirun exited 0 after a rank was killed"
wait_for 30 no_ranks || fail "ranks outlived mpirun by 30 s: $(rank_pids | paste -sd' ' -)"
say "c) passed: mpirun across 2 nodes ended every rank (exit $status) when one was killed"
echo "PASS: warning signal on 4 nodes, lost ranks, $((SECONDS - start_time)) s"
