"""The type check of the package: ``mypy`` over ``gnnio/`` with ``[tool.mypy]`` of
``pyproject.toml`` (the core included, nothing exempted) finds no error. One subprocess; its
cache is the checkout's ``.mypy_cache/`` (mypy's default, ignored by git): a cold check reads
torch's and numpy's stubs for ~15 s of CPU, a warm one only what changed (mypy checks every
cached module's source hash, so an error is found as in a cold run); skipped where mypy is not
installed (``scripts/setup.sh --dev`` installs it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_finds_no_error_in_the_package():
    pytest.importorskip("mypy", reason="mypy not installed (scripts/setup.sh --dev installs it)")
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(ROOT / ".mypy_cache"), "--no-pretty"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
