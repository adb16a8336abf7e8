"""Shared sampling's sharing path (issue 26, item 4): CUDA IPC whenever the shards live on a GPU,
whatever the backend, ``/dev/shm`` on the CPU; the decision, the IPC branch with fake CUDA, the
refusals, and (``gpu``-marked) two real processes on one GPU."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from gnnio.distributed import shm
from tests.fake_cuda import FakeCudaTensor, fake_cuda
from tests.test_dist import run_cli


def _ctx(device="cpu", backend="gloo", local_rank=1, rank=0, world=2):
    """A rank context's fields that the sharing decision reads; ``calls`` logs barriers."""
    return SimpleNamespace(
        device=torch.device(device), backend=backend, local_rank=local_rank, rank=rank,
        world_size=world, is_main=rank == 0, _extra={}, calls=[],
    )  # fmt: skip


def test_the_shard_device_follows_the_rank_unless_the_run_names_one(monkeypatch):
    gloo = _ctx()
    assert shm.shard_device(gloo) == torch.device("cpu")
    assert shm.shard_device(gloo, "cpu") == torch.device("cpu")
    for bad in ("tpu", "meta", "nonsense"):
        with pytest.raises(ValueError, match="cpu or cuda"):
            shm.shard_device(gloo, bad)
    fake_cuda(monkeypatch, count=1)
    # two ranks on gloo on one GPU: both share from cuda:0
    assert shm.shard_device(gloo, "cuda") == torch.device("cuda", 0)
    assert shm.shard_device(_ctx(local_rank=0), "cuda") == torch.device("cuda", 0)
    fake_cuda(monkeypatch, count=2)
    assert shm.shard_device(gloo, "cuda") == torch.device("cuda", 1)
    nccl = _ctx(device="cuda:1", backend="nccl")
    assert shm.shard_device(nccl) == torch.device("cuda", 1)  # NCCL with --device cuda: IPC
    assert shm.shard_device(nccl, "cuda") == torch.device("cuda", 1)
    assert shm.shard_device(nccl, "cpu") == torch.device("cpu")  # asked for: /dev/shm
    with pytest.raises(ValueError, match="without an index"):
        shm.shard_device(gloo, "cuda:1")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_cuda_shards_without_cuda_are_refused_in_one_line():
    with pytest.raises(ValueError, match="no CUDA device"):
        shm.shard_device(_ctx(), "cuda")


def test_the_path_depends_on_the_shard_device_not_the_backend():
    assert shm.sharing_path(torch.device("cuda", 0), shm_ok=True) == "cuda_ipc"
    assert shm.sharing_path(torch.device("cuda", 0), shm_ok=False) == "cuda_ipc"
    assert shm.sharing_path(torch.device("cpu"), shm_ok=True) == "shm"
    assert shm.sharing_path(torch.device("cpu"), shm_ok=False) == "files"


def test_dsp_refuses_a_shard_device():
    from gnnio.distributed.sampling import ShardedSampler

    with pytest.raises(ValueError, match="only with sampling mode shared"):
        ShardedSampler(None, None, None, [2], mode="dsp", shard_device="cuda")


def _shard_arrays(rng):
    indptr = np.array([0, 3, 3, 7, 12], dtype=np.int64)
    return {
        "nodes": np.array([5, 1, 9, 2], dtype=np.int64),
        "indptr": indptr,
        "indices": rng.integers(0, 20, int(indptr[-1])).astype(np.int32),
    }


def test_gloo_with_fake_cuda_shards_shares_them_with_cuda_ipc(monkeypatch):
    """On gloo (collectives on CPU tensors), shards on a (fake) GPU take the CUDA IPC branch: the
    handles travel as objects, the owner keeps its tensors alive, an empty array comes back
    empty, and a peer's shard read from tensors samples as the files' shard does."""
    from gnnio.distributed.sampling import _Shard

    fake_cuda(monkeypatch, count=1)
    moved, reduced = [], []

    def to_device(a, device):  # the padding of the real one, no bytes moved
        t = torch.from_numpy(np.ascontiguousarray(a).reshape(-1))
        t = torch.zeros(1, dtype=t.dtype) if t.numel() == 0 else t
        moved.append(device)
        return t.as_subclass(FakeCudaTensor)

    def reduce(t):  # an IPC handle: the receiver rebuilds a tensor over the same memory
        reduced.append(t)
        return (lambda x: x.as_subclass(torch.Tensor), (t,))

    monkeypatch.setattr(shm, "_to_device", to_device)
    monkeypatch.setattr(shm, "_reduce", reduce)
    rng = np.random.default_rng(0)
    peer = _shard_arrays(rng)
    empty = {"nodes": np.zeros(0, np.int64), "indptr": np.zeros(1, np.int64),
             "indices": np.zeros(0, np.int32)}  # fmt: skip
    sent: dict = {}
    ctx = _ctx(world=3)
    ctx.all_gather_object = lambda obj, group="control": (sent.update(mine=obj), [obj, *theirs])[1]
    ctx.broadcast_object_list = lambda *a, **k: pytest.fail("the shm path ran")
    ctx.barrier = lambda group="control": ctx.calls.append("barrier")
    # ranks 1 and 2's handles, as their own calls of the IPC branch would make them
    theirs = [
        {n: (reduce(to_device(arrays[n], "cuda:0")), arrays[n].shape) for n in shm.NAMES}
        for arrays in (peer, empty)
    ]
    dev = shm.shard_device(ctx, "cuda")
    mapped, via = shm.share_shards(ctx, empty, [1, 2], dev)
    assert via == "cuda_ipc" and ctx.backend == "gloo"
    assert all(str(d) == "cuda:0" for d in moved)
    assert set(sent["mine"]) == set(shm.NAMES) and ctx.calls == ["barrier"]
    kept = ctx._extra["ipc_keep"][0]
    assert set(kept) == set(shm.NAMES) and all(isinstance(t, FakeCudaTensor) for t in kept.values())
    assert kept["nodes"].numel() == 1 and sent["mine"]["nodes"][1] == (0,)  # padded, shape sent
    for k, arrays in ((1, peer), (2, empty)):  # an empty array comes back empty
        for n in shm.NAMES:
            got = mapped[k][n]
            assert got.dtype == torch.from_numpy(arrays[n]).dtype
            assert np.array_equal(got.numpy(), arrays[n]), (k, n)
    # reading rows from tensors (the peer's GPU memory) samples as reading the arrays does
    a = _Shard(Path("."), 1, 20, arrays=peer)
    t = _Shard(Path("."), 1, 20, arrays=mapped[1])
    assert t.tensors and not a.tensors
    rows = np.array([2, 9, 5], dtype=np.int64)
    for theta in (None, 2):
        ca, fa = a.sample(rows, 2, np.uint64(12345), theta)
        ct, ft = t.sample(rows, 2, np.uint64(12345), theta)
        assert np.array_equal(ca, ct) and np.array_equal(fa, ft)
    assert np.array_equal(a.degrees(rows), t.degrees(rows))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_bench_shard_device_cuda_without_cuda_is_one_line(tmp_path):
    r = run_cli(["bench", "dist-sampling", str(tmp_path), "--partition", str(tmp_path),
                 "--modes", "shared", "--shard-device", "cuda"], timeout=120)  # fmt: skip
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [
        "gnnio: error: --shard-device cuda: no CUDA device is present"
    ]


def test_bench_shard_device_needs_shared_mode(tmp_path):
    r = run_cli(["bench", "dist-sampling", str(tmp_path), "--partition", str(tmp_path),
                 "--modes", "dsp", "--shard-device", "cpu"], timeout=120)  # fmt: skip
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [
        "gnnio: error: --shard-device: only with --modes shared"
    ]


def test_the_ipc_sub_step_merges_ranks_and_fails_on_each_fault():
    from gnnio.bench.gpu_ipc import merge

    good = {"identical": True, "shared_via": "cuda_ipc", "peer_shard_device": "cuda:0",
            "peer_bytes": 100, "error": None, "violations": [], "s": 1.0}  # fmt: skip
    m = merge([good, {**good, "peer_bytes": 50}], "cuda")
    assert m["ok"] and m["peer_bytes"] == 150 and m["peer_bytes_per_rank"] == [100, 50]
    assert m["shared_via"] == ["cuda_ipc"]
    for fault, words in (
        ({"identical": False}, "differs"),
        ({"shared_via": "shm"}, "via shm, not cuda_ipc"),
        ({"peer_bytes": 0}, "nothing read"),
        ({"error": "ValueError: x"}, "rank 1: ValueError"),
    ):
        bad = merge([good, {**good, **fault}], "cuda")
        assert not bad["ok"] and words in bad["error"], fault
    assert not merge([good, {**good, "violations": ["cpu tensor"]}], "cuda")["ok"]
    assert merge([{**good, "shared_via": "shm"}] * 2, "cpu")["ok"]  # the CPU dry run's path


def test_a_dead_ipc_worker_fails_every_mode(tmp_path, monkeypatch):
    from gnnio.bench import gpu_ipc

    monkeypatch.setattr(sys, "executable", "/bin/false")
    c = SimpleNamespace(out=tmp_path, device="cuda", left_s=lambda: 60.0)
    r = gpu_ipc.step_ipc(c)
    assert set(r["modes"]) == set(gpu_ipc.MODES)
    assert all(not v["ok"] and "exited 1" in v["error"] for v in r["modes"].values())


# -- a real GPU: two processes on one GPU --------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_two_processes_on_one_gpu_share_shards_with_cuda_ipc(tmp_path):
    from gnnio.bench import gpu_ipc

    out = gpu_ipc.worker(tmp_path, "cuda")
    for name, m in out["modes"].items():
        assert m["ok"], (name, m)
        assert m["shared_via"] == ["cuda_ipc"] and m["peer_shard_device"] == ["cuda:0"]
        assert all(b > 0 for b in m["peer_bytes_per_rank"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bench_dist_sampling_shard_device_cuda(tmp_path):
    from gnnio.bench import gpu_ipc

    d, _, p = gpu_ipc.small_partitioned(tmp_path, 2, feat_dim=8)
    r = run_cli(["bench", "dist-sampling", str(d), "--nproc", "2", "--partition", str(p),
                 "--modes", "shared", "--shard-device", "cuda", "--batches", "2",
                 "--batch-size", "32", "--fanouts", "4,3", "--json"], timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout.strip().splitlines()[-1])["modes"]["shared"]
    assert res["shared_via"] == "cuda_ipc" and res["bytes_by_link"]["peer"] > 0
