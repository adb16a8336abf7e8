#!/usr/bin/env bash
# A lent GPU machine's one call (docs/benchmarks.md, "On a lent device machine"), in one line:
#   bash scripts/gpu-session.sh COMMIT [gpu_check options]
# installs the carried wheels (.whl/, from scripts/gpu-wheels.sh; carry it with the call) into
# /tmp/site, writes `pip list` and `nvidia-smi` to $OUT (the folder the call returns), then runs
# gpu-check into /tmp/gc with its reports copied to $OUT after every step (--budget-s 540 unless
# BUDGET_S says otherwise). Overrides: PYTHON (default: the checkout's .venv, else python3),
# WHEELS (.whl), SITE (/tmp/site), GC_DIR (/tmp/gc: datasets of GBs, kept off $OUT).
set -euo pipefail
if [ $# -lt 1 ] || [ -z "${OUT:-}" ]; then
  echo "usage: OUT=DIR bash scripts/gpu-session.sh COMMIT [gpu_check options]" >&2
  exit 2
fi
commit=$1
shift
cd "$(dirname "$0")/.."
py="${PYTHON:-}"
if [ -z "$py" ]; then  # (as gpu-check.sh picks it: the checkout's .venv, else python3)
  if [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi
fi
wheels="${WHEELS:-.whl}"
site="${SITE:-/tmp/site}"
mkdir -p "$OUT"
if compgen -G "$wheels/*.whl" >/dev/null; then
  if "$py" -m pip install -q --no-index --no-deps --target "$site" "$wheels"/*.whl; then
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  else  # (wheels for another Python: gpu-check still runs, and reports what it lacks)
    echo "gpu-session: the wheels in $wheels did not install (above); going on without them" >&2
  fi
fi
"$py" -m pip list > "$OUT/pip-list.txt" 2>&1 || true
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
PYTHON="$py" exec bash scripts/gpu-check.sh "${GC_DIR:-/tmp/gc}" --report-dir "$OUT" \
  --commit "$commit" --budget-s "${BUDGET_S:-540}" "$@"
