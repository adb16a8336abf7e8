"""Helpers shared by the accuracy scripts of ``benchmarks/`` (``po_convergence.py``,
``las_accuracy.py``): option parsing, locating or preparing the datasets, one timed training run,
the mean/std and paired differences of the results, and writing the JSON and figures. Imported by
the scripts run as ``python benchmarks/NAME.py`` (their own folder is then first on
``sys.path``)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

SHARED = Path("/work/shared/datasets")
DEFAULT_DIRS = {"cora": "/tmp/cora", "facebook": "/tmp/fb", "synthetic": None}


def comma_list(p, text: str, choices, option: str, what: str) -> list[str]:
    """The items of the comma list ``text``; one not in ``choices`` fails with ``p.error``
    (``p``: the script's ``argparse`` parser) naming ``--option`` and the unknown ``what``."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    for t in items:
        if t not in choices:
            p.error(f"--{option}: unknown {what} '{t}' (choose from {', '.join(choices)})")
    return items


def _cast(cast, text: str, prog: str, key: str):
    """``cast(text)``; a value it refuses exits with one line naming ``prog`` and ``--key``."""
    try:
        return cast(text)
    except ValueError:
        raise SystemExit(
            f"{prog}: error: --{key.replace('_', '-')}: not a number: '{text}'"
        ) from None


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
                raise SystemExit(
                    f"{prog}: error: --{key.replace('_', '-')}: unknown dataset '{name}'"
                )
            out[name] = _cast(cast, val, prog, key)
        else:
            out = {d: _cast(cast, part, prog, key) for d in datasets}
    for d, v in out.items():
        if v < 1:
            raise SystemExit(
                f"{prog}: error: --{key.replace('_', '-')}: must be >= 1, got {v} for {d}"
            )
    return out


def dataset_dir(name: str, args) -> str:
    """The prepared dataset directory of ``name``: ``args.synthetic_dir`` or the default synthetic
    dataset (generated on first use); ``args.cora_dir`` / ``args.facebook_dir``, prepared from
    ``/work/shared/datasets`` with ``gnnio prepare`` when missing."""
    if name == "synthetic":
        if args.synthetic_dir:
            return args.synthetic_dir
        from gnnio.train.defaults import default_dataset

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


def dataset_line(name: str, path: str, ds, args, extra: str = "") -> str:
    """The ``== name: ...`` line a script prints before the runs of one dataset (``ds``: the
    loaded dataset; ``extra`` is appended inside the parentheses)."""
    b, ns = args.batch_size[name], args.seeds[name]
    return (
        f"== {name}: {path} ({ds.num_nodes} nodes, {ds.train_idx.size} training seeds, "
        f"batch {b} -> {math.ceil(ds.train_idx.size / b)} batches/epoch, {args.epochs[name]} "
        f"epochs, hidden {args.hidden[name]}, fanouts {args.fanouts}, seeds 0..{ns - 1}{extra})"
    )


def timed_train(path: str, cfg) -> tuple[dict, float, float, list[str]]:
    """``gnnio.train.train(path, cfg)`` -> ``(summary, wall_s, cpu_s, warnings)``: its summary,
    the wall and CPU seconds it took and the distinct messages of the warnings it raised."""
    from gnnio.train import train

    t0, c0 = time.perf_counter(), time.process_time()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s = train(path, cfg)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return s, wall, cpu, sorted({str(w.message) for w in caught})


def paired_diff(diff: float, paired: list[float], tolerance: float) -> dict:
    """The comparison fields of a summary: ``diff_points`` (``diff``, the difference of the
    means), the mean, sample std and standard error of the per-seed differences ``paired``, and
    whether ``|diff| <= tolerance``."""
    pm, ps = mean_std(paired)
    return {
        "diff_points": diff,
        "paired_diff_mean": pm,
        "paired_diff_std": ps,
        "paired_diff_sem": ps / math.sqrt(len(paired)) if paired else 0.0,
        "within_tolerance": bool(abs(diff) <= tolerance),
    }


def write_json(path: str, **fields) -> None:
    """Write ``{"command": this script's command line, **fields}`` to ``path`` as JSON (parent
    folders created) and say so."""
    obj = {"command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]), **fields}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(obj, indent=1, default=str) + "\n")
    print("wrote", path)


def pyplot():
    """``matplotlib.pyplot`` on the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str) -> None:
    """Lay out ``fig``, save it to ``path`` (parent folders created, 110 dpi) and close it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_record(s: dict, name: str, variant: str, seed: int, compute_s, wall: float, cpu: float,
               warns: list[str]) -> dict:  # fmt: skip
    """One training run's record (both accuracy scripts): the summary ``s``'s accuracies, bytes
    and rows per epoch, and a per-epoch history of loss, accuracies, bytes, rows and compute."""
    hist = []
    for h in s["history"]:
        rec = {k: h[k] for k in ("epoch", "loss", "train_acc", "valid_acc", "test_acc")}
        rec["host_bytes"] = int(h["bytes_by_tier"].get("host", 0))
        rec["gpu_bytes"] = int(h["bytes_by_tier"].get("gpu", 0))
        rec["rows"] = int(sum(h.get("rows_by_tier", {}).values()))
        rec["batches"] = int(h["batches"])
        rec["compute_s"] = h["breakdown_s"]["compute"]
        for k in ("locality_scale", "loading_share", "loading_share_kind"):
            if k in h:
                rec[k] = h[k]
        hist.append(rec)
    n = max(len(hist), 1)
    return {
        "dataset": name,
        "variant": variant,
        "seed": seed,
        "test_acc": s["test_acc"],
        "best_valid_acc": s["best_valid_acc"],
        "best_epoch": s["best_epoch"],
        "last_test_acc": hist[-1]["test_acc"] if hist else 0.0,
        "batches_per_epoch": s["batches_per_epoch"],
        "host_bytes_per_epoch": s["bytes_by_tier"].get("host", 0) / n,
        "gpu_bytes_per_epoch": s["bytes_by_tier"].get("gpu", 0) / n,
        "bytes_per_epoch": sum(s["bytes_by_tier"].values()) / n,
        "rows_per_batch": sum(h["rows"] for h in hist) / max(sum(h["batches"] for h in hist), 1),
        "sampling": s.get("sampling"),
        "locality_compute_s": compute_s,
        "data_setup": s.get("data_setup"),
        "epoch_time_s": s["epoch_time_s"],
        "wall_s": wall,
        "cpu_s": cpu,
        "warnings": warns,
        "history": hist,
    }
