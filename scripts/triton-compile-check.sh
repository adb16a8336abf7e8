#!/usr/bin/env bash
# Compile every Triton kernel launch the CPU tests make for an H100/H200 (sm_90), with the GPU
# image's Triton, on a machine without a GPU. On the CPU the tests run Triton's interpreter, which
# never compiles: a kernel the GPU's compiler refuses (Triton 3.6's layout passes, ptxas) passes
# here and fails on the device (df594f2: the tiered copy's masks). This step is the device's
# compile, minutes here instead of a GPU session:
#   bash scripts/triton-compile-check.sh [TRITON_VERSION]   (default 3.6.0, the GPU image's)
# 1. installs that Triton into a temporary --target directory (not the venv; TRITON_TARGET=DIR
#    keeps and reuses one), 2. runs the test files that launch gnnio's kernels in the interpreter
#    (the venv's Triton) with tests/triton_record.py recording each launch's argument specs,
# 3. compiles each for sm_90 under TRITON_VERSION through tests/triton_sm90.py's fake driver (no
#    CUDA; Triton's own ptxas), as recorded and with integers > 2^31; WIDTHS=1,3,... also compiles
#    the row gathers at those widths in words. Prints a line per kernel; exit 1 on any failure.
# PYTHON: the venv's (default .venv/bin/python). KEEP=DIR keeps the recording (and Triton) in DIR
# and, once there, compiles it again without running the tests (after a kernel change: rerun).
# On the 2-core VM (2026-11-29): 6-7.5 min, recording 2.5-3.7 min, compiling 3-3.5 min (28
# kernels, ~700 launches, ~1390 compiles); WIDTHS=1,3,100 adds ~1 min (2664 compiles).
set -euo pipefail
version=${1:-3.6.0}
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
if [ -n "${KEEP:-}" ]; then
  mkdir -p "$KEEP"
  work=$(realpath "$KEEP")
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
target=${TRITON_TARGET:-$work/triton}
if ! PYTHONPATH=$target "$py" -c "import sys, triton; sys.exit(triton.__version__ != '$version')" \
  2>/dev/null; then
  "$py" -m pip install -q --disable-pip-version-check --no-deps --upgrade --target "$target" \
    "triton==$version"
fi
mapfile -t files < <(grep -l "run_in_triton_interpreter" tests/test_*.py)
if [ -n "${KEEP:-}" ] && [ -f "$work/recorded" ]; then
  echo "triton-compile-check: the launches recorded in $work (rm -r it to record again)"
else
  echo "triton-compile-check: recording the launches of ${#files[@]} test files"
  rm -f "$work"/launches.*
  GNNIO_TRITON_RECORD=$work/launches PYTHONPATH=$PWD "$py" -m pytest -q -p no:cacheprovider \
    -p tests.triton_record "${files[@]}" >"$work/pytest.log" 2>&1 || {
    tail -30 "$work/pytest.log"
    echo "triton-compile-check: the tests failed (above); nothing compiled" >&2
    exit 1
  }
  tail -1 "$work/pytest.log"
  touch "$work/recorded"
fi
rc=0  # (the compiler's own messages -- MLIR dumps -- go to a log; its error lines are shown)
rm -rf "$work/cache"
TRITON_CACHE_DIR=$work/cache PYTHONPATH=$target:$PWD "$py" -W ignore::UserWarning \
  -m tests.triton_sm90 "$work/launches" ${WIDTHS:+--widths "$WIDTHS"} 2>"$work/compile.log" || rc=$?
if [ "$rc" != 0 ]; then
  grep -E "error:|Error" "$work/compile.log" | sort | uniq -c | sort -rn | head -20 >&2 || true
fi
exit "$rc"
