#!/usr/bin/env bash
# Groups a fuzz target's findings by what went wrong: replays each input through the fuzz build's
# target and prints one line per distinct report (the finding's message, the sanitizer's summary,
# a timeout or an out-of-memory with the innermost frame in Tessera's code), with how many inputs
# gave it and the smallest of them (docs/robustness.md).
#   tests/fuzz/triage.sh TARGET [FILE_OR_DIR...]   (default: build-fuzz/findings/TARGET)
# Environment: TESSERA_FUZZ_TIMEOUT (seconds before an input counts as a hang, 10),
# TESSERA_FUZZ_IGNORE (as for the targets).
set -euo pipefail
cd "$(dirname "$0")/../.."
target=$1
shift
build=${TESSERA_FUZZ_BUILD:-build-fuzz}
inputs=("$@")
((${#inputs[@]})) || inputs=("$build/findings/$target")
export ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1
export OPENBLAS_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# One line that names the report: digits and temporary paths made generic so equal reports match.
report_key() {
  local log=$1 line frame
  line=$(grep -m1 -E '^fuzz finding: |runtime error: |^SUMMARY: AddressSanitizer|ERROR: libFuzzer: (timeout|out-of-memory)' "$log" || true)
  frame=$(grep -E '^ +#[0-9]+ .* in .*/(src|io|kernels)/' "$log" | grep -v fuzz_target | head -1 |
    sed -E 's/.* in ([^ ]+).* ([^ ]+:[0-9]+).*/\1 \2/' || true)
  [[ -n $line ]] || line="no report (exit status only)"
  line=$(sed -E -e 's#/dev/shm/tessera-fuzz-[0-9-]+\.[a-z0-9]+#FILE#g' -e 's/==[0-9]+==//' \
    -e 's/0x[0-9a-f]+/ADDR/g' -e 's/[0-9]+/N/g' <<<"$line")
  case $line in
    *timeout* | *out-of-memory* | *"deadly signal"* | *SUMMARY*) echo "$line [$frame]" ;;
    *) echo "$line" ;;
  esac
}

declare -A count smallest size
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
while IFS= read -r -d '' file; do
  timeout 120 "$build/tests/fuzz/fuzz_$target" -timeout="${TESSERA_FUZZ_TIMEOUT:-10}" "$file" >"$tmp" 2>&1 || true
  key=$(report_key "$tmp")
  bytes=$(stat -c %s "$file")
  count[$key]=$((${count[$key]:-0} + 1))
  if [[ -z ${size[$key]:-} || $bytes -lt ${size[$key]} ]]; then
    size[$key]=$bytes
    smallest[$key]=$file
  fi
done < <(find "${inputs[@]}" -type f -print0)
for key in "${!count[@]}"; do
  printf '%4d  %s\n      e.g. %s (%s bytes)\n' "${count[$key]}" "$key" "${smallest[$key]}" "${size[$key]}"
done
