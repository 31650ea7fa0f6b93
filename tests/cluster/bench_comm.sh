#!/usr/bin/env bash
# `tessera bench comm` across the nodes of a namespace cluster: 1 rank per node on 2 and 4 nodes,
# links unshaped and shaped to 2 and 1 Gbit/s (tc tbf on both ends), the mpi and ring algorithms.
# Every node shares this machine's cores, so these are behaviour figures (bytes, order, what a
# shaped link does), not a network's speed. Not a test: run by hand, as root, from the repository
# root after a build:
#   tests/cluster/bench_comm.sh [OUT_DIR]     # default bench/results; writes cluster_comm.{csv,md}
# Environment: TESSERA (build/tessera), SIZES (4K..64M).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-bench/results}
tessera=$(realpath "${TESSERA:-build/tessera}")
sizes=${SIZES:-4K..64M}
mkdir -p "$out"
export TESSERA_CLUSTER=bench TESSERA_CLUSTER_SUBNET=10.77.30
cluster=tests/cluster/cluster.sh
trap '"$cluster" down >/dev/null' EXIT
"$cluster" up 4
eval "$("$cluster" env)"
work=$(mktemp -d /tmp/tessera-bench-comm.XXXXXX)
csv=$out/cluster_comm.csv
echo "nodes,link,algorithm,backend,ranks,bytes,time_us,algbw_gbps,busbw_gbps" >"$csv"
for link in unshaped 2gbit 1gbit; do
  if [[ $link == unshaped ]]; then "$cluster" shape off; else "$cluster" shape "$link"; fi
  for nodes in 2 4; do
    hosts=$(for ((i = 1; i <= nodes; i++)); do printf '%s-n%d,' "$TESSERA_CLUSTER" "$i"; done)
    mpirun -n "$nodes" --map-by node --host "${hosts%,}" "$tessera" bench comm --algorithms mpi,ring \
      --backends mpi --sizes "$sizes" --csv "$work/run.csv" >"$work/run.out" 2>&1 ||
      { cat "$work/run.out"; exit 1; }
    tail -n +2 "$work/run.csv" | sed "s/^/$nodes,$link,/" >>"$csv"
    echo "bench: $nodes nodes, link $link: done"
  done
done
rm -rf "$work"
# A table of busbw (GB/s) at a few sizes, and the 4 KB time.
{
  echo "| nodes | link | algorithm | 4 KB us | 1 MB busbw | 16 MB busbw | 64 MB busbw |"
  echo "| ---: | --- | --- | ---: | ---: | ---: | ---: |"
  awk -F, 'NR > 1 { key = $1 "|" $2 "|" $3; keys[key] = 1
                    if ($6 == 4096) t[key] = $7
                    if ($6 == 1048576) b1[key] = $9
                    if ($6 == 16777216) b16[key] = $9
                    if ($6 == 67108864) b64[key] = $9 }
           END { for (k in keys) { split(k, f, "|")
                   printf "| %s | %s | %s | %.0f | %.3f | %.3f | %.3f |\n", f[1], f[2], f[3], t[k], b1[k], b16[k], b64[k] } }' "$csv" |
    sort -t'|' -k3,3 -k2,2n -k4,4
} >"$out/cluster_comm.md"
cat "$out/cluster_comm.md"
echo "bench: CPU $(grep -m 1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores shared by all nodes"
