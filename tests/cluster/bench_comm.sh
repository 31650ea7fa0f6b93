#!/usr/bin/env bash
# `tessera bench comm` across the nodes of a namespace cluster: PER_NODE ranks on each of NODES
# nodes, links LINKS (unshaped, or shaped with tc tbf on both ends), ALGORITHMS x DTYPES.
# Every node shares this machine's cores, so these are behaviour figures (bytes, order, what a
# shaped link does), not a network's speed. Not a test: run by hand, as root, from the repository
# root after a build:
#   tests/cluster/bench_comm.sh [OUT_DIR]     # default bench/results; writes NAME.{csv,md}
# Environment: TESSERA (build/tessera), SIZES (4K..64M), NODES ("2 4"), PER_NODE (1),
# LINKS ("unshaped 2gbit 1gbit"), ALGORITHMS (mpi,ring), DTYPES (fp32), ITERS (20),
# NAME (cluster_comm). Issue 16's sitting:
#   PER_NODE=2 LINKS=1gbit ALGORITHMS=mpi,ring,hierarchical DTYPES=fp32,bf16 SIZES=1M..16M \
#     ITERS=5 NAME=cluster_comm_scale tests/cluster/bench_comm.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-bench/results}
tessera=$(realpath "${TESSERA:-build/tessera}")
sizes=${SIZES:-4K..64M} node_counts=${NODES:-2 4} per_node=${PER_NODE:-1} links=${LINKS:-unshaped 2gbit 1gbit}
algorithms=${ALGORITHMS:-mpi,ring} dtypes=${DTYPES:-fp32} iters=${ITERS:-20} name=${NAME:-cluster_comm}
mkdir -p "$out"
export TESSERA_CLUSTER=bench TESSERA_CLUSTER_SUBNET=10.77.30
cluster=tests/cluster/cluster.sh
trap '"$cluster" down >/dev/null' EXIT
max_nodes=$(tr ' ' '\n' <<<"$node_counts" | sort -n | tail -n 1)
"$cluster" up "$max_nodes"
eval "$("$cluster" env)"
work=$(mktemp -d /tmp/tessera-bench-comm.XXXXXX)
csv=$out/$name.csv
echo "nodes,link,algorithm,backend,ranks,bytes,time_us,algbw_gbps,busbw_gbps,reduce_dtype,sent_bytes,cross_node_bytes" >"$csv"
for link in $links; do
  if [[ $link == unshaped ]]; then "$cluster" shape off; else "$cluster" shape "$link"; fi
  for nodes in $node_counts; do
    hosts=$(for ((i = 1; i <= nodes; i++)); do printf '%s-n%d:%d,' "$TESSERA_CLUSTER" "$i" "$per_node"; done)
    mpirun -n $((nodes * per_node)) --host "${hosts%,}" "$tessera" bench comm --algorithms "$algorithms" \
      --reduce-dtypes "$dtypes" --backends mpi --sizes "$sizes" --iters "$iters" --csv "$work/run.csv" \
      >"$work/run.out" 2>&1 || { cat "$work/run.out"; exit 1; }
    tail -n +2 "$work/run.csv" | sed "s/^/$nodes,$link,/" >>"$csv"
    echo "bench: $nodes nodes x $per_node ranks, link $link: done"
  done
done
rm -rf "$work"
# A table per row: the 4 KB time, busbw (GB/s) at 1, 16 and 64 MB, and the bytes per rank and
# call at the largest size (sent in all, and to other nodes).
{
  echo "| nodes | ranks | link | algorithm | dtype | 4 KB us | 1 MB busbw | 16 MB busbw | 64 MB busbw | sent B | to other nodes B |"
  echo "| ---: | ---: | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
  awk -F, 'NR > 1 { key = $1 "|" $5 "|" $2 "|" $3 "|" $10; keys[key] = 1
                    if ($6 == 4096) t[key] = $7
                    if ($6 == 1048576) b1[key] = $9
                    if ($6 == 16777216) b16[key] = $9
                    if ($6 == 67108864) b64[key] = $9
                    if ($6 >= big[key]) { big[key] = $6; sent[key] = $11; cross[key] = $12 } }
           function show(x, f) { return x == "" ? "-" : sprintf(f, x) }
           END { for (k in keys) { split(k, f, "|")
                   printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", f[1], f[2], f[3], f[4], f[5],
                          show(t[k], "%.0f"), show(b1[k], "%.3f"), show(b16[k], "%.3f"), show(b64[k], "%.3f"),
                          sent[k], cross[k] } }' "$csv" |
    sort -t'|' -k4,4 -k2,2n -k5,5 -k6,6
} >"$out/$name.md"
cat "$out/$name.md"
echo "bench: CPU $(grep -m 1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores shared by all nodes"
