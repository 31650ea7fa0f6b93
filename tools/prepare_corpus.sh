#!/usr/bin/env bash
# The default text corpus: the King James Bible from Debian's bible-kjv-text, printed whole by the
# `bible` reader of bible-kjv (one verse a line, "Ge1:1 In the beginning ...", 31102 verses,
# 4404412 bytes), then byte-tokenized by `tessera prepare text`.
#   tools/prepare_corpus.sh [extra `tessera prepare text` options, e.g. --val-fraction 0.05]
# Writes $DATA_DIR/kjv.txt and $DATA_DIR/corpus.h5 (DATA_DIR defaults to data/). The binary is
# $TESSERA (default build/tessera). tools/setup.sh installs the packages.
set -euo pipefail
cd "$(dirname "$0")/.."
data_dir=${DATA_DIR:-data}
tessera=${TESSERA:-build/tessera}

fail() { echo "prepare_corpus: error: $*" >&2; exit 2; }
command -v bible > /dev/null || fail "no 'bible' command; install bible-kjv and bible-kjv-text (tools/setup.sh does)"
[[ -x $tessera ]] || fail "$tessera: not built; run tools/setup.sh, or set TESSERA=path/to/tessera"
mkdir -p "$data_dir"

# -f turns pretty-printing off: one verse per line, preceded by its reference, no line breaks.
# Gen1:1-Rev22:21 is the whole book. Written to a temporary file, checked, then renamed.
text=$data_dir/kjv.txt
bible -f Gen1:1-Rev22:21 < /dev/null > "$text.tmp"
verses=$(wc -l < "$text.tmp")
if [[ $verses -ne 31102 ]] || ! tail -n 1 "$text.tmp" | grep -q '^Rev22:21 '; then
  rm -f "$text.tmp"
  fail "bible printed $verses verses, expected 31102 ending with Rev22:21"
fi
mv "$text.tmp" "$text"

"$tessera" prepare text --out "$data_dir/corpus.h5" "$@" "$text"
