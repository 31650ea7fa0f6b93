#!/usr/bin/env bash
# Bad input to the job scripts on several nodes ends the job with one clear line and exit code 2
# before any rank starts (no step runs, no run directory is made):
#   a) gpt-3d.sbatch on 3 nodes with PIPELINE=2: the node count does not split into the stages;
#   b) cpu.sbatch on 2 nodes with a global batch that does not split over the 4 ranks it derives;
#   c) gpt-3d.sbatch on 2 nodes x 2 ranks with parallel.tensor = 4 (a tensor group across both
#      nodes): a warning, and an error (exit 2) where the deck says
#      parallel.tensor_within_node = true;
#   d) comm.timeout_s = 0 (it must be positive).
set -euo pipefail
# shellcheck source=tests/cluster/lib.sh
source "$(dirname "$0")/lib.sh"

cluster_up 3
jobs_dir=$WORK_DIR/jobs
mkdir -p "$jobs_dir"
cd "$jobs_dir"
export TESSERA=$TESSERA_BINARY TESSERA_JOBSCRIPTS=$SOURCE_DIR/jobscripts
corpus=$WORK_DIR/docs.h5
"$TESSERA_BINARY" prepare text --out "$corpus" "$SOURCE_DIR"/tests/data/corpus/{readme,design}.txt >/dev/null
# Submits gpt-3d.sbatch on $1 nodes x $2 ranks as a CPU user does, with the arguments after them.
submit_gpt() {
  local nodes=$1 per_node=$2
  shift 2
  DECK=$SOURCE_DIR/tests/integration/gpt_test.toml sbatch --parsable -N "$nodes" --ntasks-per-node="$per_node" \
    --cpus-per-task=1 --gpus-per-task=0 --time=5 "$TESSERA_JOBSCRIPTS/gpt-3d.sbatch" --set "data.path=$corpus" "$@"
}

# Job $1 (output file $2, run directory $3) ended with exit code 2 after printing exactly one line
# that matches $4, and started no rank.
rejected() {
  local jid=$1 out=$2 run=$3 pattern=$4
  wait_job "$jid" 120 FAILED
  [[ $(job_field "$jid" ExitCode) == 2:0 ]] || fail "job $jid exited $(job_field "$jid" ExitCode), not 2"
  [[ $(grep -c -E "$pattern" "$out") -eq 1 ]] || fail "$out: expected one line matching '$pattern':$(echo; cat "$out")"
  grep -q '^tessera 0' "$out" && fail "job $jid started ranks (their banner is in $out)"
  [[ ! -e $run ]] || fail "job $jid made $run"
  [[ -z $(scontrol show step "$jid.0" 2>/dev/null | grep StepId || true) ]] || fail "job $jid ran a step"
  say "rejected: $(grep -E "$pattern" "$out")"
}

# --- a) a node count that PIPELINE does not divide ---------------------------------------------------
jid=$(PIPELINE=2 submit_gpt 3 2 --set "run.output_dir=$WORK_DIR/run_a")
rejected "$jid" "tessera-gpt-$jid.out" "$WORK_DIR/run_a" '^gpt-3d: 3 nodes do not split into 2 pipeline stages'
say "a) passed"

# --- b) a batch that does not split over the ranks derived from the nodes ------------------------------
jid=$(DECK=$SOURCE_DIR/inputs/fashion_mnist_mlp-ci.toml sbatch --parsable -N 2 --time=5 "$TESSERA_JOBSCRIPTS/cpu.sbatch" \
  --set "data.path=$(data_path)" --set train.global_batch=126 --set "run.output_dir=$WORK_DIR/run_b")
rejected "$jid" "tessera-$jid.out" "$WORK_DIR/run_b" '^tessera: error: .*global_batch'
say "b) passed"

# --- c) a tensor group across nodes: a warning, or an error with tensor_within_node ----------------------
# 2 nodes x 2 ranks, PIPELINE=1: the script derives tensor 2 x data 2; tensor 4 spans both nodes.
across=(--set parallel.tensor=4 --set parallel.data=1 --set train.steps=2 --set eval.every_steps=0
  --set checkpoint.at_end=false)
jid=$(PIPELINE=1 submit_gpt 2 2 "${across[@]}" --set parallel.tensor_within_node=true --set "run.output_dir=$WORK_DIR/run_c")
rejected "$jid" "tessera-gpt-$jid.out" "$WORK_DIR/run_c" '^tessera: error: .*parallel.tensor_within_node'
jid=$(PIPELINE=1 submit_gpt 2 2 "${across[@]}" --set "run.output_dir=$WORK_DIR/run_c2")
wait_job "$jid" 300
out=tessera-gpt-$jid.out
[[ $(grep -c "^warning: tensor group .*spans hosts $(node 1), $(node 2):" "$out") -eq 2 ]] ||
  fail "$out: expected the warning from tessera check and from the run: $(grep -i warning "$out")"
grep -q "^warning: tensor group .*spans hosts $(node 1), $(node 2):" "$WORK_DIR/run_c2/log.txt" ||
  fail "$WORK_DIR/run_c2/log.txt: no warning of the tensor group across nodes"
say "c) passed: tensor group across 2 nodes: an error with parallel.tensor_within_node = true, else a warning (check and run)"

# --- d) comm.timeout_s not positive -------------------------------------------------------------------------
jid=$(DECK=$SOURCE_DIR/inputs/fashion_mnist_mlp-ci.toml sbatch --parsable -N 2 --time=5 "$TESSERA_JOBSCRIPTS/cpu.sbatch" \
  --set "data.path=$(data_path)" --set comm.timeout_s=0 --set "run.output_dir=$WORK_DIR/run_d")
rejected "$jid" "tessera-$jid.out" "$WORK_DIR/run_d" '^tessera: error: .*comm.timeout_s'
say "d) passed"
echo "PASS: job scripts reject bad input on several nodes, $((SECONDS - start_time)) s"
