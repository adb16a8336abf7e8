"""Every collective of every distributed mode, checked (issue 26) on gloo with CPU processes:

* NCCL's tensor rules: with ``GNNIO_COMM_CHECK`` each rank checks every tensor handed to
  ``torch.distributed`` as if the run were NCCL (:mod:`gnnio.distributed.commcheck`): it must have been
  placed by the rank context, which on NCCL puts it on ``cuda:<local_rank>``;
* one thread per communicator: no group is used by two threads, across training with
  prefetching, evaluation, mid-epoch checkpoints and resume.

The modes: the sharded store under every placement strategy (``bench dist``), partitioned
sampling dsp and shared with and without pruning (``bench dist-sampling`` and ``train``), DDP
training, evaluation, checkpoint and resume.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.test_dist import _spawn, free_port, run_cli
from tests.test_dist_sampling import _write, bench_dist_sampling

STRATEGIES = "alg1,interleaved,mod,rule1,metis,naive,random"


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("comm"))


def _records(d: Path, world: int = 2) -> list[dict]:
    recs = [json.loads((d / f"rank{k}.json").read_text()) for k in range(world)]
    assert all(r["calls"] for r in recs)
    return recs


def _run_checked(tmp_path: Path, name: str, args: list[str]) -> list[dict]:
    d = tmp_path / name
    r = run_cli(args, env={"GNNIO_COMM_CHECK": str(d)}, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    recs = _records(d)
    bad = [v for rec in recs for v in rec["violations"]]
    assert not bad, f"{name}: " + "\n".join(bad[:10])
    return recs


def _groups_threads(recs) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for rec in recs:
        for g, ts in rec["threads_by_group"].items():
            out.setdefault(g, set()).update(ts)
    return out


TRAIN = ["--nproc", "2", "--batch-size", "32", "--hidden", "8", "--fanouts", "4,3", "--quiet"]


def test_train_partitioned_dsp_with_checkpoints_and_resume(graph, tmp_path):
    """dsp sampling + sharded store + DDP + evaluation + mid-epoch checkpoints, then a resume."""
    d, pdirs = graph
    ck = tmp_path / "ck"
    base = ["train", str(d), *TRAIN, "--partition", str(pdirs[0]), "--sampling-mode", "dsp"]
    summ = tmp_path / "s.json"
    recs = _run_checked(
        tmp_path, "dsp", [*base, "--epochs", "2", "--checkpoint-dir", str(ck),
                          "--checkpoint-every", "2", "--summary", str(summ)],
    )  # fmt: skip
    s = json.loads(summ.read_text())
    # issue 26, item 5: each rank's peak memory, and what it holds sized by the whole graph:
    # the store's lookup (int16 owner + int32 position), its int32 trace, the int16 partition book
    assert len(s["rss_mb_peak_per_rank"]) == 2 and min(s["rss_mb_peak_per_rank"]) > 10
    for kinds, peak in zip(s["rss_mb_by_kind_per_rank"], s["rss_mb_peak_per_rank"]):
        assert kinds["anon"] > 10 and 0 < sum(kinds.values()) <= peak + 1
    assert s["whole_graph_bytes_per_rank"] == [300 * (2 + 4 + 4 + 2)] * 2
    used = _groups_threads(recs)
    # each group had its one thread: DDP and control on the main thread, the loaders' own
    assert used["default"] == {"MainThread"} and used["control"] == {"MainThread"}
    assert used["fetch"] == {"gnnio-gather"} and used["sample"] == {"gnnio-sample-0"}
    assert used["eval_fetch"] == {"gnnio-gather"} and used["eval_sample"] == {"gnnio-sample-0"}
    calls = {(f, g) for rec in recs for f, g, _, _ in rec["calls"]}
    assert ("all_reduce", "default") in calls  # DDP's hook went through the context
    assert ("all_to_all_single", "sample") in calls and ("all_to_all_single", "fetch") in calls
    _run_checked(tmp_path, "resume", [*base, "--epochs", "3", "--resume", str(ck)])


def test_train_partitioned_shared_pruned(graph, tmp_path):
    d, pdirs = graph
    recs = _run_checked(
        tmp_path, "shared", ["train", str(d), *TRAIN, "--epochs", "1", "--partition",
                             str(pdirs[1]), "--sampling-mode", "shared", "--prune-threshold", "1,1",
                             "--placement-strategy", "mod"],
    )  # fmt: skip
    # two object broadcasts: the placement's and the training sampler's shared-memory names;
    # the evaluation sampler reads the shards the training sampler mapped (no second copy)
    for rec in recs:
        n = sum(c for f, g, _, c in rec["calls"] if f == "broadcast_object_list")
        assert n == 2, rec["calls"]


def test_bench_dist_every_strategy(graph, tmp_path):
    d, _ = graph
    recs = _run_checked(
        tmp_path, "bench-dist", ["bench", "dist", str(d), "--nproc", "2", "--strategies",
                                 STRATEGIES, "--batches", "2", "--batch-size", "16",
                                 "--fanouts", "4,3", "--reuse-level", "machine", "--json"],
    )  # fmt: skip
    assert any(g == "fetch" for rec in recs for _, g, _, _ in rec["calls"])


@pytest.mark.parametrize("prune", [None, "0,1"])
def test_bench_dist_sampling_both_modes(tmp_path_factory, prune):
    # the launch test_dist_sampling's bench test reads too (made once, for whichever runs first)
    r, check = bench_dist_sampling(tmp_path_factory, prune)
    assert r.returncode == 0, r.stderr[-3000:]
    recs = _records(check)
    bad = [v for rec in recs for v in rec["violations"]]
    assert not bad, "\n".join(bad[:10])
    assert any(g == "sample" for rec in recs for _, g, _, _ in rec["calls"])


# -- the check itself: it must see what it is there to see -----------------------------------


def _check_worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world), GNNIO_COMM_CHECK=out,
    )  # fmt: skip
    import torch.distributed as dist

    from gnnio.distributed.context import init, shutdown

    ctx = init(timeout_s=60)
    # through the context: placed for the backend, no violation
    got = ctx.all_to_all_single(torch.arange(2, dtype=torch.int64) + 10 * rank, group="sample")
    assert got.tolist() == [10 * k + rank for k in range(world)]
    ctx.barrier()
    # a numpy-backed CPU tensor straight to torch.distributed: what NCCL refuses
    send = torch.from_numpy(np.arange(2, dtype=np.int64))
    dist.all_to_all_single(torch.empty(2, dtype=torch.int64), send, group=ctx.group("sample"))
    # a second thread on the fetch group (sequentially, so no hang on gloo)
    t = threading.Thread(target=ctx.barrier, kwargs={"group": "fetch"}, name="other")
    t.start()
    t.join()
    ctx.barrier(group="fetch")
    shutdown()


def test_the_check_flags_cpu_tensors_and_shared_groups(tmp_path):
    _spawn(_check_worker, 2, (free_port(), str(tmp_path)), timeout=120)
    for rec in _records(tmp_path):
        v = rec["violations"]
        nccl = [x for x in v if x.startswith("nccl:")]
        assert len(nccl) == 2 and all("all_to_all_single on group sample" in x for x in nccl)
        assert all("test_dist_comm.py" in x for x in nccl)  # the call site is named
        assert any("group fetch used by threads ['MainThread', 'other']" in x for x in v)
        assert not any("group sample used" in x or "group control" in x for x in v)
