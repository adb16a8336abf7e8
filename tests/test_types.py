"""The type check of the package: ``mypy`` over ``gnnio/`` with ``[tool.mypy]`` of
``pyproject.toml`` (the core included, nothing exempted) finds no error. One subprocess, its cache
in a temporary directory; skipped where mypy is not installed (``scripts/setup.sh --dev``
installs it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_finds_no_error_in_the_package(tmp_path):
    pytest.importorskip("mypy", reason="mypy not installed (scripts/setup.sh --dev installs it)")
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"), "--no-pretty"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
