#!/usr/bin/env bash
# Tokenizer throughput on the KJV (4.4 MB): `tessera prepare text --tokenizer` on 1 and 2 ranks
# (MB/s per rank, the whole command's wall time: start-up, reading, encoding and the parallel
# HDF5 write) against Hugging Face's `tokenizers` (encode_batch over the lines, on all threads
# and on one; one encode() of the whole text), with the same tokenizer.json (tests/data/bpe).
#   bench/tokenizer.sh [VARIANT ...]     # gpt2 llama3 qwen2 (default: all three)
# Environment: TESSERA (build/tessera), HF_PYTHON (a Python with tokenizers from PyPI; without
# one the HF rows are left out: python3 -m venv /tmp/tok && /tmp/tok/bin/pip install tokenizers).
set -euo pipefail
cd "$(dirname "$0")/.."
tessera=${TESSERA:-build/tessera}
hf_python=${HF_PYTHON:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
bible -f Gen1:1-Rev22:21 < /dev/null > "$work/kjv.txt"
bytes=$(stat -c %s "$work/kjv.txt")
variants=("$@")
((${#variants[@]})) || variants=(gpt2 llama3 qwen2)
echo "variant,tool,ranks_or_threads,seconds,mb_per_s_per_rank,tokens"
for v in "${variants[@]}"; do
  tok=tests/data/bpe/$v/tokenizer.json
  for n in 1 2; do
    start=$(date +%s.%N)
    line=$(mpirun -n "$n" "$tessera" prepare text --tokenizer "$tok" --out "$work/$v.h5" "$work/kjv.txt" | tail -1)
    end=$(date +%s.%N)
    tokens=$(echo "$line" | awk '{print $3 + $6}')
    awk -v v="$v" -v n="$n" -v s="$start" -v e="$end" -v b="$bytes" -v t="$tokens" \
      'BEGIN { printf "%s,tessera,%d,%.3f,%.2f,%d\n", v, n, e - s, b / (e - s) / n / 1e6, t }'
  done
  if [[ -n $hf_python ]]; then
    for threads in all 1; do
      if [[ $threads == 1 ]]; then export RAYON_NUM_THREADS=1; else unset RAYON_NUM_THREADS; fi
      "$hf_python" - "$tok" "$work/kjv.txt" "$v" "$threads" <<'PY'
import os, sys, time
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
data = open(sys.argv[2], 'rb').read()
lines = data.decode().splitlines(keepends=True)
start = time.perf_counter()
n = sum(len(e.ids) for e in tok.encode_batch(lines, add_special_tokens=False))
s = time.perf_counter() - start
threads = os.cpu_count() if sys.argv[4] == 'all' else 1
print(f"{sys.argv[3]},hf encode_batch,{threads},{s:.3f},{len(data) / s / 1e6 / threads:.2f},{n}")
if sys.argv[4] == '1':
    start = time.perf_counter()
    n = len(tok.encode(data.decode(), add_special_tokens=False).ids)
    s = time.perf_counter() - start
    print(f"{sys.argv[3]},hf encode (one string),1,{s:.3f},{len(data) / s / 1e6:.2f},{n}")
PY
    done
  fi
done
