"""Sampling over a partitioned topology (gnnio.dist.sampling) on gloo processes: both modes give
exactly the single-process sampler's batches, replicated lists are read locally, and the
training / benchmark commands run. Multi-process tests are small and bounded by timeouts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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


def _sampling_worker(rank: int, world: int, port: int, dsdir: str, pdirs: list, out: str):
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
    )  # fmt: skip
    import gnnio
    from gnnio.dist.context import init, shutdown
    from gnnio.dist.sampling import ShardedSampler
    from gnnio.preprocess.partition import load_partition
    from gnnio.sampling import UniformSampler

    ctx = init(timeout_s=60)
    ds = gnnio.load(dsdir)
    ref = UniformSampler(ds.graph, FANOUTS, seed=3, num_threads=1)
    res = {"identical": True, "hub_counts": {}, "replicated_requests": {}}
    for pdir in pdirs:
        part = load_partition(pdir, ds, world)
        for mode in ("dsp", "shared"):
            s = ShardedSampler(part, pdir, ctx, FANOUTS, seed=3, mode=mode)
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
    _spawn(_sampling_worker, 2, (free_port(), str(d), [str(p) for p in pdirs], str(tmp_path)))
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(r["identical"] for r in ranks)  # => every sampled edge exists, same distribution
    ds = gnnio.load(d)
    nbrs = np.unique(ds.graph.indices[ds.graph.indptr[0] : ds.graph.indptr[1]])
    for key, counts in ranks[0]["hub_counts"].items():
        assert chi2_uniform_p(np.asarray(counts), nbrs) > 1e-4, key
    for r in ranks:
        assert r["replicated_requests"] == {"dsp": 0, "shared": 0}


def test_train_and_bench_with_a_partition(tmp_path):
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
    r = run_cli(
        [
            "bench",
            "dist-sampling",
            str(d),
            "--nproc",
            "2",
            "--partition",
            str(pdirs[0]),
            "--modes",
            "dsp,shared",
            "--batches",
            "2",
            "--batch-size",
            "16",
            "--json",
        ]  # fmt: skip
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    for mode in ("dsp", "shared"):
        m = out["modes"][mode]
        assert set(m["bytes_by_link"]) >= {"local", "peer", "network"}
        assert m["requests_per_batch"] > 0 and m["ms_per_batch"] > 0


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

    with pytest.raises(UsageError, match="--prune-threshold"):
        TrainConfig(partition="p", prune_threshold=(1.0, 1.0)).validate_dist(2)
    with pytest.raises(UsageError, match="--partition"):
        TrainConfig(partition="p").validate_dist(1)


_ = (subprocess, sys, ROOT)  # shared helpers imported for symmetry with test_dist
