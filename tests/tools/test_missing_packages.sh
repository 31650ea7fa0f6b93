#!/usr/bin/env bash
# A tool whose Python package is missing says so in one line and exits 2 (tools/require.py), as on
# a training-only machine (tools/quickstart.sh): every Python tool of tools/ and the bench/ peers
# the docs use, with each of its third-party packages made unimportable in turn (a module of that
# name, first on PYTHONPATH, that raises ModuleNotFoundError as a missing one does).
# Environment (tests/tools/CMakeLists.txt): TOOLS_PYTHON, SOURCE_DIR, WORK_DIR.
set -euo pipefail
: "${TOOLS_PYTHON:?} ${SOURCE_DIR:?} ${WORK_DIR:?}"
work=$WORK_DIR/missing_packages
rm -rf "$work"
mkdir -p "$work"
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# The Debian package tools/setup.sh installs for a module, and the install line's command.
debian() { echo "python3-$1"; }
install_re() {
  case $1 in
    transformers) echo 'python3 -m venv --system-site-packages VENV && VENV/bin/pip install transformers==[0-9.]+, .*' ;;
    *) echo "(sudo )?apt-get install $(debian "$1")" ;;
  esac
}

# expect_missing MODULE TOOL_NAME SCRIPT [ARGS...]: SCRIPT, with MODULE hidden, prints exactly
# "TOOL_NAME: error: needs the Python package MODULE (...); install it: COMMAND" and exits 2.
expect_missing() {
  local module=$1 name=$2 script=$3
  shift 3
  local hide=$work/hide-$module got=0
  mkdir -p "$hide"
  printf 'raise ModuleNotFoundError("No module named %s (hidden by the test)", name="%s")\n' \
    "'$module'" "$module" >"$hide/$module.py"
  PYTHONPATH=$hide "$TOOLS_PYTHON" "$SOURCE_DIR/$script" "$@" >"$work/out.txt" 2>&1 || got=$?
  local out
  out=$(cat "$work/out.txt")
  ((got == 2)) || fail "$script without $module: exit $got, expected 2; it printed: $out"
  [[ $(wc -l <"$work/out.txt") -eq 1 ]] || fail "$script without $module: not one line: $out"
  [[ $out =~ ^$name:\ error:\ needs\ the\ Python\ package\ $module\ \(.*\)\;\ install\ it:\ $(install_re "$module")$ ]] ||
    fail "$script without $module: unexpected line: $out"
  echo "ok: $script without $module: $out"
}

# Packages each tool imports at its start. compare_checkpoints imports h5py first, which imports
# numpy: without numpy, the line names numpy (the dependency), not h5py.
expect_missing h5py compare_checkpoints tools/compare_checkpoints.py a.h5 b.h5
expect_missing numpy compare_checkpoints tools/compare_checkpoints.py a.h5 b.h5
expect_missing matplotlib plot_metrics tools/plot_metrics.py run --out x.png
expect_missing h5py plot_checkpoints tools/plot_checkpoints.py run --out x.png
expect_missing numpy plot_checkpoints tools/plot_checkpoints.py run --out x.png
expect_missing matplotlib plot_checkpoints tools/plot_checkpoints.py run --out x.png
expect_missing h5py load_export tools/load_export.py eval x.safetensors
expect_missing numpy load_export tools/load_export.py eval x.safetensors
expect_missing torch load_export tools/load_export.py eval x.safetensors
expect_missing h5py unet_torch bench/unet_torch.py
expect_missing torch unet_torch bench/unet_torch.py
expect_missing torch peer_amp bench/peer_amp.py peer.py
expect_missing numpy gpt_torch tools/gpu/gpt_torch.py
expect_missing torch gpt_torch tools/gpu/gpt_torch.py

# Packages needed by one path only: metrics.h5 (h5py), hf-generate and eval of a Hugging Face
# directory (transformers).
mkdir -p "$work/run"
: >"$work/run/metrics.h5"
expect_missing h5py plot_metrics tools/plot_metrics.py "$work/run/metrics.h5" --out "$work/x.png"
expect_missing transformers load_export tools/load_export.py hf-generate "$work/run" --prompt x
expect_missing transformers load_export tools/load_export.py eval "$work/run" --data x.h5
echo "PASS: every tool names its missing package and the command that installs it, and exits 2"
