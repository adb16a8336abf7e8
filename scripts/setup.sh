#!/usr/bin/env bash
# Create (or reuse) .venv/ in the repo root and install gnnio into it.
#   scripts/setup.sh         runtime dependencies
#   scripts/setup.sh --dev   plus the test and lint tools
# torch: if the venv has no torch, the CPU build torch==2.13.0 is installed explicitly (an unpinned
# requirement would pull several GB of CUDA packages). A torch already present is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
extra=""
[ "${1:-}" = "--dev" ] && extra="[dev]"
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
stamp=".venv/.gnnio-installed${extra}"
want=$(sha256sum pyproject.toml | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && .venv/bin/python -c "import gnnio, torch" 2>/dev/null; then
    exit 0
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    echo "setup: installing torch==2.13.0 (CPU build)" >&2
    .venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".${extra}"
echo "$want" > "$stamp"
