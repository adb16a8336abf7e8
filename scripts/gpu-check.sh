#!/usr/bin/env bash
# One command for whoever has a GPU (issue 15): the gpu tests, a CPU-vs-CUDA training comparison
# and the GPU benchmarks, under 10 minutes, into OUTDIR/report.json and OUTDIR/report.md.
# Without CUDA it prints one line saying so and exits 0. See gnnio/bench/gpu_check.py.
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: bash scripts/gpu-check.sh OUTDIR [gpu_check options]" >&2
  exit 2
fi
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
exec "$PY" -m gnnio.bench.gpu_check "$@"
