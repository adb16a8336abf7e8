"""Helpers shared by the accuracy scripts of ``benchmarks/`` (``po_convergence.py``,
``las_accuracy.py``): per-dataset option parsing, locating or preparing the datasets, and the
mean/std of a list of results. Imported by the scripts run as ``python benchmarks/NAME.py`` (their
own folder is then first on ``sys.path``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

SHARED = Path("/work/shared/datasets")
DEFAULT_DIRS = {"cora": "/tmp/cora", "facebook": "/tmp/fb", "synthetic": None}


def per_dataset(text: str | None, key: str, presets: dict, prog: str, cast=int) -> dict[str, int]:
    """``"N"`` (all datasets) or ``"cora=N,facebook=M"`` -> {dataset: value}; the preset of each
    dataset in ``presets`` (dataset -> {key: value}) otherwise. Bad input exits with one line
    naming ``prog`` and ``--key``."""
    datasets = tuple(presets)
    out = {d: presets[d][key] for d in datasets}
    if not text:
        return out
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "=" in part:
            name, val = part.split("=", 1)
            if name not in datasets:
                raise SystemExit(f"{prog}: error: --{key}: unknown dataset '{name}'")
            out[name] = cast(val)
        else:
            out = {d: cast(part) for d in datasets}
    for d, v in out.items():
        if v < 1:
            raise SystemExit(f"{prog}: error: --{key}: must be >= 1, got {v} for {d}")
    return out


def dataset_dir(name: str, args) -> str:
    """The prepared dataset directory of ``name``: ``args.synthetic_dir`` or the default synthetic
    dataset (generated on first use); ``args.cora_dir`` / ``args.facebook_dir``, prepared from
    ``/work/shared/datasets`` with ``gnnio prepare`` when missing."""
    if name == "synthetic":
        if args.synthetic_dir:
            return args.synthetic_dir
        from gnnio.defaults import default_dataset

        return str(default_dataset(progress=False).path)
    out = args.cora_dir if name == "cora" else args.facebook_dir
    if (Path(out) / "meta.json").exists():
        return out
    if name == "cora":
        cmd = ["planetoid", "--name", "cora", "--root", str(SHARED / "cora")]
    else:
        cmd = ["facebook", "--root", str(SHARED / "facebook_page_page")]
    cmd = [sys.executable, "-m", "gnnio", "prepare", *cmd, "--out", out]
    print("preparing:", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    return out


def mean_std(values) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    v = np.asarray(list(values), dtype=np.float64)
    return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else 0.0
