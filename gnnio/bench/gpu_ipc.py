"""The two-process part of the gpu-check step ``nccl`` (issue 26, item 4): ``shared`` sampling with
two ranks on the one GPU, the shards shared with CUDA IPC.

Two ranks cannot run NCCL on one GPU, but CUDA IPC does not need NCCL: :func:`step_ipc` starts one
process (``python -m gnnio.bench.gpu_ipc WORK --device cuda``) that launches two ranks on gloo
(:func:`gnnio.distributed.launch.launch`, ``GNNIO_COMM_CHECK`` on), each holding one part of a
2-part partition of a small synthetic graph. Each rank's shard is put on the GPU and shared with
CUDA IPC (``shard_device="cuda"``, :mod:`gnnio.distributed.shm`); the peer's lists are read from
the owner's GPU memory. Modes ``ipc/shared`` and ``ipc/shared+prune``: every rank samples
:data:`BATCHES` batches of its own seeds and compares them with the single-process sampler's
(exactly equal, as the gloo tests check), and reports the sharing path (``shared_via``, which
must be ``cuda_ipc``), the device of the peer's shard and the bytes read from the peer
(``bytes_by_link["peer"]``, which must be > 0). A mode fails when it raises on a rank, a batch
differs, the path is not the expected one, nothing was read from the peer, or the communication
check saw a violation. ``--device cpu`` (the CPU dry run of the tests) runs the same with the
shards in ``/dev/shm`` (expected path ``shm``).
"""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

__all__ = ["BATCHES", "MODES", "run_worker", "step_ipc"]

MODES = {"ipc/shared": None, "ipc/shared+prune": (1.0, 1.0)}
BATCHES = 4
FANOUTS = [4, 3]


def expected_via(device: str) -> str:
    """The sharing path the sub-step must see on ``device``."""
    return "cuda_ipc" if device == "cuda" else "shm"


def step_ipc(c) -> dict[str, Any]:
    """Run the sub-step (module docstring); ``c`` is :class:`gnnio.bench.gpu_check.Check`.
    Returns ``{"modes": {name: {"ok", "error", ...}}, ...}``; a worker that dies or hangs
    fails every mode with its last lines."""
    work = c.out / "nccl" / "ipc"
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, GNNIO_COMM_CHECK=str(work / "check"))
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                "MASTER_PORT", "GROUP_RANK"):  # fmt: skip
        env.pop(var, None)  # the launcher sets them for its two ranks
    cmd = [sys.executable, "-m", "gnnio.bench.gpu_ipc", str(work), "--device", c.device]
    res_path = work / "ipc.json"
    res_path.unlink(missing_ok=True)
    log, why = run_worker(cmd, env, max(5.0, min(180.0, c.left_s())), work / "worker.log")
    if res_path.exists():
        return json.loads(res_path.read_text())
    tail = " | ".join(log.strip().splitlines()[-3:])
    err = f"ipc worker {why}: {tail}"
    return {"modes": {m: {"ok": False, "error": err} for m in MODES}, "world_size": 2}


def run_worker(cmd: list[str], env: dict, limit: float, log_path: Path) -> tuple[str, str]:
    """Run a gpu-check worker in its own session (on a hang it is killed with every process it
    started -- a launcher's ranks -- not left on the GPU); its output goes to ``log_path``.
    Returns ``(output, why it ended)``: ``"exited N"`` or ``"ran past L s"``."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)  # fmt: skip
    try:
        log, _ = proc.communicate(timeout=limit)
        why = f"exited {proc.returncode}"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        why = f"ran past {limit:.0f} s"
    log_path.write_text(log or "")
    return log or "", why


# -- the worker -------------------------------------------------------------------------------


def small_partitioned(work: Path, parts: int, feat_dim: int):
    """A 2,000-node synthetic dataset under ``work/syn`` split into ``parts`` random parts
    (``work/part<parts>``), each made once: ``(dataset dir, loaded dataset, partition dir)``.
    The gpu-check workers' data (this module's and :mod:`gnnio.bench.gpu_nccl`'s)."""
    import gnnio
    from gnnio.importers.synthetic import prepare_synthetic
    from gnnio.preprocess.partition import partition_dataset, save_partition

    d, p = work / "syn", work / f"part{parts}"
    if not d.exists():
        prepare_synthetic(d, num_nodes=2000, avg_degree=8, feat_dim=feat_dim, num_classes=4,
                          seed=3, progress=False)  # fmt: skip
    ds = gnnio.load(d)
    if not p.exists():
        save_partition(partition_dataset(ds, parts, "random", seed=1, measure=False), ds.graph, p)
    return d, ds, p


def _mode(ctx, ds, part, pdir: str, device: str, prune) -> dict[str, Any]:
    """One mode on this rank: batches compared, path, peer device and bytes."""
    import torch

    from ..distributed.sampling import ShardedSampler
    from ..sampling import PrunedUniformSampler, UniformSampler
    from .dist_overlap import same_batch

    avg = ds.num_edges / ds.num_nodes
    s = ShardedSampler(part, pdir, ctx, FANOUTS, seed=1, mode="shared", prune=prune,
                       avg_degree=avg, shard_device=device)  # fmt: skip
    ref: UniformSampler | PrunedUniformSampler
    if prune is None:
        ref = UniformSampler(ds.graph, FANOUTS, seed=1, num_threads=1)
    else:
        ref = PrunedUniformSampler(ds.graph, FANOUTS, prune, seed=1, num_threads=1)
    mine = np.flatnonzero(np.asarray(part.parts) == ctx.rank)
    rng = np.random.default_rng(10 + ctx.rank)
    identical = True
    for b in range(BATCHES):
        seeds = torch.from_numpy(rng.choice(mine, 64, replace=False))
        identical &= same_batch(s.sample(seeds, epoch_seed=b), ref.sample(seeds, epoch_seed=b))
    peer = next(iter(s.peer_shards.values()), None)
    out = {
        "identical": bool(identical),
        "shared_via": s.shared_via,
        "peer_shard_device": None if peer is None else str(getattr(peer.indices, "device", "cpu")),
        "peer_bytes": int(s.bytes_by_link.get("peer", 0)),
        "requests": int(s.stats["requests"]),
    }
    del s, peer
    return out


def rank_main(opts: dict) -> dict | None:
    """One rank; rank 0 returns the merged result."""
    from torch.distributed.elastic.multiprocessing.errors import record

    return record(_rank_body)(opts)


def _rank_body(opts: dict) -> dict | None:
    import gnnio

    from ..distributed.context import init, shutdown
    from ..preprocess.partition import load_partition

    o = SimpleNamespace(**opts)
    ctx = init(timeout_s=60)  # gloo: the collectives between two ranks on one GPU
    chk = ctx._extra.get("check")
    try:
        ds = gnnio.load(o.dataset)
        part = load_partition(o.partition, ds, ctx.world_size)
        mine: dict[str, Any] = {}
        for name, prune in MODES.items():
            before = len(chk.violations) if chk is not None else 0
            t0 = time.monotonic()
            try:
                r, err = _mode(ctx, ds, part, o.partition, o.device, prune), None
            except Exception as e:  # noqa: BLE001 - the mode fails, the next one runs
                r, err = {}, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            gc.collect()  # drop the peer's IPC mapping before its owner may exit
            bad = list(chk.violations[before:]) if chk is not None else []
            mine[name] = {**r, "error": err, "violations": bad[:5],
                          "s": round(time.monotonic() - t0, 2)}  # fmt: skip
        ranks = ctx.all_gather_object(mine)
        ctx.barrier()  # every rank has dropped its peers' shards
        if not ctx.is_main:
            return None
        return {"modes": {name: merge([r[name] for r in ranks], o.device) for name in MODES},
                "world_size": ctx.world_size, "device": o.device}  # fmt: skip
    finally:
        shutdown()


def merge(per_rank: list[dict], device: str) -> dict[str, Any]:
    """One mode's result from every rank's: ``ok`` only when every rank passed."""
    want = expected_via(device)
    errors = [f"rank {k}: {r['error']}" for k, r in enumerate(per_rank) if r.get("error")]
    for k, r in enumerate(per_rank):
        if r.get("error"):
            continue
        if not r.get("identical"):
            errors.append(f"rank {k}: a batch differs from the single-process sampler's")
        if r.get("shared_via") != want:
            errors.append(f"rank {k}: shards shared via {r.get('shared_via')}, not {want}")
        if not r.get("peer_bytes"):
            errors.append(f"rank {k}: nothing read from the peer's shard")
    violations = [v for r in per_rank for v in r.get("violations", [])]
    return {
        "ok": not errors and not violations,
        "error": "; ".join(errors) or None,
        "violations": violations[:5],
        "shared_via": sorted({str(r.get("shared_via")) for r in per_rank}),
        "peer_shard_device": sorted({str(r.get("peer_shard_device")) for r in per_rank}),
        "peer_bytes": sum(int(r.get("peer_bytes", 0)) for r in per_rank),
        "peer_bytes_per_rank": [int(r.get("peer_bytes", 0)) for r in per_rank],
        "s": max(float(r.get("s", 0.0)) for r in per_rank),
    }


def worker(work: Path, device: str) -> dict[str, Any] | None:
    from ..distributed.launch import launch

    d, _, p = small_partitioned(work, 2, feat_dim=8)
    opts = {"dataset": str(d), "partition": str(p), "device": device}
    out = launch(2, rank_main, opts, timeout_s=60)[0]
    (work / "ipc.json").write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(prog="gpu-check-ipc")
    ap.add_argument("work")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    worker(Path(a.work), a.device)
