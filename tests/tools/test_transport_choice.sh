#!/usr/bin/env bash
# tools/choose_transport.sh writes a transport file from a (tiny) measurement of both settings,
# and tools/mpirun.sh follows it: the file's setting where it was measured on this CPU model, the
# caller's OMPI_MCA_btl_vader_single_copy_mechanism over it, "none" without a file, with a
# malformed one or one from another CPU (with a note).
# Environment (tests/tools/CMakeLists.txt): TESSERA_BINARY, SOURCE_DIR, WORK_DIR.
set -euo pipefail
: "${TESSERA_BINARY:?} ${SOURCE_DIR:?} ${WORK_DIR:?}"
work=$WORK_DIR/transport
rm -rf "$work"
mkdir -p "$work"
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
# The setting the ranks of `mpirun.sh` see, with transport file $1.
# shellcheck disable=SC2016  # the rank's shell expands it
seen() { TESSERA_TRANSPORT_FILE=$1 "$SOURCE_DIR/tools/mpirun.sh" -n 1 sh -c 'echo "$OMPI_MCA_btl_vader_single_copy_mechanism"'; }

file=$work/transport
TESSERA=$TESSERA_BINARY "$SOURCE_DIR/tools/choose_transport.sh" --reps 1 --sizes 4K..16K --iters 2 --out "$file" \
  >"$work/choose.out" 2>&1 || { cat "$work/choose.out"; fail "choose_transport.sh failed"; }
grep -q '^mpi .*4096' "$work/choose.out" || fail "no side-by-side row for mpi at 4 KB: $(cat "$work/choose.out")"
grep -q '^ring .*16384' "$work/choose.out" || fail "no side-by-side row for ring at 16 KB"
chosen=$(sed -n 's/^OMPI_MCA_btl_vader_single_copy_mechanism=//p' "$file")
[[ $chosen == cma || $chosen == none ]] || fail "the file holds no valid setting: $(cat "$file")"
[[ $(seen "$file") == "$chosen" ]] || fail "mpirun.sh did not follow the file's $chosen"
echo "ok: choose_transport.sh chose $chosen, mpirun.sh follows it"

cpu=$(sed -n 's/^cpu=//p' "$file")
printf 'cpu=%s\nOMPI_MCA_btl_vader_single_copy_mechanism=cma\n' "$cpu" >"$work/cma"
[[ $(seen "$work/cma") == cma ]] || fail "cma from the file not taken"
[[ $(OMPI_MCA_btl_vader_single_copy_mechanism=none seen "$work/cma") == none ]] || fail "the caller's setting lost"
printf 'cpu=Another CPU\nOMPI_MCA_btl_vader_single_copy_mechanism=cma\n' >"$work/other"
[[ $(seen "$work/other" 2>"$work/note") == none ]] || fail "a file from another CPU was taken"
grep -q "ignoring $work/other" "$work/note" || fail "no note about the other CPU's file"
printf 'cpu=%s\nOMPI_MCA_btl_vader_single_copy_mechanism=cma; rm -rf /\n' "$cpu" >"$work/bad"
[[ $(seen "$work/bad" 2>/dev/null) == none ]] || fail "a malformed setting was taken"
[[ $(seen "$work/absent") == none ]] || fail "no file: not the default none"
echo "PASS: transport file written, followed, overridden and refused as documented"
