"""The one-command GPU check: ``bash scripts/gpu-check.sh OUTDIR`` (``python -m
gnnio.bench.gpu_check OUTDIR``).

Whoever has a GPU runs this first. In under ten minutes on one GPU it runs, each step bounded by
what is left of the budget, a failure in one step recorded and the next one run:

1. ``gpu_tests``: the ``gpu``-marked tests (``pytest -m gpu``);
2. ``cpu_vs_cuda``: the same small training run on the CPU and on CUDA: ``bytes_by_tier`` must be
   identical, per-epoch losses close (no dropout; floating-point order only);
3. ``dataset``: a synthetic 2^21-node graph (``--nodes``), reordered by ``wrpr``, small
   valid/test splits so that evaluation stays cheap;
4. ``bandwidth``: ``gnnio bench tiers --device cuda --bandwidth``: UVA (zero-copy) gather against
   the pinned host->device copy, GPU-tier gather against a device-to-device copy;
5. ``sampling``: ``gnnio bench sampling`` on the GPU and on the CPU (all cores), and the GPU
   sampler reading the CSR from pinned host memory (UVA): edges/s;
6. ``loader``: ``gnnio bench loader --device cuda`` with the store in host memory and on the GPU,
   and with the store and the sampler on the GPU;
7. ``epochs``: ``gnnio train --device cuda --gpu-cache-fraction F`` at 0 / 5 / 10 / 25 % hot:
   epoch time, breakdown, ``hidden_fraction``, bytes per tier;
8. ``cache``: ``benchmarks/cache_overhead.py --device cuda``: management ms per batch of the
   cache policies on the GPU (issue 18: the lookahead cache's overhead against LRU's), and the
   hit ratios; the ``sampling`` step also compares the GPU's batch ``checksum`` with the CPU's
   (counter-based sampling: bit-identical batches);

9. ``nccl`` (issue 26, :mod:`gnnio.bench.gpu_nccl`): every distributed mode (sharded store per
   placement strategy, partitioned dsp/shared sampling with and without pruning, DDP training
   with evaluation, checkpoints and resume) on NCCL at world size 1, each tensor checked against
   NCCL's rules and each group against one thread; and two ranks on the one GPU sampling in
   ``shared`` mode with their shards shared by CUDA IPC (:mod:`gnnio.bench.gpu_ipc`);
   ``goals.nccl_modes_failed`` (goal 0);

then writes ``OUTDIR/report.json`` (everything), ``OUTDIR/gpu_tests.log`` (pytest's output) and ``OUTDIR/report.md`` (the figures against the
goals of issue 15). Without CUDA it prints one line saying no GPU is present and exits 0;
``--device cpu`` runs the same steps on the CPU instead (a dry run of the plumbing, used by the
tests; its numbers are not GPU figures).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .gpu_check_epoch import (
    kernel_fallbacks,
    step_epoch_default,
    step_feature_bound,
    step_train_step,
)
from .gpu_nccl import step_nccl

__all__ = ["GOALS", "main", "write_markdown"]

#: issues 15 and 24's goals: (name, what is measured, threshold); a value meets its goal when it
#: is >= the threshold, except the names in AT_MOST (<=)
GOALS = [
    ("uva_gather", "zero-copy gather / pinned host->device copy", 0.80),
    ("gpu_tier_gather", "GPU-tier gather / device-to-device copy", 0.80),
    ("gpu_sampling", "GPU sampler edges/s / CPU sampler edges/s", 10.0),
    ("uva_sampling", "UVA sampler (CSR in pinned host memory) edges/s / CPU edges/s", 4.0),
    ("tiering_speedup", "epoch time at 0 % hot / at 10 % hot", 1.6),
    ("lookahead_overhead", "LRU management ms / lookahead management ms (GPU cache)", 1.0),
    (
        "train_step_ms",
        "forward + backward + optimizer ms per batch, 2^21 graph, default model",
        3.0,
    ),
    ("epoch_s", "warm epoch seconds, 2^21 graph, default options on CUDA", 1.0),
    (
        "tiering_speedup_feature_bound",
        "feature-bound graph: ms per batch at 0 % / at 10 % hot",
        1.6,
    ),
    ("kernel_fallbacks", "runs of this check that fell back from a Triton kernel", 0),
    ("nccl_modes_failed", "distributed modes failing (NCCL at world size 1; CUDA IPC, 2 ranks)", 0),
]
AT_MOST = {"train_step_ms", "epoch_s", "kernel_fallbacks", "nccl_modes_failed"}


class Check:
    """Options, the clock and the report of one run."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.outdir)
        self.device = args.device
        self.t0 = time.monotonic()
        self.report: dict[str, Any] = {"steps": {}, "goals": {}}
        self.data = self.out / "data" / f"syn{args.nodes}"

    def left_s(self) -> float:
        return self.args.budget_s - (time.monotonic() - self.t0)

    def gnnio(self, *argv: str, limit_s: float = 300.0) -> dict[str, Any]:
        """Run ``gnnio ARGV --json`` in a subprocess; its last stdout line, parsed."""
        cmd = [sys.executable, "-m", "gnnio", *argv]
        r = subprocess.run(
            cmd, capture_output=True, text=True, timeout=max(5.0, min(limit_s, self.left_s()))
        )
        if r.returncode != 0:
            tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
            raise RuntimeError(f"{' '.join(argv[:2])} exited {r.returncode}: {' | '.join(tail)}")
        lines = [ln for ln in r.stdout.strip().splitlines() if ln.startswith("{")]
        return json.loads(lines[-1]) if lines else {}


def step_env(c: Check) -> dict[str, Any]:
    import torch

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cpus": os.cpu_count(),
        "device": c.device,
    }
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    return env


def step_gpu_tests(c: Check) -> dict[str, Any]:
    tests = Path(__file__).resolve().parents[2] / "tests"
    if not tests.is_dir():
        return {"skipped": "no tests/ next to the package (installed, not a checkout)"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", str(tests)]
    r = subprocess.run(
        cmd, capture_output=True, text=True, timeout=max(5.0, min(300.0, c.left_s() - 240))
    )
    (c.out / "gpu_tests.log").write_text(r.stdout + r.stderr)  # the tracebacks of any failure
    last = (r.stdout.strip().splitlines() or [""])[-1]
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)", last)}
    failed = [ln for ln in r.stdout.splitlines() if ln.startswith(("FAILED", "ERROR"))]
    return {"summary": last, "counts": counts, "failed": failed, "returncode": r.returncode}


def step_cpu_vs_cuda(c: Check) -> dict[str, Any]:
    from ..importers.synthetic import prepare_synthetic
    from ..train import TrainConfig, train

    path = c.out / "data" / "small"
    if not path.exists():
        prepare_synthetic(path, num_nodes=1 << 14, avg_degree=8, feat_dim=32, num_classes=4,
                          seed=0, progress=False)  # fmt: skip
    kw = dict(fanouts=(5, 5), batch_size=256, epochs=2, hidden=32, dropout=0.0, progress=False,
              gpu_cache_fraction=0.1)  # fmt: skip
    runs = {d: train(path, TrainConfig(device=d, **kw)) for d in ("cpu", c.device)}
    a, b = runs["cpu"], runs[c.device]
    rel = max(
        abs(x["loss"] - y["loss"]) / max(abs(x["loss"]), 1e-12)
        for x, y in zip(a["history"], b["history"])
    )
    return {
        "bytes_by_tier": {"cpu": a["bytes_by_tier"], c.device: b["bytes_by_tier"]},
        "identical_bytes_by_tier": a["bytes_by_tier"] == b["bytes_by_tier"],
        "loss": {
            "cpu": [h["loss"] for h in a["history"]],
            c.device: [h["loss"] for h in b["history"]],
        },  # fmt: skip
        "max_rel_loss_diff": rel,
        "losses_close": rel <= 0.02,
        "simulated": {"cpu": a["simulated"], c.device: b["simulated"]},
    }


def step_dataset(c: Check) -> dict[str, Any]:
    t = time.monotonic()
    if not c.data.exists():
        c.gnnio("prepare", "synthetic", "--num-nodes", str(c.args.nodes), "--avg-degree", "16",
                "--feat-dim", "128", "--num-classes", "16", "--split", "0.1", "0.01", "0.01",
                "--reorder", "wrpr", "--out", str(c.data), "--quiet", limit_s=240)  # fmt: skip
    return {"path": str(c.data), "nodes": c.args.nodes, "seconds": time.monotonic() - t}


def step_bandwidth(c: Check) -> dict[str, Any]:
    argv = ["bench", "tiers", str(c.data), "--device", c.device, "--scores", "wrpr",
            "--fractions", "0,0.05,0.1,0.25", "--max-batches", "20", "--no-progress", "--json"]  # fmt: skip
    if c.device == "cuda":
        argv.insert(-2, "--bandwidth")
    return c.gnnio(*argv, limit_s=180)


def step_sampling(c: Check) -> dict[str, Any]:
    common = ["bench", "sampling", str(c.data), "--batches", str(c.args.batches), "--passes", "3",
              "--no-progress", "--json"]  # fmt: skip
    out = {"cpu": c.gnnio(*common, "--device", "cpu", "--threads", str(os.cpu_count() or 1))}
    if c.device == "cuda":
        out["cuda"] = c.gnnio(*common, "--device", "cuda")
        out["gpu_over_cpu"] = out["cuda"]["edges_per_s"] / max(out["cpu"]["edges_per_s"], 1e-9)
        out["uva"] = uva_sampling(c)
        out["uva_over_cpu"] = out["uva"]["edges_per_s"] / max(out["cpu"]["edges_per_s"], 1e-9)
        out["checksum_equal"] = out["cuda"].get("checksum") == out["cpu"].get("checksum")
    return out


def uva_sampling(c: Check) -> dict[str, Any]:
    """Edges/s of the GPU sampler reading the CSR zero-copy from pinned host memory (the same
    seeds and fanouts as ``gnnio bench sampling``: batches of 1024 training seeds, 15,10,5)."""
    import torch

    from ..graph import load
    from ..sampling import UniformSampler

    ds = load(c.data)
    s = UniformSampler(ds.graph, [15, 10, 5], seed=0, device="cuda", graph_in="host")
    seeds = torch.from_numpy(ds.train_idx[: 1024 * c.args.batches].copy())
    batches = [b for b in seeds.split(1024) if b.numel()]
    for i, b in enumerate(batches[:3]):
        s.sample(b, epoch_seed=i)
    torch.cuda.synchronize()
    t0, edges = time.perf_counter(), 0
    for i, b in enumerate(batches):
        edges += sum(int(blk.edge_index.shape[1]) for blk in s.sample(b, epoch_seed=100 + i).blocks)
    torch.cuda.synchronize()
    t = time.perf_counter() - t0
    return {"edges_per_s": edges / t, "ms_per_batch": 1e3 * t / len(batches), "graph_in": "host"}


def step_loader(c: Check) -> dict[str, Any]:
    common = ["bench", "loader", str(c.data), "--device", c.device, "--batches",
              str(c.args.batches), "--passes", "3", "--threads", str(os.cpu_count() or 1),
              "--no-progress", "--json"]  # fmt: skip
    return {
        "store_host": c.gnnio(*common, "--store-device", "cpu"),
        "store_gpu": c.gnnio(*common, "--store-device", c.device),
        "store_gpu_sampler_gpu": c.gnnio(
            *common, "--store-device", c.device, "--sampler-device", c.device
        ),
    }


def step_epochs(c: Check) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in ("0", "0.05", "0.1", "0.25"):
        s_path = c.out / f"train_hot{f}.json"
        c.gnnio("train", str(c.data), "--device", c.device, "--gpu-cache-fraction", f,
                "--score", "wrpr", "--epochs", "2", "--quiet", "--summary", str(s_path),
                limit_s=150)  # fmt: skip
        s = json.loads(s_path.read_text())
        last = s["history"][-1]  # the second (warm) epoch
        out[f] = {
            "epoch_time_s": last["epoch_time_s"],
            "breakdown_s": last["breakdown_s"],
            "hidden_fraction": last.get("hidden_fraction"),
            "bytes_by_tier": last["bytes_by_tier"],
            "simulated": s.get("simulated"),
        }
    if "0" in out and "0.1" in out:
        out["speedup_10pct"] = out["0"]["epoch_time_s"] / max(out["0.1"]["epoch_time_s"], 1e-9)
    return out


def step_cache(c: Check) -> dict[str, Any]:
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "cache_overhead.py"
    if not script.is_file():
        return {"skipped": "no benchmarks/ next to the package (installed, not a checkout)"}
    cmd = [sys.executable, str(script), str(c.data), "--device", c.device, "--rounds", "3",
           "--batches", str(min(30, c.args.batches)), "--json"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(script.parents[1]),
                                                                     os.environ.get("PYTHONPATH")]))}  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, env=env,
                       timeout=max(5.0, min(240.0, c.left_s())))  # fmt: skip
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"cache_overhead.py exited {r.returncode}: {' | '.join(tail)}")
    return json.loads(r.stdout.strip().splitlines()[-1])


STEPS = [
    ("env", step_env),
    ("gpu_tests", step_gpu_tests),
    ("cpu_vs_cuda", step_cpu_vs_cuda),
    ("dataset", step_dataset),
    ("step", step_train_step),
    ("epoch_default", step_epoch_default),
    ("bandwidth", step_bandwidth),
    ("sampling", step_sampling),
    ("feature_bound", step_feature_bound),
    ("epochs", step_epochs),
    ("loader", step_loader),
    ("cache", step_cache),
    ("nccl", step_nccl),
]


def goals(steps: dict[str, Any], device: str = "cuda") -> dict[str, Any]:
    """Each goal's measured value and whether it is met (None when its step did not run, and
    always on a CPU dry run: those figures are not GPU figures)."""
    bw = steps.get("bandwidth", {}).get("bandwidth", {}).get("ratio", {})
    values = {
        "uva_gather": bw.get("zero_copy/h2d_copy"),
        "gpu_tier_gather": bw.get("gpu_resident/d2d_copy"),
        "gpu_sampling": steps.get("sampling", {}).get("gpu_over_cpu"),
        "uva_sampling": steps.get("sampling", {}).get("uva_over_cpu"),
        "tiering_speedup": steps.get("epochs", {}).get("speedup_10pct"),
        "lookahead_overhead": _ratio(
            steps.get("cache", {}).get("manage_ms_median", {}), "lru", "lookahead"
        ),  # fmt: skip
        "train_step_ms": steps.get("step", {}).get("train_step_ms"),
        "epoch_s": steps.get("epoch_default", {}).get("epoch_s"),
        "tiering_speedup_feature_bound": steps.get("feature_bound", {}).get(
            "tiering_speedup_10pct"
        ),
        "kernel_fallbacks": kernel_fallbacks(steps),
        "nccl_modes_failed": steps.get("nccl", {}).get("nccl_modes_failed"),  # issue 26
    }

    def met(name: str, thr: float):
        v = values[name]
        if v is None or device != "cuda":
            return None
        return v <= thr if name in AT_MOST else v >= thr

    return {
        name: {
            "what": what,
            "goal": thr,
            "direction": "<=" if name in AT_MOST else ">=",
            "value": values[name],
            "met": met(name, thr),
        }  # fmt: skip
        for name, what, thr in GOALS
    }


def _ratio(d: dict[str, float], a: str, b: str) -> float | None:
    return d[a] / max(d[b], 1e-12) if a in d and b in d else None


def write_markdown(report: dict[str, Any], path: Path) -> None:
    env = report["steps"].get("env", {})
    lines = [
        "# gnnio GPU check",
        "",
        f"{env.get('gpu', 'no GPU')} ({env.get('gpu_memory_gib', '?')} GiB), torch "
        f"{env.get('torch', '?')}, CUDA {env.get('cuda', '?')}, {env.get('cpus', '?')} CPUs; "
        f"device `{env.get('device', '?')}`; {report['elapsed_s']:.0f} s.",
        "",
        *(
            ["**Dry run on the CPU: no figure below is a GPU figure.**", ""]
            if env.get("device") != "cuda"
            else []
        ),  # fmt: skip
        "| goal | measured | goal | met |",
        "| --- | --- | --- | --- |",
    ]
    for g in report["goals"].values():
        v = "not measured" if g["value"] is None else f"{g['value']:.2f}"
        met = {None: "-", True: "yes", False: "**no**"}[g["met"]]
        lines.append(f"| {g['what']} | {v} | {g.get('direction', '>=')} {g['goal']} | {met} |")
    lines += ["", "| step | status |", "| --- | --- |"]
    for name, res in report["steps"].items():
        status = res.get("error") or res.get("skipped") or "ok"
        if name == "gpu_tests" and "summary" in res:
            status = res["summary"]
        if name == "cpu_vs_cuda" and "identical_bytes_by_tier" in res:
            status = (f"bytes_by_tier identical: {res['identical_bytes_by_tier']}, max relative "
                      f"loss difference {res['max_rel_loss_diff']:.2e}")  # fmt: skip
        if name == "sampling" and "checksum_equal" in res:
            status = f"GPU batches bit-identical to the CPU's (checksum): {res['checksum_equal']}"
        if name == "cache" and "manage_ms_median" in res:
            status = "; ".join(
                f"{p} {ms:.2f} ms, hits {res['hit_ratio'][p]:.3f}"
                for p, ms in res["manage_ms_median"].items()
            )
        if res.get("fell_back"):
            status = f"**failed: a Triton kernel fell back** ({status})"
        lines.append(f"| {name} | {status} |")
    fb = report["steps"].get("feature_bound", {}).get("techniques", {})
    if fb:
        lines += ["", "| technique (feature-bound) | baseline ms/batch | ms/batch | speedup |",
                  "| --- | --- | --- | --- |"]  # fmt: skip
        for name, r in fb.items():
            if "speedup" in r:
                lines.append(f"| {name}: {r['technique']} vs {r['baseline']} | "
                             f"{r['baseline_ms_per_batch']:.2f} | {r['ms_per_batch']:.2f} | "
                             f"{r['speedup']:.2f} |")  # fmt: skip
            else:
                lines.append(f"| {name} | {r.get('error') or r.get('skipped')} | | |")
    ep = report["steps"].get("epochs", {})
    if any(k in ep for k in ("0", "0.1")):
        lines += ["", "| hot fraction | epoch s | hidden_fraction | host bytes |", "| --- | --- | --- | --- |"]  # fmt: skip
        for f in ("0", "0.05", "0.1", "0.25"):
            if f in ep:
                e = ep[f]
                lines.append(f"| {f} | {e['epoch_time_s']:.2f} | {e['hidden_fraction']:.2f} | "
                             f"{e['bytes_by_tier'].get('host', 0):,} |")  # fmt: skip
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gpu-check", description=__doc__.split("\n\n")[0])
    p.add_argument("outdir", help="where report.json, report.md and the datasets go")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (a dry run)")
    p.add_argument("--nodes", type=int, default=1 << 21, help="nodes of the synthetic graph")
    p.add_argument("--batches", type=int, default=50, help="batches per bench pass")
    p.add_argument("--fb-nodes", type=int, default=1 << 20, help="nodes of the feature-bound graph")
    p.add_argument("--fb-batches", type=int, default=30, help="timed batches per technique")
    p.add_argument("--budget-s", type=float, default=570.0, help="wall-clock budget")
    p.add_argument("--skip", default="", help="comma-separated steps to skip")
    args = p.parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu-check: no GPU present (torch.cuda.is_available() is False); nothing to check")
        return 0
    c = Check(args)
    c.out.mkdir(parents=True, exist_ok=True)
    skip = {s for s in args.skip.split(",") if s}
    for name, fn in STEPS:
        if name in skip:
            c.report["steps"][name] = {"skipped": "--skip"}
            continue
        if c.left_s() < 10:
            c.report["steps"][name] = {"skipped": "out of time"}
            continue
        t = time.monotonic()
        try:
            c.report["steps"][name] = fn(c)
        except Exception as e:  # noqa: BLE001 - one failed step must not stop the others
            c.report["steps"][name] = {"error": f"{type(e).__name__}: {e}"}
        c.report["steps"][name]["step_s"] = round(time.monotonic() - t, 2)
        print(f"gpu-check: {name} done ({time.monotonic() - t:.0f} s)", file=sys.stderr)
    c.report["goals"] = goals(c.report["steps"], c.device)
    c.report["elapsed_s"] = time.monotonic() - c.t0
    (c.out / "report.json").write_text(json.dumps(c.report, indent=2, default=str) + "\n")
    write_markdown(c.report, c.out / "report.md")
    print(f"gpu-check: wrote {c.out / 'report.json'} and {c.out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
