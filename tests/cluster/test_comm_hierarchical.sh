#!/usr/bin/env bash
# comm.allreduce = "hierarchical" on real (namespace) nodes, 2 nodes x 2 ranks: `tessera bench
# comm` sees 2 nodes of 2 ranks; its checks pass for ring and hierarchical, fp32 and bf16 (the sum
# equals MPI_Allreduce's exactly on small integers and within the rounding bound on fractions,
# bitwise alike on every rank); the Communicator's counters say that the hierarchical allreduce
# sends 2/3 of the flat ring's bytes to the other node (half the buffer per rank against 3/4) and
# the same in all; and the bytes that really crossed the links fell too.
set -euo pipefail
# shellcheck source=tests/cluster/lib.sh
source "$(dirname "$0")/lib.sh"

cluster_up 2
readonly size=4194304
# Bytes the nodes received over their links so far (the host ends' transmit counters).
link_bytes() { echo $(($(cat "/sys/class/net/$(node 1)/statistics/tx_bytes") + $(cat "/sys/class/net/$(node 2)/statistics/tx_bytes"))); }
# bench comm of algorithm $1 with wire types $2 on 2 nodes x 2 ranks; prints the link bytes it moved.
bench() {
  local before
  before=$(link_bytes)
  mpirun -n 4 --host "$(node 1):2,$(node 2):2" "$TESSERA_BINARY" bench comm --algorithms "$1" --reduce-dtypes "$2" \
    --backends mpi --sizes "$size" --iters 3 --warmup 1 --csv "$WORK_DIR/$1.csv" >"$WORK_DIR/$1.out" 2>&1 ||
    fail "bench comm $1: exit $?: $(tail -n 5 "$WORK_DIR/$1.out")"
  echo $(($(link_bytes) - before))
}
ring_link=$(bench ring fp32,bf16)
hier_link=$(bench hierarchical fp32,bf16)
grep -q '^nodes: 2 (ranks on each: 2, 2)' "$WORK_DIR/hierarchical.out" ||
  fail "bench comm did not see 2 nodes of 2 ranks: $(grep '^nodes' "$WORK_DIR/hierarchical.out")"
say "bench comm checks passed for ring and hierarchical, fp32 and bf16, on 2 nodes x 2 ranks"

# Column of the CSV row of wire type $2 in file $1: 9 sent_bytes, 10 cross_node_bytes (per rank and call).
column() { awk -F, -v d="$2" -v c="$3" '$8 == d { print $c }' "$WORK_DIR/$1.csv"; }
for dtype in fp32 bf16; do
  elem=$([[ $dtype == bf16 ]] && echo 2 || echo 4)
  buffer=$((size * elem / 4))  # the buffer in the wire type
  ring_x=$(column ring $dtype 10) hier_x=$(column hierarchical $dtype 10)
  ring_s=$(column ring $dtype 9) hier_s=$(column hierarchical $dtype 9)
  ((ring_x == buffer * 3 / 4)) || fail "$dtype: the ring sent $ring_x bytes per rank across, not 3/4 of $buffer"
  ((hier_x == buffer / 2)) || fail "$dtype: hierarchical sent $hier_x bytes per rank across, not 1/2 of $buffer"
  ((ring_s == hier_s && ring_s == buffer * 3 / 2)) || fail "$dtype: sent in all $ring_s (ring), $hier_s (hierarchical)"
  say "$dtype: bytes per rank and call to the other node: ring $ring_x, hierarchical $hier_x (of $ring_s sent)"
done
((hier_link < ring_link)) || fail "the links moved $hier_link bytes for hierarchical, $ring_link for the ring"
say "bytes over the links: ring $ring_link, hierarchical $hier_link"
echo "PASS: hierarchical allreduce across 2 nodes x 2 ranks, $((SECONDS - start_time)) s"
