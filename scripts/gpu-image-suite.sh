#!/usr/bin/env bash
# The test suite and gpu-check's dry run under the versions of the lent GPU machine's image
# (docs/benchmarks.md, "Measured on an H200": Python 3.12, torch 2.11.0 -- its CUDA 13.0 build,
# run here on the CPU --, Triton 3.6.0, numba 0.68.0, NumPy 2.5.2, PyG 2.8.0.post1), on a machine
# without a GPU: what a GPU session would meet there, found before it costs device time.
#   bash scripts/gpu-image-suite.sh VENV [pytest options]
# VENV (made if missing; about 4.6 GB: torch's CUDA build brings the CUDA libraries) holds that
# image's versions and gnnio from this checkout, editable. The gpu tests skip (no CUDA here).
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: bash scripts/gpu-image-suite.sh VENV [pytest options]" >&2
  exit 2
fi
venv=$(realpath -m -- "$1")  # (relative to where it was called, not to the checkout)
shift
cd "$(dirname "$0")/.."
if [ ! -x "$venv/bin/python" ]; then
  PY312=${PYTHON312:-}
  if [ -n "$PY312" ] && ! "$PY312" -c "" 2>/dev/null; then
    echo "gpu-image-suite: PYTHON312=$PY312 does not run" >&2
    exit 2
  fi
  if [ -z "$PY312" ]; then  # (a pyenv shim may exist and still refuse to run)
    for c in python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
      if "$c" -c "" 2>/dev/null; then PY312=$c; break; fi
    done
  fi
  if [ -z "$PY312" ]; then
    echo "gpu-image-suite: no Python 3.12 that runs (set PYTHON312 to one)" >&2
    exit 2
  fi
  "$PY312" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check -e ".[dev]" \
  torch==2.11.0 triton==3.6.0 numba==0.68.0 numpy==2.5.2 torch-geometric==2.8.0.post1
"$venv/bin/python" -c "import sys, torch, triton, numpy; print('gpu-image-suite: Python',
sys.version.split()[0], 'torch', torch.__version__, 'Triton', triton.__version__, 'NumPy',
numpy.__version__)"
"$venv/bin/python" -m pytest -q -rs "$@"
dry=$(mktemp -d)
trap 'rm -rf "$dry"' EXIT
"$venv/bin/python" -m gnnio.bench.gpu_check "$dry/out" --device cpu --nodes 4096 --fb-nodes 4096 \
  --batches 3 --fb-batches 3
