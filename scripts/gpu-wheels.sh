#!/usr/bin/env bash
# Wheels a lent GPU machine lacks, for gpu-check (docs/benchmarks.md, "On a lent device machine"):
# pymetis (METIS placement and partitions), pytest-xdist + execnet (the gpu tests on several
# workers) and pytest-timeout (the suite's per-test limit, pyproject.toml), downloaded for that
# machine's Python (3.12 by default) into .whl/ (git ignores it; carry it with the device call).
# Usage: bash scripts/gpu-wheels.sh [PYTHON_VERSION]
set -euo pipefail
cd "$(dirname "$0")/.."
py="${1:-3.12}"
tmp=$(mktemp -d)  # (outside the tree: a killed run leaves nothing in it)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --only-binary=:all: --no-deps --python-version "$py" \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform any \
    -d "$tmp" "pymetis==2025.2.2" "pytest-xdist==3.8.0" "execnet==2.1.2" \
    "pytest-timeout==2.4.0"
rm -rf .whl && mv "$tmp" .whl
trap - EXIT
ls .whl
