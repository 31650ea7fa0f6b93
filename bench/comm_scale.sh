#!/usr/bin/env bash
# Issue 16's single-node sitting: `tessera bench comm` on RANKS (2) ranks of this machine for
# ALGORITHMS (mpi,ring,hierarchical) x DTYPES (fp32,bf16), with Open MPI's CMA single copy off
# and on (btl_vader_single_copy_mechanism = none | cma), the two settings alternated REPS (5)
# times; a row's time is the median of its runs' times (each already the median of bench comm's
# iterations). Writes results/comm_scale.csv (every run) and results/comm_scale.md (medians,
# busbw, bytes per rank and call from the counters, the ring against MPI's allreduce).
# Env: SIZES (1M..64M), ITERS (20), SEGMENT_KB (1024), OUT (bench/results), NAME (comm_scale),
# TESSERA (build/tessera).
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${REPS:-5} ranks=${RANKS:-2} sizes=${SIZES:-1M..64M} iters=${ITERS:-20}
algorithms=${ALGORITHMS:-mpi,ring,hierarchical} dtypes=${DTYPES:-fp32,bf16} segment_kb=${SEGMENT_KB:-1024}
out=${OUT:-bench/results} name=${NAME:-comm_scale} tessera=${TESSERA:-build/tessera}
mkdir -p "$out"
csv=$out/$name.csv
work=$(mktemp -d /tmp/tessera-comm-scale.XXXXXX)
trap 'rm -rf "$work"' EXIT
echo "rep,transport,algorithm,backend,ranks,bytes,time_us,algbw_gbps,busbw_gbps,reduce_dtype,sent_bytes,cross_node_bytes" >"$csv"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for ((r = 1; r <= reps; r++)); do
  for transport in none cma; do
    OMPI_MCA_btl_vader_single_copy_mechanism=$transport tools/mpirun.sh -n "$ranks" "$tessera" bench comm \
      --algorithms "$algorithms" --reduce-dtypes "$dtypes" --backends mpi --sizes "$sizes" --iters "$iters" \
      --segment-kb "$segment_kb" --csv "$work/run.csv" >"$work/run.out" 2>&1 || { cat "$work/run.out"; exit 1; }
    tail -n +2 "$work/run.csv" | sed "s/^/$r,$transport,/" >>"$csv"
    echo "comm_scale: run $r of $reps, CMA $transport: done" >&2
  done
done
cpu=$(grep -m 1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)
family=$(grep -m 1 'cpu family' /proc/cpuinfo | cut -d: -f2 | xargs) model=$(grep -m 1 '^model\s' /proc/cpuinfo | cut -d: -f2 | xargs)
{
  echo "CPU: $cpu (family $family, model $model), $(nproc) cores shared with other jobs; load average $load_before before, $(cut -d' ' -f1-3 /proc/loadavg) after."
  echo "$ranks ranks, median of $reps runs per row (CMA off and on alternated); time per call in us, busbw in GB/s of the fp32 buffer;"
  echo "sent and cross: bytes per rank and call from the Communicator's counters."
  echo
  echo "| bytes | algorithm | dtype | CMA off us | CMA on us | busbw off | busbw on | sent B | / mpi off | / mpi on |"
  echo "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
  tail -n +2 "$csv" | sort -t, -k7,7g | awk -F, -v p="$ranks" '
    {
      key = $6 "," $3 "," $10; k = key "," $2; t[k, ++n[k]] = $7; keys[key] = 1; sent[key] = $11 }
    function median(k,   c) { c = n[k]; return c % 2 ? t[k, (c + 1) / 2] : (t[k, c / 2] + t[k, c / 2 + 1]) / 2 }
    END {
      for (key in keys) {
        split(key, f, ",")
        off = median(key ",none"); on = median(key ",cma")
        moff = median(f[1] ",mpi," f[3] ",none"); mon = median(f[1] ",mpi," f[3] ",cma")
        bw = 2 * (p - 1) / p * f[1] / 1e3
        printf "| %d | %s | %s | %.0f | %.0f | %.2f | %.2f | %d | %.2f | %.2f |\n", f[1], f[2], f[3], off, on, bw / off, bw / on, sent[key], moff / off, mon / on
      }
    }' | sort -t'|' -k2,2n -k4,4 -k3,3
  echo
  echo "/ mpi: MPI's allreduce time in the same transport and dtype divided by the row's (above 1: faster than MPI's)."
} >"$out/$name.md"
cat "$out/$name.md"
