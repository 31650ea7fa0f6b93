#!/usr/bin/env bash
# One model, any placement: the CI deck's data-parallel MLP on 4 ranks, started
#   - by mpirun on 1 node (the reference), on 2 nodes (2 ranks each) from the login namespace,
#     and on 4 nodes (1 rank each) from inside a node with a hostfile (--map-by node);
#   - by srun --mpi=pmix on 1, 2 and 4 nodes,
#   - with hybrid sharding (ZeRO-1 within each of 2 nodes; the losses within 1e-5),
# gives the reference's losses, gradient norms, accuracies and final parameters bit for bit
# (run.blas_threads = 1 everywhere: the BLAS thread count per rank is what changes summation
# order, docs/slurm.md), and the gradients really cross the links of the nodes in the run.
set -euo pipefail
# shellcheck source=tests/cluster/lib.sh
source "$(dirname "$0")/lib.sh"

cluster_up 4
deck=$SOURCE_DIR/inputs/fashion_mnist_mlp-ci.toml
args=(--set "data.path=$(data_path)" --set run.blas_threads=1 --set train.steps=30)

# Bytes the node $1 received over its link so far.
rx_bytes() { cat "/sys/class/net/$(node "$1")/statistics/tx_bytes"; }
# Runs `LAUNCHER... tessera train` into run directory $1 (under WORK_DIR) and checks that nodes
# $2 (e.g. "1 2") received at least 1 MB each over their links and the others nothing much.
train() {
  local run=$WORK_DIR/$1 used=$2 i
  shift 2
  local before=() after
  for i in 1 2 3 4; do before[i]=$(rx_bytes "$i"); done
  "$@" "$TESSERA_BINARY" train "$deck" "${args[@]}" --set "run.output_dir=$run" >"$run.out" 2>&1 ||
    fail "$*: exit $? ($(grep -m 1 'error' "$run.out"))"
  for i in 1 2 3 4; do
    after=$(rx_bytes "$i")
    if [[ " $used " == *" $i "* ]]; then
      ((after - before[i] > 1000000)) || fail "$1: n$i took part but received $((after - before[i])) bytes"
    else
      ((after - before[i] < 1000000)) || fail "$1: n$i took no part but received $((after - before[i])) bytes"
    fi
  done
}

train ref "" mpirun -n 4 --host "$(node 1):4"
say "reference: mpirun, 4 ranks on 1 node: $(grep '^done' "$WORK_DIR/ref.out")"

train mpirun_2 "1 2" mpirun -n 4 --host "$(node 1):2,$(node 2):2"
same_bits "$WORK_DIR/ref" "$WORK_DIR/mpirun_2"
say "mpirun from the login namespace, 2 nodes x 2 ranks: bit for bit the reference's"

# Hybrid sharding on real nodes: ZeRO-1 within each node (MPI's shared-memory split), the shards
# summed across the 2 nodes; fp32 sums in another order: the losses within 1e-5.
args+=(--set parallel.zero=1 --set parallel.zero_group=node)
train hybrid_2 "1 2" mpirun -n 4 --host "$(node 1):2,$(node 2):2"
args=("${args[@]:0:${#args[@]}-4}")
grep -q 'ZeRO stage 1 within each node (2 ranks per shard group), replicated across 2 nodes' \
  "$WORK_DIR/hybrid_2/log.txt" || fail "hybrid_2: the log does not show 2 nodes of 2 ($(grep -m 1 exchange "$WORK_DIR/hybrid_2/log.txt"))"
same_losses "$WORK_DIR/ref" "$WORK_DIR/hybrid_2" 1e-5
say "hybrid sharding (parallel.zero_group = node), 2 nodes x 2 ranks: the reference's losses within 1e-5"

printf '%s slots=2\n' "$(node 1)" "$(node 2)" "$(node 3)" "$(node 4)" >"$WORK_DIR/hostfile"
train mpirun_4 "1 2 3 4" "$cluster_sh" exec n3 mpirun -n 4 --map-by node --hostfile "$WORK_DIR/hostfile"
same_bits "$WORK_DIR/ref" "$WORK_DIR/mpirun_4"
say "mpirun from inside n3, hostfile, --map-by node, 4 nodes x 1 rank: bit for bit the reference's"

train srun_1 "" srun --mpi=pmix --kill-on-bad-exit=1 -N 1 -n 4 --overcommit -w "$(node 2)"
same_bits "$WORK_DIR/ref" "$WORK_DIR/srun_1"
train srun_2 "1 2" srun --mpi=pmix --kill-on-bad-exit=1 -N 2 -n 4
same_bits "$WORK_DIR/ref" "$WORK_DIR/srun_2"
train srun_4 "1 2 3 4" srun --mpi=pmix --kill-on-bad-exit=1 -N 4 -n 4
same_bits "$WORK_DIR/ref" "$WORK_DIR/srun_4"
say "srun --mpi=pmix on 1, 2 and 4 nodes: bit for bit the reference's"
echo "PASS: mpirun and srun across 1, 2 and 4 nodes, $((SECONDS - start_time)) s"
