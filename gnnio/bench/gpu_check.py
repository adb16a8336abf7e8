"""The one-command GPU check: ``bash scripts/gpu-check.sh OUTDIR`` (``python -m
gnnio.bench.gpu_check OUTDIR``).

Whoever has a GPU runs this first. In under ten minutes on one GPU it runs, each step bounded by
what is left of the budget, a failure in one step recorded and the next one run, in this order
(what the open issues need first, so a run out of time drops the least; :data:`STEPS`):

1. ``env``: versions (torch, CUDA, Triton, numba, pymetis, ...), the GPU, the driver, the commit;
2. ``gpu_tests``: the ``gpu``-marked tests (``pytest -m gpu``, at most :data:`GPU_TESTS_S`; on a
   timeout the tests that ran are kept in ``gpu_tests.log``);
3. ``cpu_vs_cuda``: the same small training run on the CPU and on CUDA: ``bytes_by_tier`` must be
   identical, losses close (no dropout); the CUDA run again, LABOR-0 twice: ``runs_identical*``;
4. ``dataset``: a synthetic 2^21-node graph (``--nodes``) reordered by ``wrpr``, small splits;
5. ``step``, ``epoch_default`` (issue 24, :mod:`gnnio.bench.gpu_check_epoch`): the step's
   breakdown (eager, and as a CUDA graph: ``--cuda-graph``) and the default epoch on CUDA;
6. ``sampling``: ``gnnio bench sampling`` on the GPU and on the CPU (all cores), and the GPU
   sampler reading the CSR from pinned host memory (UVA): edges/s; the GPU's batch ``checksum``
   against the CPU's (counter-based sampling: bit-identical batches); the batch replayed as a
   CUDA graph; the same for the locality-aware sampler (s = 8): CPU, eager GPU and graphed; and
   LADIES, the locality-aware LADIES and LABOR-1, each on the CPU and the GPU (ids and edges must
   be the CPU's, :mod:`gnnio.bench.gpu_check_sampling`);
7. ``bandwidth``: ``gnnio bench tiers --device cuda --bandwidth``: UVA (zero-copy) gather against
   the pinned host->device copy, GPU-tier gather against a device-to-device copy;
8. ``feature_bound`` (issue 24): every paper's technique against its baseline on 512-wide rows
   (issue 24's goal pair first: 0 % / 10 % hot, eager and graphed);
9. ``profile``: ``benchmarks/step_profile.py``, the step's ops by host and device time;
10. ``nccl`` (issue 26, :mod:`gnnio.bench.gpu_nccl`): every distributed mode (sharded store per
    placement strategy, partitioned dsp/shared sampling with and without pruning, DDP training
    with evaluation, checkpoints and resume) on NCCL at world size 1, each tensor checked against
    NCCL's rules and each group against one thread; and two ranks on the one GPU sampling in
    ``shared`` mode with their shards shared by CUDA IPC (:mod:`gnnio.bench.gpu_ipc`);
    ``goals.nccl_modes_failed`` (goal 0; all 16 passed on the H200 day: after issue 24's steps);
11. ``epochs``: ``gnnio train --device cuda --gpu-cache-fraction F`` at 0 / 5 / 10 / 25 % hot:
    epoch time, breakdown, ``hidden_fraction``, bytes per tier;
12. ``loader``: ``gnnio bench loader --device cuda``, the store in host memory, on the GPU, and
    with the sampler on the GPU too;
13. ``cache``: ``benchmarks/cache_overhead.py --device cuda``: management ms per batch of the
    cache policies on the GPU (issue 18: the lookahead cache's overhead against LRU's).

``OUTDIR/report.json`` (everything) and ``OUTDIR/report.md`` (the figures against the goals) are
rewritten after every step, each atomically, so a run killed in any step (SIGKILL at a session's
time limit) leaves the report of the steps before it; SIGTERM or Ctrl-C records the step as
stopped, writes the report and exits (143 for SIGTERM); ``complete`` says whether every step
ran; ``calls``, each gnnio process's wall time. ``--report-dir DIR`` keeps a copy of the three
report files (and nothing else) in ``DIR``, also after every step: on a device machine that
returns a few small files, give it the folder that comes back and keep OUTDIR (GBs of datasets)
elsewhere. ``OUTDIR/gpu_tests.log`` holds pytest's output. Without CUDA it prints one line and
exits 0; ``--device cpu`` runs the same steps on the CPU (a dry run of the plumbing, used by the
tests; its numbers are not GPU figures).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .gpu_check_epoch import step_epoch_default, step_feature_bound, step_train_step
from .gpu_check_report import GOALS, goals, write_markdown
from .gpu_check_sampling import _over, part, step_sampling  # noqa: F401 - (_over: tests)
from .gpu_nccl import step_nccl

__all__ = ["GOALS", "main", "write_markdown"]


#: cpu_vs_cuda's --stall-timeout (it trains in this process: a stuck loader must not stop the rest)
STALL_S = 60.0

#: what --report-dir receives
REPORT_FILES = ("report.json", "report.md", "gpu_tests.log")

#: the most seconds the gpu tests may take (H100 run 2 of 2026-11-25: 34 passed in at most 110 s)
GPU_TESTS_S = 180.0


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
        """Run ``gnnio ARGV --json`` in a subprocess; its last stdout line, parsed (its options,
        paths by their last part, and wall time with the start-up: ``calls``)."""
        cmd = [sys.executable, "-m", "gnnio", *argv]
        limit = max(5.0, min(limit_s, self.left_s()))
        shown = " ".join(Path(a).name if a.startswith("/") else a for a in argv)
        call: dict[str, Any] = {"argv": shown}
        t = time.monotonic()
        self.report.setdefault("calls", []).append(call)
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
        except subprocess.TimeoutExpired as e:  # say where it was (its last lines)
            call["wall_s"], call["timed_out"] = round(time.monotonic() - t, 2), True
            tail = (_text(e.stderr) or _text(e.stdout)).strip().splitlines()[-2:]
            raise RuntimeError(f"{' '.join(argv[:2])} ran past {limit:.0f} s: "
                               f"{' | '.join(tail) or 'no output'}") from None  # fmt: skip
        call["wall_s"], call["returncode"] = round(time.monotonic() - t, 2), r.returncode
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
    env["commit"] = c.args.commit or _run_line(["git", "rev-parse", "HEAD"])
    env["driver"] = _run_line(["nvidia-smi", "--query-gpu=driver_version",
                               "--format=csv,noheader"])  # fmt: skip
    from importlib.metadata import PackageNotFoundError, version

    for pkg in ("triton", "numba", "numpy", "torch_geometric", "pymetis", "hypothesis"):
        try:  # pymetis: the nccl step's store/metis mode; hypothesis: some gpu tests
            env[pkg] = version(pkg)
        except PackageNotFoundError:
            env[pkg] = None
    return env


def _run_line(cmd: list[str]) -> str | None:
    """The first line ``cmd`` prints, or None where it cannot run (no git checkout, no driver)."""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=20,
                           cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    out = r.stdout.strip().splitlines()
    return out[0] if r.returncode == 0 and out else None


def gpu_test_workers() -> int:
    """pytest-xdist workers for the gpu tests: 0 where xdist is not installed (a GPU image may lack
    it), else one per 4 cores, at most 4 (each is a process with its own CUDA context on the one
    GPU; the tests compare results and count syncs per process, none times anything)."""
    import importlib.util

    if importlib.util.find_spec("xdist") is None:
        return 0
    return max(1, min(4, (os.cpu_count() or 1) // 4))


def pytest_workers_args(workers: int) -> list[str]:
    """pytest options that replace pyproject's ``addopts`` (``-n 2 --dist loadfile``, which a pytest
    without xdist refuses, so no test would run): ``workers`` processes, a test file each at a
    time, or one process where ``workers`` is 0."""
    opts = ["-o", "addopts=-ra"]
    return opts + (["-n", str(workers), "--dist", "loadfile"] if workers else [])


def step_gpu_tests(c: Check) -> dict[str, Any]:
    tests = Path(__file__).resolve().parents[2] / "tests"
    if not tests.is_dir():
        return {"skipped": "no tests/ next to the package (installed, not a checkout)"}
    workers = gpu_test_workers()
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "--durations=15", "-m", "gpu", "-p",
           "no:cacheprovider", *pytest_workers_args(workers), str(tests)]  # fmt: skip
    limit = max(5.0, min(GPU_TESTS_S, c.left_s() - 240))
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
        out, err, rc, timed_out = r.stdout, r.stderr, r.returncode, False
    except subprocess.TimeoutExpired as e:  # keep what ran: the log and the failures so far
        out, err, rc, timed_out = _text(e.stdout), _text(e.stderr), None, True
    (c.out / "gpu_tests.log").write_text(out + err)  # the tracebacks of any failure
    last = (out.strip().splitlines() or [""])[-1]
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)", last)}
    failed = sorted({ln for ln in out.splitlines() if ln.startswith(("FAILED", "ERROR"))})
    res = {"summary": last, "counts": counts, "failed": failed, "returncode": rc,
           "workers": workers}  # fmt: skip
    if timed_out:
        res["summary"] = f"stopped after {limit:.0f} s (see gpu_tests.log for the tests that ran)"
        res["error"] = res["summary"]
    return res


def _text(b: bytes | str | None) -> str:
    """A TimeoutExpired's captured output (bytes, even with ``text=True``) as text."""
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


def step_cpu_vs_cuda(c: Check) -> dict[str, Any]:
    from ..importers.synthetic import prepare_synthetic
    from ..train import TrainConfig, train

    path = c.out / "data" / "small"
    if not path.exists():
        prepare_synthetic(path, num_nodes=1 << 14, avg_degree=8, feat_dim=32, num_classes=4,
                          seed=0, progress=False)  # fmt: skip
    # in this process, so a loader stage that hangs must end the step, not the whole check
    kw: dict[str, Any] = dict(fanouts=(5, 5), batch_size=256, epochs=2, hidden=32, dropout=0.0,
                              progress=False, gpu_cache_fraction=0.1, stall_timeout=STALL_S)  # fmt: skip
    runs = {d: train(path, TrainConfig(device=d, **kw)) for d in ("cpu", c.device)}
    a, b = runs["cpu"], runs[c.device]
    rel = max(
        abs(x["loss"] - y["loss"]) / max(abs(x["loss"]), 1e-12)
        for x, y in zip(a["history"], b["history"])
    )
    # run to run on the device (issue 24: "bit-identical from run to run"): the same run again,
    # and LABOR-0 twice (its weights take the weighted mean's row sums), times left out
    again = train(path, TrainConfig(device=c.device, **kw))
    labor = [train(path, TrainConfig(device=c.device, sampler="labor", **kw)) for _ in range(2)]
    keep = ("epoch", "loss", "train_acc", "valid_acc", "test_acc", "bytes_by_tier")
    h = [[{k: e.get(k) for k in keep} for e in r["history"]] for r in (b, again, *labor)]
    return {
        "runs_identical": h[0] == h[1],
        "runs_identical_labor": h[2] == h[3],
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


def step_loader(c: Check) -> dict[str, Any]:
    common = ["bench", "loader", str(c.data), "--device", c.device, "--batches",
              str(c.args.batches), "--passes", "3", "--threads", str(os.cpu_count() or 1),
              "--no-progress", "--json"]  # fmt: skip
    return {
        "store_host": part(lambda: c.gnnio(*common, "--store-device", "cpu")),
        "store_gpu": part(lambda: c.gnnio(*common, "--store-device", c.device)),
        "store_gpu_sampler_gpu": part(
            lambda: c.gnnio(*common, "--store-device", c.device, "--sampler-device", c.device)
        ),
    }


def step_epochs(c: Check) -> dict[str, Any]:
    def epoch(f: str) -> dict[str, Any]:
        s_path = c.out / f"train_hot{f}.json"
        c.gnnio("train", str(c.data), "--device", c.device, "--gpu-cache-fraction", f,
                "--score", "wrpr", "--epochs", "2", "--quiet", "--summary", str(s_path),
                limit_s=150)  # fmt: skip
        s = json.loads(s_path.read_text())
        last = s["history"][-1]  # the second (warm) epoch
        return {
            "epoch_time_s": last["epoch_time_s"],
            "breakdown_s": last["breakdown_s"],
            "hidden_fraction": last.get("hidden_fraction"),
            "bytes_by_tier": last["bytes_by_tier"],
            "simulated": s.get("simulated"),
        }

    out: dict[str, Any] = {f: part(lambda f=f: epoch(f)) for f in ("0", "0.05", "0.1", "0.25")}
    speedup = _over(out["0"], out["0.1"], "epoch_time_s")
    if speedup is not None:
        out["speedup_10pct"] = speedup
    return out


def _script(c: Check, name: str, args: list[str], limit_s: float) -> dict[str, Any]:
    """Run ``benchmarks/NAME`` (the checkout on ``PYTHONPATH``); its last stdout line, parsed."""
    script = Path(__file__).resolve().parents[2] / "benchmarks" / name
    if not script.is_file():
        return {"skipped": "no benchmarks/ next to the package (installed, not a checkout)"}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(script.parents[1]),
                                                                     os.environ.get("PYTHONPATH")]))}  # fmt: skip
    r = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True,
                       env=env, timeout=max(5.0, min(limit_s, c.left_s())))  # fmt: skip
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"{name} exited {r.returncode}: {' | '.join(tail)}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def step_cache(c: Check) -> dict[str, Any]:
    return _script(c, "cache_overhead.py", [str(c.data), "--device", c.device, "--rounds", "3",
                   "--batches", str(min(30, c.args.batches)), "--json"], 240.0)  # fmt: skip


def step_profile(c: Check) -> dict[str, Any]:
    """``benchmarks/step_profile.py``: the step alone against its kernel time, and torch's
    profiler tables (top operations by host and by device time) of the step and of the loop."""
    out = c.out / "profile.json"
    k = "20" if c.device == "cuda" else "3"  # (a CPU dry run checks the plumbing only)
    short = _script(c, "step_profile.py", [str(c.data), "--device", c.device, "--batches", k,
                    "--profile-batches", "8" if c.device == "cuda" else "2", "--warmup", "2",
                    "--out", str(out)], 120.0)  # fmt: skip
    if out.is_file():
        full = json.loads(out.read_text())
        for key in ("profile_isolated", "profile_pipelined"):
            if isinstance(full.get(key), dict) and isinstance(short.get(key), dict):
                short[key].update({k: v for k, v in full[key].items() if k.startswith("by_")})
    return short


#: in order of what the open issues need from a GPU, so that a run out of time drops the least:
#: correctness, issue 24's goals and profile, issue 26's nccl step, then what an H100 measured
STEPS = [
    ("env", step_env),
    ("gpu_tests", step_gpu_tests),
    ("cpu_vs_cuda", step_cpu_vs_cuda),
    ("dataset", step_dataset),
    ("step", step_train_step),
    ("epoch_default", step_epoch_default),
    ("sampling", step_sampling),
    ("bandwidth", step_bandwidth),
    ("feature_bound", step_feature_bound),
    ("profile", step_profile),
    ("nccl", step_nccl),
    ("epochs", step_epochs),
    ("loader", step_loader),
    ("cache", step_cache),
]


class Terminated(BaseException):
    """SIGTERM (a device session's time limit): the step in progress is recorded as stopped and
    the report written before the process exits."""


def save(c: Check, complete: bool = False) -> None:
    """Write ``report.json`` and ``report.md`` from what has run so far, each atomically (a
    temporary file renamed over the last one), so a run killed in any step leaves the report of
    the steps before it."""
    from ..utils.outputs import write_atomic

    c.report["goals"] = goals(c.report["steps"], c.device)
    c.report["elapsed_s"] = time.monotonic() - c.t0
    c.report["complete"] = complete
    text = json.dumps(c.report, indent=2, default=str) + "\n"
    write_atomic(c.out / "report.json", lambda f: f.write(text.encode()), "report")
    try:
        write_markdown(c.report, c.out / "report.md")
    except Exception as e:  # noqa: BLE001 - the summary must not cost the run (report.json has it all)
        md = f"# gnnio GPU check\n\nreport.md could not be written ({type(e).__name__}: {e}); see report.json.\n"
        write_atomic(c.out / "report.md", lambda f: f.write(md.encode()), "report")
    dest = c.args.report_dir
    if dest:  # only the reports: a device machine returns few files (the datasets are GBs)
        Path(dest).mkdir(parents=True, exist_ok=True)
        for name in REPORT_FILES:
            if (c.out / name).is_file():
                data = (c.out / name).read_bytes()
                write_atomic(Path(dest) / name, lambda f, d=data: f.write(d), "--report-dir")  # type: ignore[misc]  # a default-bound lambda


def _on_sigterm(signum, frame):  # noqa: ARG001 - signal handler signature
    raise Terminated("SIGTERM")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gpu-check", description=__doc__.split("\n\n")[0])
    p.add_argument("outdir", help="where report.json, report.md and the datasets go")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (a dry run)")
    p.add_argument("--nodes", type=int, default=1 << 21, help="nodes of the synthetic graph")
    p.add_argument("--batches", type=int, default=50, help="batches per bench pass")
    p.add_argument("--fb-nodes", type=int, default=1 << 20, help="nodes of the feature-bound graph")
    p.add_argument("--fb-batches", type=int, default=30, help="timed batches per technique")
    p.add_argument("--fb-reserve-s", type=float, default=60.0, help="seconds left to the profile")
    p.add_argument("--budget-s", type=float, default=570.0, help="wall-clock budget")
    p.add_argument("--skip", default="", help="comma-separated steps to skip")
    p.add_argument("--report-dir", default=None,
                   help="also keep report.json, report.md and gpu_tests.log (only these) here, "
                        "updated after every step: a folder a device session copies back, while "
                        "OUTDIR with its GBs of datasets stays on the machine")  # fmt: skip
    p.add_argument("--commit", default=os.environ.get("GNNIO_COMMIT"),
                   help="the commit checked, for report.json where the tree has no .git "
                        "(default: $GNNIO_COMMIT, else git rev-parse HEAD)")  # fmt: skip
    args = p.parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"gpu-check: no GPU present (torch.cuda.is_available() is False; torch "
              f"{torch.__version__} of {sys.executable}); nothing to check")  # fmt: skip
        return 0
    c = Check(args)
    c.out.mkdir(parents=True, exist_ok=True)
    skip = {s for s in args.skip.split(",") if s}
    in_main = threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGTERM, _on_sigterm) if in_main else None
    try:
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
            except BaseException as e:  # Ctrl-C, SIGTERM: keep what ran, then stop
                c.report["steps"][name] = {"error": f"stopped ({type(e).__name__}) in this step"}
                c.report["steps"][name]["step_s"] = round(time.monotonic() - t, 2)
                save(c)
                raise
            c.report["steps"][name]["step_s"] = round(time.monotonic() - t, 2)
            print(f"gpu-check: {name} done ({time.monotonic() - t:.0f} s)", file=sys.stderr)
            save(c)
    except Terminated:
        print(f"gpu-check: stopped by SIGTERM; wrote {c.out / 'report.json'}", file=sys.stderr)
        return 143
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, old)
    save(c, complete=True)
    print(f"gpu-check: wrote {c.out / 'report.json'} and {c.out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
