"""Sampling over a partitioned topology (gnnio.distributed.sampling) on gloo processes: both modes give
exactly the single-process sampler's batches, replicated lists are read locally, and the
training / benchmark commands run. Multi-process tests are small and bounded by timeouts."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from tests.test_dist import ROOT, _spawn, free_port, run_cli

FANOUTS = [4, 3, 2]


def _write(tmp: Path) -> tuple[Path, list[Path]]:
    """A small dataset with two hubs, partitioned three ways (2 parts)."""
    import gnnio
    from gnnio.graph import DatasetWriter, edges_to_csr
    from gnnio.preprocess.partition import partition_dataset, save_partition

    rng = np.random.default_rng(5)
    n = 300
    src, dst = rng.integers(0, n, 2400), rng.integers(0, n, 2400)
    dst[:300] = 0  # node 0: a hub with ~300 in-neighbours
    indptr, indices = edges_to_csr(src, dst, n)
    d = tmp / "g"
    with DatasetWriter(d, name="g") as w:
        w.save_array("indptr", indptr)
        w.save_array("indices", indices)
        w.save_array("features", rng.standard_normal((n, 4)).astype(np.float32))
        w.save_array("labels", rng.integers(0, 2, n).astype(np.int64))
        w.save_array("train_idx", np.arange(0, n, 2, dtype=np.int64))
        w.save_array("valid_idx", np.arange(1, n, 4, dtype=np.int64))
        w.save_array("test_idx", np.arange(3, n, 4, dtype=np.int64))
        w.meta["num_classes"] = 2
    ds = gnnio.load(d)
    outs = []
    for method, rep in (("metis", 0.0), ("hdr", 0.02), ("bfs-block", 0.0)):
        p = partition_dataset(ds, 2, method, replicate=rep, seed=1, measure=False)
        outs.append(save_partition(p, ds.graph, tmp / f"p_{method}"))
    return d, outs


def _sampling_worker(
    rank: int, world: int, port: int, dsdir: str, pdirs: list, out: str, shm_dir: str
):
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
    )  # fmt: skip
    import gnnio
    from gnnio.distributed import shm
    from gnnio.distributed.context import init, shutdown
    from gnnio.distributed.sampling import ShardedSampler
    from gnnio.preprocess.partition import load_partition
    from gnnio.sampling import UniformSampler

    shm.SHM_DIR = Path(shm_dir)  # this test's own folder in /dev/shm: other tests' names unseen
    ctx = init(timeout_s=60)
    ds = gnnio.load(dsdir)
    ref = UniformSampler(ds.graph, FANOUTS, seed=3, num_threads=1)
    res = {"identical": True, "hub_counts": {}, "replicated_requests": {}}
    for pdir in pdirs:
        part = load_partition(pdir, ds, world)
        for mode in ("dsp", "shared"):
            s = ShardedSampler(part, pdir, ctx, FANOUTS, seed=3, mode=mode)
            if mode == "shared":  # issue 26: peers' shards read from the owner's /dev/shm
                res.setdefault("shared_via", []).append(s.shared_via)
            rng = np.random.default_rng(10 + rank)
            for b in range(6):  # the same number of calls on every rank (dsp collectives)
                seeds = torch.from_numpy(rng.choice(ds.num_nodes, 40, replace=False))
                a, r = s.sample(seeds, epoch_seed=b), ref.sample(seeds, epoch_seed=b)
                same = torch.equal(a.input_nodes, r.input_nodes) and all(
                    torch.equal(x.edge_index, y.edge_index) and x.num_src == y.num_src
                    for x, y in zip(a.blocks, r.blocks)
                )
                res["identical"] &= bool(same)
            if part.method != "hdr":
                continue
            # neighbour frequencies of the hub (node 0) over many calls, for the chi-square test
            one = ShardedSampler(part, pdir, ctx, [5], seed=3, mode=mode)
            counts = np.zeros(ds.num_nodes, dtype=np.int64)
            for c in range(200):
                mb = one.sample(torch.tensor([0]), epoch_seed=1000 + c)
                ei = mb.blocks[0].edge_index
                counts += np.bincount(mb.input_nodes[ei[0]].numpy(), minlength=ds.num_nodes)
            res["hub_counts"][f"{Path(pdir).name}/{mode}"] = counts.tolist()
            if part.replicated.size:  # a batch of replicated seeds needs no remote list (1 hop)
                r1 = ShardedSampler(part, pdir, ctx, [3], seed=3, mode=mode)
                r1.sample(torch.from_numpy(part.replicated), epoch_seed=7)
                res["replicated_requests"][mode] = r1.stats["requests"]
    res["shm_left"] = sorted(os.listdir(shm_dir))  # removed once mapped, before any rank returns
    Path(out, f"rank{rank}.json").write_text(json.dumps(res))
    shutdown()


def chi2_uniform_p(counts: np.ndarray, support: np.ndarray) -> float:
    """p-value of a chi-square test that ``counts`` over ``support`` are uniform (and zero
    elsewhere: any count outside the support gives p = 0)."""
    if counts.sum() != counts[support].sum():
        return 0.0
    return float(stats.chisquare(counts[support]).pvalue)


def test_chi2_check_fails_on_a_biased_sampler():
    rng = np.random.default_rng(0)
    support = np.arange(50)
    fair = np.bincount(rng.integers(0, 50, 5000), minlength=60)
    assert chi2_uniform_p(fair, support) > 1e-3
    biased = np.bincount(np.minimum(rng.integers(0, 55, 5000), 49), minlength=60)  # last x6
    assert chi2_uniform_p(biased, support) < 1e-3
    outside = fair.copy()
    outside[55] = 1  # a "neighbour" that is not one
    assert chi2_uniform_p(outside, support) == 0.0


def test_partitioned_sampling_matches_single_process(tmp_path):
    import gnnio

    d, pdirs = _write(tmp_path)
    shm_dir = tempfile.mkdtemp(prefix="test-dist-sampling-", dir="/dev/shm")
    try:
        _spawn(_sampling_worker, 2,
               (free_port(), str(d), [str(p) for p in pdirs], str(tmp_path), shm_dir))  # fmt: skip
    finally:
        shutil.rmtree(shm_dir, ignore_errors=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(r["identical"] for r in ranks)  # => every sampled edge exists, same distribution
    ds = gnnio.load(d)
    nbrs = np.unique(ds.graph.indices[ds.graph.indptr[0] : ds.graph.indptr[1]])
    for key, counts in ranks[0]["hub_counts"].items():
        assert chi2_uniform_p(np.asarray(counts), nbrs) > 1e-4, key
    for r in ranks:
        assert r["replicated_requests"] == {"dsp": 0, "shared": 0}
        assert set(r["shared_via"]) == {"shm"} and r["shm_left"] == []


PRUNE = (1.0, 1.0)  # thresholds ceil(8 + f): 12, 11, 10 on the test graph (avg degree ~8)
HUB_PRUNE = (0.0, 20.0)  # fanout 5: a window of 100 of the hub's ~300 neighbours


def _pruned_worker(rank: int, world: int, port: int, dsdir: str, pdirs: list, out: str):
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
    )  # fmt: skip
    import gnnio
    from gnnio.distributed.context import init, shutdown
    from gnnio.distributed.sampling import ShardedSampler
    from gnnio.preprocess.partition import load_partition
    from gnnio.sampling import PrunedUniformSampler

    ctx = init(timeout_s=60)
    ds = gnnio.load(dsdir)
    avg = ds.num_edges / ds.num_nodes
    ip, ix = np.asarray(ds.graph.indptr), np.asarray(ds.graph.indices)
    edge_keys = set((np.repeat(np.arange(ds.num_nodes), np.diff(ip)) * ds.num_nodes + ix).tolist())
    ref = PrunedUniformSampler(ds.graph, FANOUTS, prune=PRUNE, seed=3, num_threads=1)
    res = {"identical": True, "edges_exist": True, "hub_counts": {}, "hub_peer_bytes": {}}
    for pdir in pdirs:
        part = load_partition(pdir, ds, world)
        for mode in ("dsp", "shared"):
            s = ShardedSampler(part, pdir, ctx, FANOUTS, seed=3, mode=mode, prune=PRUNE,
                               avg_degree=avg)  # fmt: skip
            rng = np.random.default_rng(10 + rank)
            for b in range(6):  # the same number of calls on every rank (dsp collectives)
                seeds = torch.from_numpy(rng.choice(ds.num_nodes, 40, replace=False))
                a, r = s.sample(seeds, epoch_seed=b), ref.sample(seeds, epoch_seed=b)
                res["identical"] &= bool(
                    torch.equal(a.input_nodes, r.input_nodes)
                    and all(
                        torch.equal(x.edge_index, y.edge_index) and x.num_src == y.num_src
                        and torch.equal(x.edge_weight, y.edge_weight)
                        for x, y in zip(a.blocks, r.blocks)
                    )
                )  # fmt: skip
                for blk in a.blocks:  # every sampled edge (src -> dst) is one of the graph's
                    src = a.input_nodes[blk.edge_index[0]].numpy()
                    dst = a.input_nodes[blk.edge_index[1]].numpy()
                    res["edges_exist"] &= set((dst * ds.num_nodes + src).tolist()) <= edge_keys
            if part.method != "metis":
                continue
            # the hub (node 0) alone, one hop of 5 from a window of 100: neighbour frequencies
            # and the bytes a rank that does not own it reads, pruned or not
            hub = ShardedSampler(part, pdir, ctx, [5], seed=3, mode=mode, prune=HUB_PRUNE,
                                 avg_degree=avg)  # fmt: skip
            counts = np.zeros(ds.num_nodes, dtype=np.int64)
            for c in range(300):
                mb = hub.sample(torch.tensor([0]), epoch_seed=1000 + c)
                ei = mb.blocks[0].edge_index
                counts += np.bincount(mb.input_nodes[ei[0]].numpy(), minlength=ds.num_nodes)
            res["hub_counts"][mode] = counts.tolist()
            for pr in (None, HUB_PRUNE):
                one = ShardedSampler(part, pdir, ctx, [5], seed=3, mode=mode, prune=pr,
                                     avg_degree=avg)  # fmt: skip
                one.sample(torch.tensor([0]), epoch_seed=1)
                res["hub_peer_bytes"][f"{mode}/{pr is not None}"] = int(one.bytes_by_link["peer"])
    Path(out, f"rank{rank}.json").write_text(json.dumps(res))
    shutdown()


def test_chi2_check_fails_on_a_clipped_pruning_window():
    """The window-uniformity check of the pruned test below rejects a window clipped to the
    list (start in [0, deg - 100], which reads the ends of the list less often) with as many
    draws, and accepts HyDRA's circular window."""
    rng = np.random.default_rng(1)
    deg, theta, k, calls = 300, 100, 5, 300
    support = np.arange(deg)
    for clipped, expect_pass in ((True, False), (False, True)):
        counts = np.zeros(deg + 1, dtype=np.int64)
        for _ in range(calls):
            st = rng.integers(0, deg - theta + 1) if clipped else rng.integers(0, deg)
            counts[(st + rng.choice(theta, k, replace=False)) % deg] += 1
        assert (chi2_uniform_p(counts, support) > 1e-4) == expect_pass


def test_pruned_partitioned_sampling_matches_single_process(tmp_path):
    import gnnio

    d, pdirs = _write(tmp_path)
    _spawn(_pruned_worker, 2, (free_port(), str(d), [str(p) for p in pdirs], str(tmp_path)))
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(r["identical"] and r["edges_exist"] for r in ranks)
    ds = gnnio.load(d)
    ip = np.asarray(ds.graph.indptr)
    nbrs = np.unique(np.asarray(ds.graph.indices)[ip[0] : ip[1]])
    deg = int(ip[1] - ip[0])
    assert deg > 100  # the window really prunes the hub's list
    for mode in ("dsp", "shared"):
        counts = np.asarray(ranks[0]["hub_counts"][mode])
        assert counts.sum() == 300 * 5
        assert chi2_uniform_p(counts, nbrs) > 1e-4, mode
    # shared: a rank that does not own the hub reads its window (100 entries) instead of the
    # whole list, each plus the indptr pair; dsp moves 5 sampled ids either way
    owner = int(np.load(pdirs[0] / "parts.npy")[0])
    other = ranks[1 - owner]["hub_peer_bytes"]
    isz = np.load(pdirs[0] / f"part{owner}" / "indices.npy", mmap_mode="r").dtype.itemsize
    assert other["shared/False"] == isz * deg + 16 and other["shared/True"] == isz * 100 + 16
    assert other["dsp/False"] == 8 * (2 + 5) and other["dsp/True"] == 8 * (3 + 5)
    assert ranks[owner]["hub_peer_bytes"] == {k: 0 for k in other}


#: ``gnnio bench dist-sampling --nproc 2`` on :func:`_write`'s graph, both modes, unpruned and
#: pruned: each launched once for the test below and test_dist_comm's check of its collectives
_BENCH_DS: dict = {}


def bench_dist_sampling(tmp_path_factory, prune: str | None):
    """The run with ``--prune-threshold PRUNE`` (None: without), under ``GNNIO_COMM_CHECK``:
    ``(CompletedProcess, the check's directory)``."""
    if prune not in _BENCH_DS:
        root = tmp_path_factory.mktemp("bench-ds")
        d, pdirs = _write(root)
        extra = [] if prune is None else ["--prune-threshold", prune, "--shard-device", "cpu",
                                          "--overlap"]  # fmt: skip
        r = run_cli(["bench", "dist-sampling", str(d), "--nproc", "2", "--partition",
                     str(pdirs[0]), "--modes", "dsp,shared", "--batches", "3", *extra, "--json"],
                    env={"GNNIO_COMM_CHECK": str(root / "check")}, timeout=300)  # fmt: skip
        _BENCH_DS[prune] = (r, root / "check")
    return _BENCH_DS[prune]


def test_train_and_bench_with_a_partition(tmp_path, tmp_path_factory):
    import gnnio
    from tests.test_dist import _summary

    d, pdirs = _write(tmp_path)
    s_path = tmp_path / "s.json"
    r = run_cli(
        [
            "train",
            str(d),
            "--nproc",
            "2",
            "--epochs",
            "2",
            "--batch-size",
            "32",
            "--hidden",
            "16",
            "--fanouts",
            "4,3",
            "--partition",
            str(pdirs[1]),
            "--sampling-mode",
            "shared",
            "--prune-threshold",
            "1,1",
            "--quiet",
            "--summary",
            str(s_path),
        ]  # fmt: skip
    )
    assert r.returncode == 0, r.stderr[-2000:]
    s = _summary(s_path)
    ps = s["partitioned_sampling"]
    assert ps["mode"] == "shared" and ps["method"] == "hdr"
    assert set(ps["bytes_by_link"]) >= {"local", "peer", "network", "per_rank"}
    assert ps["bytes_by_link"]["peer"] > 0 and s["params_identical"]
    avg = gnnio.load(d).num_edges / gnnio.load(d).num_nodes  # Eq. 4 with (1, 1)
    assert s["sampling"]["sampler"] == "ShardedSampler"
    # which implementation of the hop ran, as the single-process samplers record it
    assert s["kernels"]["hop"] == "numba", s["kernels"]
    assert s["sampling"]["thresholds"] == [math.ceil(avg + f) for f in (4, 3)]
    # fewer batches per epoch than asked (75 seeds per rank, batches of 1024: one per epoch): the
    # next epochs' batches are timed, not none (it printed zeros for Cora)
    r, _ = bench_dist_sampling(tmp_path_factory, None)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "not writable" not in r.stderr  # shm's dtype read from a read-only array: a warning
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["batches"] == 3
    for mode in ("dsp", "shared"):
        m = out["modes"][mode]
        assert set(m["bytes_by_link"]) >= {"local", "peer", "network"}
        assert m["requests_per_batch"] > 0 and m["ms_per_batch"] > 0
    # pruned (HyDRA Eq. 4, (0, 1): windows of one fanout): fewer bytes per remote list read
    r, _ = bench_dist_sampling(tmp_path_factory, "0,1")
    assert r.returncode == 0, r.stderr[-2000:]
    pruned = json.loads(r.stdout.strip().splitlines()[-1])
    # issue 26: the CPU's path, asked for or by default (the rank's device on gloo)
    assert pruned["modes"]["shared"]["shared_via"] == out["modes"]["shared"]["shared_via"] == "shm"
    assert pruned["prune_threshold"] == [0.0, 1.0] and pruned["thresholds"] == [15, 10, 5]
    a, b = out["modes"]["shared"], pruned["modes"]["shared"]  # (other frontiers after hop 1)
    per_request = [m["bytes_by_link"]["peer"] / m["requests_per_batch"] for m in (a, b)]
    assert per_request[1] < per_request[0], per_request
    # --overlap (HyDRA Eq. 5-6): the same batches all-local and all-remote, the rates from them
    from gnnio.bench.dist_overlap import overlap_rates

    assert all("overlap" not in m for m in out["modes"].values())  # only when asked
    for m in pruned["modes"].values():
        ov = m["overlap"]
        assert ov["batches_identical"] is True and 0 < ov["eta"] < 1
        assert ov["t_observed_ms"] == m["ms_per_batch"] and ov["t_remote_ms"] > 0
        want = overlap_rates(ov["eta"], ov["t_local_ms"], ov["t_remote_ms"], ov["t_observed_ms"])
        assert {k: ov[k] for k in want} == want
    a, b = pruned["modes"]["dsp"]["overlap"], pruned["modes"]["shared"]["overlap"]
    assert a["eta"] == b["eta"] and a["t_local_ms"] == b["t_local_ms"]  # one all-local run
    r = run_cli(["bench", "dist-sampling", str(d), "--partition", str(pdirs[0]),
                 "--prune-threshold", "0,0"])  # fmt: skip
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("gnnio:")]
    assert r.returncode != 0 and len(lines) == 1 and "--prune-threshold" in lines[0]


def test_partition_for_other_ranks_is_refused(tmp_path):
    d, pdirs = _write(tmp_path)
    r = run_cli(["train", str(d), "--nproc", "3", "--epochs", "1", "--partition",
                 str(pdirs[0]), "--quiet"], timeout=120)  # fmt: skip
    assert r.returncode != 0
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("gnnio:")]
    assert len(lines) == 1 and "2 parts, the run has 3 ranks" in lines[0], r.stderr[-2000:]


def test_partition_refuses_samplers_it_cannot_run():
    from gnnio.errors import UsageError
    from gnnio.train import TrainConfig

    with pytest.raises(UsageError, match="--locality-scale"):
        TrainConfig(partition="p", locality_scale=2.0).validate_dist(2)
    TrainConfig(partition="p", prune_threshold=(1.0, 1.0)).validate_dist(2)  # pruning: accepted
    with pytest.raises(UsageError, match="--partition"):
        TrainConfig(partition="p").validate_dist(1)


_ = (subprocess, sys, ROOT)  # shared helpers imported for symmetry with test_dist
