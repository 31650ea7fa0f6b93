#!/usr/bin/env bash
# Functions shared by peers.sh and mlp_compare.sh. Source it; it runs nothing by itself.
#
# Coretype labels: "Haswell" pins OpenBLAS to its AVX2 kernels (this machine's default
# environment); "unset" removes OPENBLAS_CORETYPE so OpenBLAS picks its own (AVX-512) kernels.
#
# Peer configurations of mlp_torch.py (the name says torch threads, OpenBLAS threads, processes):
#   torch1_ob1   --threads 1, OPENBLAS_NUM_THREADS=1
#   torch1_ob2   --threads 1, OPENBLAS_NUM_THREADS=2
#   torch2_ob2   --threads 2, OPENBLAS_NUM_THREADS=2
#   ddp2_torch1  --ddp 2 --threads 1 (2 gloo processes), OPENBLAS_NUM_THREADS=1 in each

# The Python that has Debian's torch (python3-torch 1.13; the pyenv python3 on PATH lacks it).
PEER_PYTHON=${PEER_PYTHON:-/usr/bin/python3}
# The second peer: a current torch from PyPI in a virtual environment (bench/peer_venv.sh makes
# it). Its wheel carries MKL and oneDNN, so OPENBLAS_CORETYPE does not reach its GEMMs.
PYPI_PEER_PYTHON=${PYPI_PEER_PYTHON:-$(git -C "$(dirname "${BASH_SOURCE[0]}")" rev-parse --show-toplevel 2>/dev/null)/.venv/bin/python}

# \brief Print an error (and a hint, when given) and exit 1.
# \param $1 what is wrong, $2 optional hint
die() {
  echo "error: $1" >&2
  [[ -n "${2:-}" ]] && echo "---> HINT: $2" >&2
  exit 1
}

# \brief Print the folder of the fixed PyTorch peers: ../shared/peers next to the repository,
# else $PEERS_DIR. Fails with a hint when neither holds mlp_torch.py.
peers_dir() {
  local top dir
  top=$(git -C "$(dirname "${BASH_SOURCE[0]}")" rev-parse --show-toplevel 2>/dev/null || true)
  for dir in "${top:+$top/../shared/peers}" "${PEERS_DIR:-}"; do
    if [[ -n "$dir" && -f "$dir/mlp_torch.py" ]]; then
      (cd "$dir" && pwd)
      return 0
    fi
  done
  echo "error: mlp_torch.py not found in ${top:-<no git top>}/../shared/peers nor in PEERS_DIR='${PEERS_DIR:-}'" >&2
  echo "---> HINT: export PEERS_DIR=/path/to/shared/peers" >&2
  return 1
}

# \brief Run a command under a coretype label: "unset" removes OPENBLAS_CORETYPE, anything
# else sets it.
# \param $1 coretype label; the rest: the command.
with_coretype() {
  local coretype=$1
  shift
  if [[ "$coretype" == unset ]]; then
    env -u OPENBLAS_CORETYPE "$@"
  else
    env OPENBLAS_CORETYPE="$coretype" "$@"
  fi
}

# \brief The mlp_torch.py arguments and OPENBLAS_NUM_THREADS of a peer configuration,
# printed as one line: "<openblas threads> <args...>".
peer_config_args() {
  case "$1" in
    torch1_ob1) echo "1 --threads 1" ;;
    torch1_ob2) echo "2 --threads 1" ;;
    torch2_ob2) echo "2 --threads 2" ;;
    ddp2_torch1) echo "1 --ddp 2 --threads 1" ;;
    *)
      echo "error: unknown peer configuration '$1' (allowed: torch1_ob1 torch1_ob2 torch2_ob2 ddp2_torch1)" >&2
      return 1
      ;;
  esac
}

# \brief Run mlp_torch.py once, keep its log, and print "samples_per_s,test_acc" parsed from
# its SUMMARY line. samples_per_s is the SUMMARY's median-epoch figure (global samples/s).
# \param $1 configuration, $2 optimizer (sgd|adam), $3 coretype label, $4 epochs, $5 log file
run_peer_mlp() {
  local config=$1 opt=$2 coretype=$3 epochs=$4 log=$5 dir line ob_threads
  local -a args
  dir=$(peers_dir)
  read -r ob_threads line <<<"$(peer_config_args "$config")"
  read -r -a args <<<"$line"
  if ! with_coretype "$coretype" env OPENBLAS_NUM_THREADS="$ob_threads" \
      "$PEER_PYTHON" "$dir/mlp_torch.py" "${args[@]}" --opt "$opt" --epochs "$epochs" >"$log" 2>&1; then
    echo "error: peer $config/$opt/$coretype failed; see $log" >&2
    tail -n 5 "$log" >&2
    return 1
  fi
  parse_peer_summary "$log"
}

# \brief Print "samples_per_s,test_acc" from the SUMMARY line of an mlp_torch.py log.
parse_peer_summary() {
  local line
  line=$(grep '^SUMMARY' "$1" | tail -n 1) || {
    echo "error: no SUMMARY line in $1" >&2
    return 1
  }
  sed -E 's/.*median-epoch samples\/s=([0-9.]+).*final test_acc=([0-9.]+).*/\1,\2/' <<<"$line"
}

# \brief Succeed when the PyPI peer's Python exists and imports torch.
have_pypi_peer() {
  [[ -x "$PYPI_PEER_PYTHON" ]] && "$PYPI_PEER_PYTHON" -c 'import torch' 2>/dev/null
}

# \brief Run Tessera's GPT deck (inputs/kjv_gpt.toml) for a timing: no evaluation, checkpoint
# or warm-up (the peer has none), metrics every 5 steps; keep the log in bench/results/logs and
# the run in bench/results/tmp; print tokens/s = context x the median samples/s after step 10.
# \param $1 ranks, $2 OpenBLAS threads per rank, $3 coretype label, $4 tag (names the log and
# run), $5 steps; the rest: more `--set k=v` arguments. BUILD_DIR (build) names the build
# (relative to the repository or absolute).
run_tessera_gpt() {
  local ranks=$1 ob_threads=$2 coretype=$3 tag=$4 steps=$5
  shift 5
  local top out log build=${BUILD_DIR:-build}
  top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  [[ $build == /* ]] || build=$top/$build
  out=$top/bench/results/tmp/$tag log=$top/bench/results/logs/$tag.log
  mkdir -p "$(dirname "$out")" "$(dirname "$log")"
  if ! with_coretype "$coretype" env OPENBLAS_NUM_THREADS="$ob_threads" \
      "$top/tools/mpirun.sh" -n "$ranks" "$build/tessera" train "$top/inputs/kjv_gpt.toml" \
      --set "data.path=\"$top/data/corpus.h5\"" --set "train.steps=$steps" \
      --set train.log_every=5 --set eval.every_steps=0 --set eval.at_end=false \
      --set checkpoint.at_end=false --set checkpoint.every_steps=0 --set schedule.warmup_steps=0 \
      --set "run.output_dir=\"$out\"" --set run.overwrite=true "$@" >"$log" 2>&1; then
    echo "error: tessera $tag failed; see $log" >&2
    tail -n 5 "$log" >&2
    return 1
  fi
  "$PEER_PYTHON" - "$out/metrics.csv" <<'PY'
import csv, statistics, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r['kind'] == 'train' and int(r['step']) > 10]
print(f"{128 * statistics.median(float(r['samples_per_s']) for r in rows):.0f}")
PY
}

# \brief Check the REPS and STEPS of a sitting of run_tessera_gpt: at least one repetition, and
# at least 20 steps, since the first 10 are not timed. Exits with an error otherwise.
# \param $1 reps, $2 steps
check_gpt_sitting() {
  [[ "$1" =~ ^[1-9][0-9]*$ ]] || die "REPS='$1' is not a positive integer"
  [[ "$2" =~ ^[0-9]+$ && "$2" -ge 20 ]] || die "STEPS='$2': need at least 20 (10 are warm-up)"
}

# \brief Median of numbers given as arguments.
median() {
  printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {if (NR == 0) exit 1; if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'
}

# \brief The bytes the 4 nodes of the namespace cluster $TESSERA_CLUSTER have received over their
# links so far (the tx_bytes of each node's link device, summed), as the cluster benches count them.
cluster_received_bytes() {
  local n total=0
  for ((n = 1; n <= 4; n++)); do total=$((total + $(cat "/sys/class/net/$TESSERA_CLUSTER-n$n/statistics/tx_bytes"))); done
  echo "$total"
}

# \brief The step-time GPT's settings of offload.sh and zero_prefetch.sh, from the environment:
# reps (REPS, 3), steps (STEPS, 8), warmup (WARMUP, 2), width (WIDTH, 512), layers (LAYERS, 4),
# context (CONTEXT, 128), batch (BATCH, 8). Dies on a REPS, STEPS, WARMUP or LABEL it cannot use.
# shellcheck disable=SC2034  # the variables are the caller's
gpt_step_settings() {
  reps=${REPS:-3}
  steps=${STEPS:-8}
  warmup=${WARMUP:-2}
  width=${WIDTH:-512}
  layers=${LAYERS:-4}
  context=${CONTEXT:-128}
  batch=${BATCH:-8}
  [[ "$reps" =~ ^[1-9][0-9]*$ ]] || die "REPS='$reps' is not a positive integer"
  [[ "${LABEL:-x}" =~ ^[A-Za-z0-9_.-]+$ ]] || die "LABEL='$LABEL': letters, digits, '.', '_' and '-' only"
  [[ "$steps" =~ ^[0-9]+$ && "$warmup" =~ ^[0-9]+$ && "$steps" -gt "$warmup" ]] ||
    die "STEPS='$steps' must be larger than WARMUP='$warmup'"
}
