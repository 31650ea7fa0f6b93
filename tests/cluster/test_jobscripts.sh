#!/usr/bin/env bash
# The job scripts of jobscripts/ on several nodes, each run compared with the same layout on
# 1 node, bit for bit (run.blas_threads = 1):
#   a) sbatch -N 2 cpu.sbatch (srun --mpi=pmix), b) the same with TESSERA_LAUNCHER=mpirun;
#   c) chained.sbatch with 2 links of 2 nodes: link 1 stopped mid-run by USR1 (every rank on both
#      nodes waits in the step-20 checkpoint first), link 2 resumes and completes;
#   d) gpt-3d.sbatch on 4 nodes x 2 ranks with the CPU build, as a CPU user submits it
#      (--gpus-per-task=0 --cpus-per-task=1, a small GPT deck), with srun and with mpirun: the
#      layout it derives from the node count (data 2 x tensor 2 x pipeline 2) and where its groups
#      land, read from the ranks' own namespaces: every tensor group inside one node, pipeline
#      stages and data replicas across nodes; the run's rank table (log.txt) and tessera check's
#      plan from Slurm's environment agree.
set -euo pipefail
# shellcheck source=tests/cluster/lib.sh
source "$(dirname "$0")/lib.sh"

cluster_up 4
jobs_dir=$WORK_DIR/jobs
mkdir -p "$jobs_dir"
cd "$jobs_dir"
export TESSERA=$TESSERA_BINARY TESSERA_JOBSCRIPTS=$SOURCE_DIR/jobscripts
mlp_deck=$SOURCE_DIR/inputs/fashion_mnist_mlp-ci.toml
mlp_args=(--set "data.path=$(data_path)" --set run.blas_threads=1 --set checkpoint.keep=0)

# --- The 1-node reference ----------------------------------------------------------------------------
srun --mpi=pmix --kill-on-bad-exit=1 -N 1 -n 4 --overcommit "$TESSERA_BINARY" train "$mlp_deck" "${mlp_args[@]}" \
  --set "run.output_dir=$WORK_DIR/ref" >"$WORK_DIR/ref.out" 2>&1 || fail "the 1-node reference failed: $(grep -m 1 error "$WORK_DIR/ref.out")"
say "reference: 4 ranks on 1 node: $(grep '^done' "$WORK_DIR/ref.out")"

# --- a), b) cpu.sbatch on 2 nodes --------------------------------------------------------------------
for launcher in srun mpirun; do
  run=$WORK_DIR/cpu_$launcher
  jid=$(DECK=$mlp_deck TESSERA_LAUNCHER=$launcher sbatch --parsable -N 2 --ntasks-per-node=2 --time=10 \
    "$TESSERA_JOBSCRIPTS/cpu.sbatch" "${mlp_args[@]}" --set "run.output_dir=$run")
  wait_job "$jid" 300
  [[ $(job_field "$jid" NumNodes) == 2 ]] || fail "job $jid ran on $(job_field "$jid" NumNodes) nodes, not 2"
  same_bits "$WORK_DIR/ref" "$run"
  say "$([[ $launcher == srun ]] && echo a || echo b)) cpu.sbatch -N 2, $launcher: job $jid COMPLETED, bit for bit the reference's"
done

# --- c) chained.sbatch, 2 links of 2 nodes ---------------------------------------------------------------
run=$WORK_DIR/chain
pause_step=20
DECK=$mlp_deck LINKS=2 LINK_OPTIONS="-N 2 --ntasks-per-node=2 --time=10" TESSERA_TEST_PAUSE_IN_CHECKPOINT=$pause_step \
  "$TESSERA_JOBSCRIPTS/chained.sbatch" "${mlp_args[@]}" --set "run.output_dir=$run" | tee "$jobs_dir/chain.txt"
first=$(awk '/^link 1 of 2: job/ { print $NF }' "$jobs_dir/chain.txt")
second=$(awk '/^link 2 of 2: job/ { print $NF }' "$jobs_dir/chain.txt")
[[ -n $first && -n $second ]] || fail "chained.sbatch did not submit two links"
paused() { [[ $(grep -c 'TESSERA_TEST_PAUSE_IN_CHECKPOINT: waiting' "tessera-chain-$first.out" 2>/dev/null) -eq 4 ]]; }
wait_for 300 paused || fail "link 1 (job $first): its 4 ranks did not all reach the step-$pause_step checkpoint"
[[ $(job_field "$first" NumNodes) == 2 ]] || fail "link 1 runs on $(job_field "$first" NumNodes) nodes, not 2"
scancel --batch --signal=USR1 "$first"
wait_job "$second" 300
show_output "tessera-chain-$first.out"
grep -q 'the ranks exited with code 4' "tessera-chain-$first.out" || fail "link 1: the ranks did not exit with code 4"
grep -q "^resumed from .*step_000000$((pause_step + 1)).h5" "$run/log.txt" || fail "link 2 did not resume from step $((pause_step + 1))"
same_bits "$WORK_DIR/ref" "$run"
say "c) chained.sbatch on 2 nodes: link 1 stopped after step $((pause_step + 1)), link 2 resumed; bit for bit the reference's"

# --- d) gpt-3d.sbatch on 4 nodes with the CPU build ------------------------------------------------------
corpus=$WORK_DIR/docs.h5
"$TESSERA_BINARY" prepare text --out "$corpus" "$SOURCE_DIR"/tests/data/corpus/{readme,design,deck}.txt >/dev/null
gpt_deck=$SOURCE_DIR/tests/integration/gpt_test.toml
gpt_args=(--set "data.path=$corpus" --set run.blas_threads=1 --set train.steps=12 --set eval.every_steps=6
  --set checkpoint.every_steps=6)
srun --mpi=pmix --kill-on-bad-exit=1 -N 1 -n 8 --overcommit "$TESSERA_BINARY" train "$gpt_deck" "${gpt_args[@]}" \
  --set parallel.data=2 --set parallel.tensor=2 --set parallel.pipeline=2 \
  --set "run.output_dir=$WORK_DIR/gpt_ref" >"$WORK_DIR/gpt_ref.out" 2>&1 ||
  fail "the 1-node GPT reference failed: $(grep -m 1 error "$WORK_DIR/gpt_ref.out")"
say "d) reference: the GPT on 8 ranks of 1 node, data 2 x tensor 2 x pipeline 2: $(grep '^done' "$WORK_DIR/gpt_ref.out")"

# "rank node" for each running `tessera train` process of the cluster: the node is the namespace
# it runs in, the rank its OMPI_COMM_WORLD_RANK (mpirun) or SLURM_PROCID (srun).
rank_placement() {
  local i pid argv=() rank
  for i in 1 2 3 4; do
    for pid in $(ip netns pids "$(node "$i")"); do
      mapfile -d '' -t argv <"/proc/$pid/cmdline" 2>/dev/null || continue
      [[ ${argv[0]:-} == */tessera && ${argv[1]:-} == train ]] || continue
      rank=$(tr '\0' '\n' <"/proc/$pid/environ" | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
      [[ -n $rank ]] || rank=$(tr '\0' '\n' <"/proc/$pid/environ" | sed -n 's/^SLURM_PROCID=//p')
      echo "$rank $i"
    done
  done | sort -n
}
all_ranks_placed() {
  rank_placement >"$WORK_DIR/placement.txt"
  [[ $(wc -l <"$WORK_DIR/placement.txt") -eq 8 ]]
}
# Checks that the groups `tessera check` printed in job output $1 land as gpt-3d.sbatch promises,
# given placement file $2 ("rank node" lines).
check_groups() {
  local out=$WORK_DIR/check.txt placement=$2 kind ranks nodes distinct
  # tessera check's part of the job output (the run prints its own group lines after it).
  sed -n '1,/ is valid for [0-9]* ranks$/p' "$1" >"$out"
  for kind in tensor pipeline data; do
    while read -r ranks; do
      nodes=$(tr ',' '\n' <<<"$ranks" | while read -r r; do awk -v r="$r" '$1 == r { print $2 }' "$placement"; done)
      distinct=$(sort -u <<<"$nodes" | wc -l)
      case $kind in
        tensor) ((distinct == 1)) || fail "tensor group [$ranks] spans nodes $(paste -sd, <<<"$nodes")" ;;
        *) ((distinct == $(wc -l <<<"$nodes"))) || fail "$kind group [$ranks] has two ranks on one node: $(paste -sd, <<<"$nodes")" ;;
      esac
    done < <(sed -n "s/^  $kind group ([^)]*): ranks \[\([0-9,]*\)\].*/\1/p" "$out")
  done
  [[ $(grep -c '^  tensor group' "$out") -eq 4 && $(grep -c '^  pipeline group' "$out") -eq 4 &&
    $(grep -c '^  data group' "$out") -eq 4 ]] || fail "$1: expected 4 groups of each kind from tessera check"
}

for launcher in srun mpirun; do
  run=$WORK_DIR/gpt_$launcher
  jid=$(DECK=$gpt_deck PIPELINE=2 TESSERA_LAUNCHER=$launcher sbatch --parsable -N 4 --ntasks-per-node=2 \
    --cpus-per-task=1 --gpus-per-task=0 --time=10 "$TESSERA_JOBSCRIPTS/gpt-3d.sbatch" "${gpt_args[@]}" \
    --set "run.output_dir=$run")
  out=tessera-gpt-$jid.out
  wait_for 300 all_ranks_placed || fail "job $jid: 8 ranks never ran at once ($(paste -sd' ' "$WORK_DIR/placement.txt"))"
  cp "$WORK_DIR/placement.txt" "$WORK_DIR/placement_$launcher.txt"
  wait_job "$jid" 300
  show_output "$out"
  grep -q '^gpt-3d: 4 nodes x 2 ranks (0 GPU each): data 2 x tensor 2 x pipeline 2$' "$out" ||
    fail "job $jid: gpt-3d did not derive data 2 x tensor 2 x pipeline 2 from 4 nodes"
  check_groups "$out" "$WORK_DIR/placement_$launcher.txt"
  # The run's own table of where every rank runs (log.txt) names the same nodes, and it warns of
  # no tensor group across hosts; the check's plan from Slurm's environment said the same.
  while read -r rank i; do
    grep -q "^  rank $rank host $(node "$i") " "$run/log.txt" || fail "$run/log.txt does not put rank $rank on $(node "$i")"
  done <"$WORK_DIR/placement_$launcher.txt"
  grep -q '^warning: .*spans hosts' "$run/log.txt" && fail "$run/log.txt warns of a group across hosts"
  grep -q "^  tensor group (d=0,p=0): ranks \[0,1\] on hosts \[$(node 1),$(node 1)\]" "$out" ||
    fail "$out: tessera check did not place tensor group (d=0,p=0) on $(node 1)"
  same_bits "$WORK_DIR/gpt_ref" "$run"
  say "d) gpt-3d.sbatch, 4 nodes, $launcher: ranks by node $(awk '{ printf "%s%s:n%s", sep, $1, $2; sep = " " }' "$WORK_DIR/placement_$launcher.txt");" \
    "tensor groups within nodes, pipeline and data across; bit for bit the 1-node run's"
done
echo "PASS: job scripts on 2 and 4 nodes, $((SECONDS - start_time)) s"
