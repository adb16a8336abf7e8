"""The gpu-check step ``nccl`` (issue 26): every distributed mode on NCCL at world size 1.

One machine with one GPU cannot run two NCCL ranks, but a process group of one rank on NCCL runs
the real NCCL code path: every tensor handed to a collective must be on ``cuda:0``, every group is
a real communicator. :func:`step_nccl` starts one worker process (``python -m
gnnio.bench.gpu_nccl OUTDIR --device cuda``, with ``RANK=0 WORLD_SIZE=1`` and
``GNNIO_COMM_CHECK`` on, :mod:`gnnio.distributed.commcheck`) which runs, each mode on its own and a
failure recorded, on a small synthetic graph:

* ``store/<strategy>``: the sharded feature store under every placement strategy (rows checked
  against the features);
* ``sample/dsp``, ``sample/shared``, ``sample/dsp+prune``, ``sample/shared+prune``: partitioned
  sampling (batches checked against the single-process sampler's);
* ``train/dsp+checkpoints`` (DDP, evaluation, mid-epoch checkpoints) then ``train/resume``, and
  ``train/shared+prune``.

It also runs two processes on the one GPU for what needs no NCCL between them
(:mod:`gnnio.bench.gpu_ipc`): ``ipc/shared`` and ``ipc/shared+prune``, two ranks on gloo whose
shards are shared on the GPU with CUDA IPC, batches checked against the single-process sampler's
and the bytes read from the peer reported.

A mode fails when it raises or when the check saw a violation (a tensor NCCL refused, two
threads on one group). ``nccl_modes_failed`` (goal 0) counts them, the ``ipc/`` modes included.
The worker rewrites ``modes.json`` before and after every mode, so a collective that never returns
(killed after :data:`WORKER_S`) fails the mode it hung in and the modes after it, and the ``ipc/``
sub-step still runs. A mode the environment cannot run (``store/metis`` without pymetis, which the
GPU image lacks) is reported under ``skipped_modes``, not failed.
``--device cpu`` runs the same workers on gloo with the check in its simulated-NCCL mode, the
``ipc/`` shards in ``/dev/shm`` (the CPU dry run the tests use).

Awaiting two GPUs (listed in the step's ``awaiting_two_gpus``): collectives that move bytes
between ranks (at world size 1 every all_to_all is a local copy), CUDA IPC reads of another
GPU's memory (here both ranks share one GPU), gradient all-reduce across GPUs.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from ..utils.ports import reserved_port
from .gpu_ipc import run_worker, small_partitioned, step_ipc

__all__ = ["AWAITING", "step_nccl"]

STRATEGIES = ("alg1", "interleaved", "mod", "rule1", "metis", "naive", "random")
#: the most seconds the world-size-1 worker may take (the ``ipc/`` sub-step has its own limit)
WORKER_S = 180.0
RUNNING = "_running"  # modes.json's key for the mode in progress
AWAITING = [
    "rows and sampled ids crossing between two ranks (world size 1: every exchange is local)",
    "CUDA IPC reads of another GPU's memory (ipc/ modes: two ranks share one GPU here)",
    "DDP gradient all-reduce between two GPUs",
    "bench dist / bench dist-sampling (gloo only; their store and sampler run here)",
]


def step_nccl(c) -> dict[str, Any]:
    """The step (module docstring); ``c`` is :class:`gnnio.bench.gpu_check.Check`."""
    import torch

    if c.device == "cuda" and not torch.cuda.is_available():
        return {"skipped": "no CUDA device: NCCL needs one", "nccl_modes_failed": None}
    work = c.out / "nccl"
    work.mkdir(parents=True, exist_ok=True)
    port = reserved_port()  # (a port merely found free could go to another socket first)
    env = dict(
        os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GNNIO_COMM_CHECK=str(work / "check"),
    )  # fmt: skip
    cmd = [sys.executable, "-m", "gnnio.bench.gpu_nccl", str(work), "--device", c.device]
    res_path = work / "modes.json"
    res_path.unlink(missing_ok=True)
    # a collective that never returns: killed after the limit, its modes read from modes.json
    log, why = run_worker(cmd, env, max(5.0, min(WORKER_S, c.left_s())), work / "worker.log")
    modes = read_modes(res_path, why, log)
    ipc = step_ipc(c)  # two ranks on the one GPU, CUDA IPC (item 4)
    modes.update(ipc.get("modes", {}))
    chk = work / "check" / "rank0.json"
    rec = json.loads(chk.read_text()) if chk.exists() else {}
    failed = sorted(m for m, v in modes.items() if not v["ok"])
    return {
        "backend": rec.get("backend"),
        "modes": modes,
        "nccl_modes_failed": len(failed),
        "failed": failed,
        "skipped_modes": sorted(m for m, v in modes.items() if v.get("skipped")),
        "calls": len(rec.get("calls", [])),
        "awaiting_two_gpus": AWAITING,
    }


def mode_names() -> list[str]:
    """The worker's modes, in the order it runs them."""
    names = [f"store/{s}" for s in STRATEGIES]
    names += [f"sample/{m}{p}" for m in ("dsp", "shared") for p in ("", "+prune")]
    return names + ["train/dsp+checkpoints", "train/resume", "train/shared+prune"]


def read_modes(path: Path, why: str, log: str) -> dict[str, Any]:
    """Every mode's result from the worker's ``modes.json`` (written after each mode). A worker
    that died or hung (``why``) fails the mode it was in, with its last lines, and every mode it
    did not reach: one mode that never returns costs the others nothing but their run."""
    got = json.loads(path.read_text()) if path.exists() else {}
    running = got.pop(RUNNING, None)
    tail = " | ".join(log.strip().splitlines()[-3:])
    out: dict[str, Any] = {}
    for name in mode_names():
        if name in got:
            out[name] = got[name]
        elif name == running:
            out[name] = {"ok": False, "error": f"nccl worker {why} in this mode: {tail}"}
        else:
            out[name] = {"ok": False, "error": f"not run: the nccl worker {why} before it"}
    return out


# -- the worker (one rank, WORLD_SIZE=1) ----------------------------------------------------


def _store(ctx, ds, strategy: str) -> None:
    import torch

    from ..distributed.store import ShardedFeatureStore
    from ..distributed.train import get_placement
    from ..features import open_store

    cfg = SimpleNamespace(
        placement=None, placement_strategy=strategy, buffer=0.2, fanouts=[4, 3], batch_size=64,
        progress=False, seed=0, num_layers=2, local_seeds=False,
    )  # fmt: skip
    host = open_store(ds, "memory", "cpu", progress=False)
    store = ShardedFeatureStore(host, get_placement(ds, cfg, ctx), ctx, reuse=True)
    feats = torch.from_numpy(np.asarray(ds.features))
    rng = np.random.default_rng(0)
    for _ in range(3):
        ids = torch.from_numpy(rng.integers(0, ds.num_nodes, 300))
        if not torch.equal(store.gather(ids).cpu(), feats[ids]):
            raise AssertionError(f"{strategy}: gathered rows differ from the features")


def _sample(ctx, ds, pdir: Path, mode: str, prune) -> None:
    from ..distributed.sampling import ShardedSampler
    from ..preprocess.partition import load_partition
    from ..sampling import PrunedUniformSampler, UniformSampler

    part = load_partition(pdir, ds, 1)
    avg = ds.num_edges / ds.num_nodes
    s = ShardedSampler(part, pdir, ctx, [4, 3], seed=1, mode=mode, prune=prune, avg_degree=avg)
    ref: UniformSampler | PrunedUniformSampler
    if prune is None:
        ref = UniformSampler(ds.graph, [4, 3], seed=1, num_threads=1)
    else:
        ref = PrunedUniformSampler(ds.graph, [4, 3], prune, seed=1, num_threads=1)
    seeds = np.asarray(ds.train_idx[:64], dtype=np.int64)
    a, b = s.sample(seeds, epoch_seed=5), ref.sample(seeds, epoch_seed=5)
    if not np.array_equal(a.input_nodes.numpy(), b.input_nodes.numpy()):
        raise AssertionError(f"{mode}: batch differs from the single-process sampler's")


def _train(ctx, ds, pdir: Path, work: Path, device: str, **kw) -> None:
    from ..distributed.train import DistRun
    from ..train import TrainConfig, train

    cfg = TrainConfig(fanouts=(4, 3), batch_size=64, hidden=8, device=device, partition=str(pdir),
                      progress=False, **kw)  # fmt: skip
    # world size 1 on the distributed path: the option checks of a run of two ranks
    cfg.validate_dist = lambda w: TrainConfig.validate_dist(cfg, max(w, 2))  # type: ignore
    s = train(ds, cfg, run=DistRun(ctx))
    if not s.get("params_identical", False):
        raise AssertionError("params_identical is not true")


def worker(work: Path, device: str) -> dict[str, Any]:
    from ..distributed.context import init, shutdown

    _, ds, pdir = small_partitioned(work, 1, feat_dim=16)
    ctx = init(timeout_s=120, device=device)
    chk = ctx._extra.get("check")
    ck = work / "ck"
    shutil.rmtree(ck, ignore_errors=True)  # a rerun's: a fresh run refuses them
    modes: list[tuple[str, Any]] = [(f"store/{s}", lambda s=s: _store(ctx, ds, s))
                                    for s in STRATEGIES]  # fmt: skip
    for m in ("dsp", "shared"):
        for prune in (None, (1.0, 1.0)):
            name = f"sample/{m}" + ("+prune" if prune else "")
            modes.append((name, lambda m=m, p=prune: _sample(ctx, ds, pdir, m, p)))
    modes += [
        ("train/dsp+checkpoints", lambda: _train(ctx, ds, pdir, work, device, epochs=1,
                                                 checkpoint_dir=str(ck), checkpoint_every=3)),
        ("train/resume", lambda: _train(ctx, ds, pdir, work, device, epochs=2, resume=str(ck))),
        ("train/shared+prune", lambda: _train(ctx, ds, pdir, work, device, epochs=1,
                                              sampling_mode="shared", prune_threshold=(1.0, 1.0))),
    ]  # fmt: skip
    assert [m for m, _ in modes] == mode_names()
    out = run_modes(modes, chk, work / "modes.json")
    shutdown()
    return out


def skip_reason(name: str) -> str | None:
    """Why mode ``name`` cannot run in this environment (it is then reported, not failed)."""
    if name == "store/metis":
        try:
            import pymetis  # noqa: F401 - (the GPU image of 2026-11 has no pymetis)
        except ImportError:
            return "pymetis is not installed (carry its wheel to run this mode)"
    return None


def run_modes(modes: list[tuple[str, Any]], chk, path: Path) -> dict[str, Any]:
    """Run each ``(name, fn)``, a failure recorded and the next one run; ``path`` is rewritten
    before each mode (naming it under :data:`RUNNING`) and after it, so a mode that hangs or
    kills the process is known (:func:`read_modes`)."""
    out: dict[str, Any] = {}
    for name, fn in modes:
        why = skip_reason(name)
        if why is not None:
            out[name] = {"ok": True, "skipped": why}
            continue
        _write(path, {**out, RUNNING: name})
        before = len(chk.violations) if chk is not None else 0
        t0 = time.monotonic()
        try:
            fn()
            err = None
        except Exception as e:  # noqa: BLE001 - one mode's failure is recorded, the next runs
            import traceback

            tb = traceback.extract_tb(e.__traceback__)[-1]
            err = (f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} "
                   f"({Path(tb.filename).name}:{tb.lineno})")  # fmt: skip
        bad = list(chk.violations[before:]) if chk is not None else []
        out[name] = {"ok": err is None and not bad, "error": err, "violations": bad[:5],
                     "s": round(time.monotonic() - t0, 2)}  # fmt: skip
        _write(path, out)
    return out


def _write(path: Path, obj: dict) -> None:
    """``path`` replaced whole (a reader never sees half a file)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(prog="gpu-check-nccl")
    ap.add_argument("work")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    worker(Path(a.work), a.device)
