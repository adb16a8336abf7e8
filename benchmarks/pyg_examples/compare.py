"""Run the PyG-style scripts of ``examples/pyg/`` twice each: as written (PyG's ``NeighborLoader``
on the pyg-lib stand-in of ``standin.py``) and with the one import line changed to
``from gnnio.pyg import NeighborLoader``; report the edits, whether each ran, and test accuracy.
Also counts, on the dataset, the batches of ``list(loader)`` whose ``x`` differs from the source
rows, for gnnio's ``NeighborLoader`` and ``PyGLoader`` with their defaults.

    python benchmarks/pyg_examples/compare.py --raw /work/shared/datasets/cora --repeats 3 --json

Prints a line per run and, last, one JSON object (``--json``).
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
PYG_IMPORT = "from torch_geometric.loader import NeighborLoader\n"
GNNIO_IMPORT = "from gnnio.pyg import NeighborLoader\n"
#: script, its arguments (Cora-sized runs; ``{repeat}`` becomes the repeat's seed, ``--first-seed``
#: plus its number, for scripts that seed themselves)
SCRIPTS = [
    ("reddit_sage.py", ["--epochs", "10"]),
    ("hierarchical_sage.py", ["--epochs", "10"]),
    ("ogbn_models.py", ["--epochs", "10", "--model", "sgformer", "--seed", "{repeat}"]),
    ("distributed_sage.py", ["--epochs", "10", "--world_size", "2", "--seed", "{repeat}"]),
]


def free_port() -> int:
    """A port for the script's ranks to bind (``MASTER_PORT``), reserved until they do
    (:func:`gnnio.utils.ports.reserved_port`)."""
    from gnnio.utils.ports import reserved_port

    return reserved_port()


def planetoid_root(raw: Path, name: str, work: Path) -> Path:
    """A Planetoid root whose ``<name>/raw`` links the raw files (PyG processes into it)."""
    d = work / "planetoid" / name / "raw"
    d.mkdir(parents=True, exist_ok=True)
    for f in raw.iterdir():
        if f.name.startswith("ind."):
            (d / f.name).unlink(missing_ok=True)
            (d / f.name).symlink_to(f)
    return work / "planetoid"


def run_one(script: Path, args: list[str], loader: str, work: Path, root: Path) -> dict:
    text = script.read_text()
    if loader == "gnnio":
        text = text.replace(PYG_IMPORT, GNNIO_IMPORT)
    copy = work / f"{loader}_{script.name}"
    copy.write_text(text)
    edits = sum(
        1
        for line in difflib.unified_diff(script.read_text().splitlines(), text.splitlines(), n=0)
        if line.startswith("+") and not line.startswith("+++")
    )
    env = dict(os.environ, OMP_NUM_THREADS="1", GNNIO_CACHE=str(work / "gnnio-cache"),
               MASTER_PORT=str(free_port()), PYTHONWARNINGS="ignore")  # fmt: skip
    if loader == "pyg":
        env["PYTHONPATH"] = str(HERE)
        env["GNNIO_PYG_STANDIN"] = "1"
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, str(copy), "--root", str(root), *args], env=env,
                       capture_output=True, text=True, timeout=900, cwd=work)  # fmt: skip
    out = {"script": script.name, "loader": loader, "edits_beyond_import": max(edits - 1, 0),
           "rc": r.returncode, "wall_s": round(time.perf_counter() - t0, 1)}  # fmt: skip
    if r.returncode == 0:
        out.update(json.loads(r.stdout.strip().splitlines()[-1]))
        out["script"] = script.name
    else:
        out["error"] = r.stderr.strip().splitlines()[-1:]
    return out


def kept_batches(root: Path, name: str, work: Path) -> dict:
    """Batches of ``list(loader)`` (batch size 64, fanouts 25,10, shuffled, all nodes) whose ``x``
    differs from ``data.x[n_id]``, with each loader's defaults."""
    os.environ["GNNIO_CACHE"] = str(work / "gnnio-cache")
    import torch
    from torch_geometric.datasets import Planetoid

    from gnnio.importers.pyg import from_pyg
    from gnnio.pyg import NeighborLoader, PyGLoader

    data = Planetoid(str(root), name)[0]
    ds = from_pyg(data, work / "kept-ds", overwrite=True, progress=False)
    out = {}
    loaders = {
        "NeighborLoader": NeighborLoader(data, [25, 10], batch_size=64, shuffle=True),
        "PyGLoader": PyGLoader(ds, [25, 10], batch_size=64, shuffle=True),
        "PyGLoader(reuse_buffers=True)": PyGLoader(
            ds, [25, 10], batch_size=64, shuffle=True, reuse_buffers=True
        ),  # fmt: skip
    }
    for label, loader in loaders.items():
        batches = list(loader)
        bad = sum(not torch.equal(b.x, data.x[b.n_id]) for b in batches)
        out[label] = {"batches": len(batches), "differ": bad}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--raw", type=Path, default=Path("/work/shared/datasets/cora"))
    p.add_argument("--name", default="Cora")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--first-seed", type=int, default=0, help="seed of the first repeat")
    p.add_argument("--scripts", default="", help="comma-separated subset of script names")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    names = [name for name, _ in SCRIPTS]
    unknown = [s for s in a.scripts.split(",") if s.strip() and s.strip() not in names]
    if unknown:  # else a typo ran no script and reported an empty "scripts"
        p.error(f"--scripts: unknown script '{unknown[0]}' (choose from {', '.join(names)})")
    if a.repeats < 1:
        p.error(f"--repeats: must be >= 1, got {a.repeats}")
    with tempfile.TemporaryDirectory(prefix="pyg-examples-") as tmp:
        work = Path(tmp)
        root = planetoid_root(a.raw, a.name, work)
        runs = []
        picked = {s.strip() for s in a.scripts.split(",") if s.strip()}
        chosen = [s for s in SCRIPTS if not picked or s[0] in picked]
        for rep in range(a.repeats):
            for name, args in chosen:
                args = [x.replace("{repeat}", str(a.first_seed + rep)) for x in args]
                for loader in ("pyg", "gnnio"):
                    r = run_one(ROOT / "examples" / "pyg" / name, args, loader, work, root)
                    runs.append(r)
                    print(json.dumps(r), file=sys.stderr, flush=True)
        kept = kept_batches(root, a.name, work)
    summary = {}
    for name, _ in chosen:
        row = {}
        for loader in ("pyg", "gnnio"):
            rs = [r for r in runs if r["script"] == name and r["loader"] == loader]
            accs = [r["test_acc"] for r in rs if r["rc"] == 0]
            row[loader] = {"runs": len(rs), "ok": len(accs),
                           "edits_beyond_import": max(r["edits_beyond_import"] for r in rs),
                           "test_acc_mean": round(statistics.mean(accs), 4) if accs else None,
                           "test_accs": [round(x, 4) for x in accs]}  # fmt: skip
        if row["pyg"]["test_acc_mean"] is not None and row["gnnio"]["test_acc_mean"] is not None:
            row["gnnio_minus_pyg_points"] = round(
                100 * (row["gnnio"]["test_acc_mean"] - row["pyg"]["test_acc_mean"]), 2
            )
        summary[name] = row
    result = {"dataset": a.name, "repeats": a.repeats, "scripts": summary, "kept_batches": kept}
    if a.json:
        print(json.dumps(result))
    else:
        print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
