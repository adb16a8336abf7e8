"""Every option of single-process ``gnnio train`` with several ranks: it works, or it is refused
with one line naming it (issue 13).

The refusals are checked in-process (they fail before any rank starts); three small ``--nproc 2``
runs (a 3,000-node synthetic graph, 2-3 epochs, each under a timeout) cover the options that work,
several per run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from gnnio.errors import UsageError
from gnnio.train import TrainConfig

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def syn(tmp_path_factory) -> Path:
    from gnnio.importers.synthetic import prepare_synthetic

    out = tmp_path_factory.mktemp("distopt") / "syn"
    prepare_synthetic(
        out, num_nodes=3000, avg_degree=8, feat_dim=16, num_classes=4, seed=1, progress=False
    )
    return out


def _placement_file(ds, path: Path, strategy: str, devices: int, num_nodes: int | None = None):
    from gnnio.placement import PlacementRequest, place, save_placement
    from gnnio.placement.topology import load_topology

    n = num_nodes or ds.num_nodes
    req = PlacementRequest(
        probs=np.ones(n), topology=load_topology(str(devices)), buffer_rows=n // 10, seed=0
    )
    pl = place(strategy, req)
    if num_nodes is None:
        pl.params.update(dataset=ds.name, dataset_fingerprint=ds.fingerprint)
    return save_placement(pl, path)


# ----------------------------------------------------------------------------------------------
# refusals: exit 2, one line on stderr naming the option, before any rank starts


@pytest.fixture(scope="module")
def plans(syn, tmp_path_factory) -> dict[str, str]:
    import gnnio

    ds = gnnio.load(syn)
    d = tmp_path_factory.mktemp("plans")
    return {
        "four": str(_placement_file(ds, d / "four.npz", "interleaved", 4)),
        "nopart": str(_placement_file(ds, d / "nopart.npz", "interleaved", 2)),
        "small": str(_placement_file(ds, d / "small.npz", "naive", 2, num_nodes=10)),
    }


REFUSED = [
    (["--eval", "full"], "--eval full: single-process only"),
    (["--gpu-cache-fraction", "0.1"], "--gpu-cache-fraction"),
    (["--gpu-budget", "1000"], "--gpu-budget"),
    (["--reader", "1"], "--reader: single-process only"),
    (["--local-seeds"], "--local-seeds: placement 'alg1' has no partition"),
    (["--local-seeds", "--placement-strategy", "mod"], "placement 'mod' has no partition"),
    (["--placement", "{four}"], "made for 4 devices, the run has 2 ranks"),
    (["--placement", "{nopart}", "--local-seeds"], "'interleaved' in .* has no partition"),
    (["--placement", "{small}"], "made for a dataset of 10 nodes"),
    (["--placement", "{nopart}", "--placement-strategy", "alg1"], "exclude each other"),
    (["--locality-scale", "0.5"], "--locality-scale"),
]


@pytest.mark.parametrize("extra, words", REFUSED)
def test_refused_with_one_line_before_launch(syn, plans, extra, words, capsys, monkeypatch):
    import re

    from gnnio.cli.main import main

    def no_launch(*a, **k):  # a refusal must come before any process starts
        raise AssertionError("ranks were launched")

    monkeypatch.setattr("gnnio.distributed.launch.launch", no_launch)
    argv = ["train", str(syn), "--nproc", "2", "--quiet", *[a.format(**plans) for a in extra]]
    assert main(argv) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("gnnio: error: "), err
    assert re.search(words, err[0]), err[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_device_cuda_without_cuda_is_one_line(syn, capsys):
    from gnnio.cli.main import main

    assert main(["train", str(syn), "--nproc", "2", "--device", "cuda", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--device cuda: CUDA is not available" in err[0]


def test_locality_scale_needs_no_gpu_set_with_ranks():
    # one process needs a GPU-resident set; with ranks the placement always is one
    with pytest.raises(UsageError, match="needs nodes held on the GPU"):
        TrainConfig(locality_scale=2.0).validate()
    TrainConfig(locality_scale=2.0).validate(2)
    TrainConfig(locality_scale="auto", placement_strategy="mod").validate_dist(2)


def test_local_seeds_needs_a_partitioning_strategy():
    for strategy in ("metis", "naive", "random"):
        TrainConfig(local_seeds=True, placement_strategy=strategy).validate_dist(2)
    TrainConfig(local_seeds=True, placement="p.npz").validate_dist(2)  # checked on the file
    for strategy in (None, "alg1", "interleaved", "mod", "rule1"):
        with pytest.raises(UsageError, match="--local-seeds"):
            TrainConfig(local_seeds=True, placement_strategy=strategy).validate_dist(2)


# ----------------------------------------------------------------------------------------------
# the orders a rank trains on


def test_proximity_order_shards_with_equal_batches():
    from gnnio.ordering.po import ProximityOrder
    from tests.helpers import random_graph

    g = random_graph(500, 3000, seed=4)
    seeds = np.arange(0, 500, 2)[:251]  # 251 seeds: shares of 126 and 125
    labels = np.arange(500) % 3
    for world in (2, 3):
        got, counts = [], set()
        for r in range(world):
            o = ProximityOrder(g, seeds, labels, 32, seed=1, rank=r, world_size=world,
                               equal_batches=True)  # fmt: skip
            assert o.equal_batches and o.world_size == world
            bs = list(o.batches(1))
            counts.add(len(bs))
            assert len(bs) == o.num_batches and min(len(b) for b in bs) >= 1
            got += [int(x) for b in bs for x in b]
        assert len(counts) == 1 and sorted(got) == sorted(seeds.tolist())
    with pytest.raises(ValueError, match="equal_batches"):
        ProximityOrder(g, seeds, labels, 32, num_sequences=2, drop_last=True, equal_batches=True)


def test_local_seeds_order_with_po_inner():
    from gnnio.distributed.train import LocalSeedsOrder
    from gnnio.ordering.po import ProximityOrder
    from tests.helpers import random_graph

    g = random_graph(300, 2000, seed=5)
    mine = np.arange(1, 300, 3)
    inner = ProximityOrder(g, mine, np.arange(300) % 4, 25, seed=2)
    o = LocalSeedsOrder(mine, 25, num_batches=6, seed=2, order=inner)
    for epoch in (0, 1):
        bs = list(o.batches(epoch))
        assert len(bs) == 6
        flat = torch.cat(bs).numpy()
        np.testing.assert_array_equal(flat, inner.epoch_order(epoch))
    assert o.num_sequences == inner.num_sequences


# ----------------------------------------------------------------------------------------------
# a cache in front of host memory never lets a rank skip the exchange


@pytest.mark.parametrize("policy", ["static", "fifo", "lru", "lfu"])
def test_cache_never_skips_the_collective(policy):
    from gnnio.distributed.store import ShardedFeatureStore
    from gnnio.features import InMemoryFeatureStore
    from gnnio.features.caches.cache import FeatureCache
    from gnnio.placement import PlacementRequest, place
    from gnnio.placement.topology import load_topology

    n, dim = 200, 3
    feats = torch.randn(n, dim)
    topo = load_topology("2")
    pl = place("mod", PlacementRequest(probs=np.ones(n), topology=topo, buffer_rows=40))
    ctx = SimpleNamespace(rank=0, world_size=2, device=torch.device("cpu"), topology=topo,
                          topo=topo)  # fmt: skip
    hot = np.arange(n) if policy == "static" else None  # static: every row cached
    cache = FeatureCache(InMemoryFeatureStore(feats), n, policy, hot_ids=hot, tier="cache")
    store = ShardedFeatureStore(cache, pl, ctx, reuse=False)
    calls = []
    store._exchange = lambda owner, pos, where, rows: calls.append(int(owner.numel())) or 0
    host_ids = torch.from_numpy(np.flatnonzero(store.dev_num.numpy() < 0)[:30])
    for _ in range(3):  # the same host rows again: all cached after the first gather
        store.gather(host_ids)
    store.gather(torch.zeros(0, dtype=torch.long))  # an empty batch takes part too
    assert calls == [0, 0, 0, 0]
    assert store.counters.rows.get("cache", 0) >= 60 and "cache" in store.tiers


# ----------------------------------------------------------------------------------------------
# several options per run, on 2 gloo ranks


def _train(syn: Path, tmp_path: Path, *extra: str, timeout: float = 150) -> dict:
    s_path = tmp_path / "s.json"
    cmd = [sys.executable, "-m", "gnnio", "train", str(syn), "--nproc", "2", "--batch-size",
           "128", "--hidden", "16", "--fanouts", "5,5", "--quiet", "--summary", str(s_path),
           "--dist-timeout", "60", *extra]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                       env=dict(os.environ))  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads(s_path.read_text())
    assert s["world_size"] == 2 and s["params_identical"] is True
    assert len(set(s["epochs_per_rank"])) == 1 and s["epochs_per_rank"][0] == s["epochs"]
    return s


def test_po_caches_locality_pruning(syn, tmp_path):
    s = _train(syn, tmp_path, "--epochs", "2", "--order", "po", "--cache-policy", "fifo",
               "--no-reuse", "--locality-scale", "2", "--prune-threshold", "--store", "memory",
               "--threads", "1", "--model", "gat", "--heads", "2")  # fmt: skip
    import gnnio

    assert s["order"]["kind"] == "ProximityOrder" and s["order"]["num_sequences"] >= 1
    assert sum(s["seeds_per_epoch_per_rank"]) == gnnio.load(syn).train_idx.size
    assert s["sampling"]["sampler"] == "LocalitySampler"
    assert s["sampling"]["scale_per_epoch"] == [2.0, 2.0]
    assert s["sampling"]["prune_threshold"] == [1.0, 1.0]
    assert s["data_setup"]["cache"]["policy"] == "fifo"
    assert s["rows_by_tier"]["cache"] > 0 and "reuse" not in s["rows_by_tier"]
    assert s["config"]["store"] == "memory" and s["config"]["threads"] == 1


def test_local_seeds_checkpoint_log_patience(syn, tmp_path):
    from gnnio.train import load_checkpoint
    from gnnio.train.models import build_model

    ck, log = tmp_path / "ck.pt", tmp_path / "log.jsonl"
    # full neighbourhoods and a vanishing learning rate: the valid accuracy cannot improve after
    # epoch 0, so --patience 1 stops every rank after epoch 1
    s = _train(syn, tmp_path, "--epochs", "4", "--placement-strategy", "metis", "--local-seeds",
               "--checkpoint", str(ck), "--log", str(log), "--patience", "1", "--model", "gcn",
               "--fanouts=-1,-1", "--lr", "1e-9", "--dropout", "0")  # fmt: skip
    assert s["placement"] == "metis" and s["order"]["kind"] == "LocalSeedsOrder"
    assert s["stopped_early"] and s["epochs"] == 2 and s["epochs_per_rank"] == [2, 2]
    assert s["config"]["store"] == "mmap"  # the default with several ranks
    recs = [json.loads(x) for x in log.read_text().splitlines()]
    assert len(recs) == 2 and {r["rank"] for r in recs} == {0}  # rank 0 writes the log
    import gnnio

    ds = gnnio.load(syn)
    model = build_model("gcn", ds.feat_dim, 16, ds.num_classes, 2)
    load_checkpoint(ck, model)  # a plain state_dict (no DDP "module." prefix)


def test_plan_file_with_static_cache_and_auto_scale(syn, tmp_path):
    from gnnio.cli.main import main

    plan = tmp_path / "plan.npz"
    assert main(["plan", str(syn), "--topology", "2", "--buffer", "0.1", "--strategies",
                 "alg1", "--fanouts", "5,5", "--save", str(plan), "--quiet"]) == 0  # fmt: skip
    s = _train(syn, tmp_path, "--epochs", "2", "--placement", str(plan), "--cache-policy",
               "static", "--score", "degree", "--locality-scale", "auto",
               "--locality-compute-s", "0.001", "--model", "gin",
               "--eval-batch-size", "200")  # fmt: skip
    assert s["placement"] == "alg1" and s["data_setup"]["placement"]["file"] == str(plan)
    assert s["feature_bytes_by_link"]["peer"] > 0
    assert s["rows_by_tier"]["cache"] > 0
    assert s["sampling"]["loading_share_kind"] == "modeled"
    assert len(s["sampling"]["scale_per_epoch"]) == 2


@pytest.mark.parametrize("timeout_s", [0.5, 1.5, 7])
def test_a_fractional_dist_timeout_reaches_the_rendezvous_as_whole_seconds(timeout_s, monkeypatch):
    """``--dist-timeout 0.5`` is accepted (any s > 0), and the launcher's rendezvous takes whole
    seconds: 0.5 truncated to 0 made torch refuse the zero timeout with a traceback. The timeout
    is rounded up, and torch's own check accepts what the launcher hands it."""
    import math
    from datetime import timedelta

    import torch.distributed.launcher.api as api
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousTimeout

    from gnnio.distributed.launch import launch

    seen = {}

    def fake_elastic_launch(config, entrypoint):
        seen.update(config.rdzv_configs)
        return lambda entry, argv: {0: 0, 1: 0}

    monkeypatch.setattr(api, "elastic_launch", fake_elastic_launch)
    assert launch(2, print, [], timeout_s=timeout_s) == {0: 0, 1: 0}
    assert seen["timeout"] == seen["join_timeout"] == math.ceil(timeout_s)
    RendezvousTimeout(join=timedelta(seconds=seen["join_timeout"]))  # raises on a zero timeout
