"""``gnnio train`` data-I/O options: tiering, placement, caches and the seed order.

The central check: a store option changes *where* rows come from, never *which* rows. With the same
seed, a run through any of these stores must see bit-identical features, hence the identical loss
history, as the plain in-memory run, and its per-tier byte counters must add up to the plain run's
total."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gnnio import load
from gnnio.errors import UsageError
from gnnio.features import open_store
from gnnio.importers.synthetic import prepare_synthetic
from gnnio.ordering import RandomOrder
from gnnio.pipeline.loader import NodeLoader
from gnnio.sampling import UniformSampler
from gnnio.train import TrainConfig, train


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("data") / "syn"
    prepare_synthetic(
        out, num_nodes=800, avg_degree=6, feat_dim=8, num_classes=3, seed=1, progress=False
    )
    return out


def cfg(**kw) -> TrainConfig:
    base = dict(
        fanouts=(4, 3),
        batch_size=64,
        epochs=2,
        hidden=16,
        lr=0.01,
        progress=False,
        seed=3,
        prefetch=1,
    )
    base.update(kw)
    return TrainConfig(**base)


@pytest.fixture(scope="module")
def plain(data):
    return train(data, cfg())


def losses(s):
    return [h["loss"] for h in s["history"]]


def total(s):
    return sum(s["bytes_by_tier"].values())


@pytest.mark.parametrize("fraction", [0.0, 0.25, 1.0])
def test_tiered_same_rows_and_bytes_split(data, plain, fraction):
    s = train(data, cfg(gpu_cache_fraction=fraction, score="degree"))
    assert losses(s) == losses(plain)
    b = s["bytes_by_tier"]
    assert set(b) == {"gpu", "host"}
    assert b["gpu"] + b["host"] == total(plain)
    if fraction == 0.0:
        assert b["gpu"] == 0
    elif fraction == 1.0:
        assert b["host"] == 0
    else:
        assert 0 < b["gpu"] < total(plain)
    t = s["data_setup"]["tiering"]
    assert t["hot_rows"] == round(fraction * 800) and t["simulated"]


def test_tiered_gpu_bytes_are_the_hot_rows(data):
    """The gpu tier serves exactly the reads of the top-scored ids: recount from the loader."""
    from gnnio.preprocess.hotness import compute_score
    from gnnio.preprocess.reorder import order_by_score

    s = train(data, cfg(gpu_cache_fraction=0.2, score="degree", epochs=1))
    ds = load(data)
    hot = order_by_score(compute_score("degree", ds, progress=False))[:160]
    # replay the same epoch's batches with the plain store
    sampler = UniformSampler(ds.graph, [4, 3], seed=3)
    order = RandomOrder(torch.from_numpy(ds.train_idx), 64, seed=3)
    loader = NodeLoader(sampler, open_store(ds, "memory", "cpu"), order)
    hot_rows = all_rows = 0
    is_hot = np.zeros(ds.num_nodes, bool)
    is_hot[hot] = True
    for b in loader.epoch(0):
        ids = b.input_nodes.numpy()
        hot_rows += int(is_hot[ids].sum())
        all_rows += ids.size
    rb = ds.feat_dim * 4
    assert s["bytes_by_tier"]["gpu"] == hot_rows * rb
    assert s["bytes_by_tier"]["host"] == (all_rows - hot_rows) * rb


def test_placement_file(data, plain, tmp_path):
    from gnnio.placement import PlacementRequest, place, save_placement
    from gnnio.placement.topology import load_topology
    from gnnio.placement.validate import bind

    ds = load(data)
    probs = np.random.default_rng(0).random(ds.num_nodes)
    req = PlacementRequest(probs=probs, topology=load_topology("2+2"), buffer_rows=100)
    pl = place("alg1", req)
    bind(pl, ds)  # as gnnio plan --save does: the file is for this dataset only
    f = save_placement(pl, tmp_path / "p.npz")
    s = train(data, cfg(placement=str(f), reader=2))
    assert losses(s) == losses(plain)
    b = s["bytes_by_tier"]
    assert set(b) == {"local", "peer", "host"} and sum(b.values()) == total(plain)
    assert b["local"] > 0 and b["peer"] > 0
    assert s["data_setup"]["placement"]["reader"] == 2
    with pytest.raises(UsageError, match="--reader"):
        train(data, cfg(placement=str(f), reader=4))


@pytest.mark.parametrize("policy", ["static", "fifo", "lru", "lfu"])
def test_cache_policies(data, plain, policy):
    s = train(data, cfg(cache_policy=policy, cache_size=0.1))
    assert losses(s) == losses(plain)
    b = s["bytes_by_tier"]
    assert b["cache"] + b["host"] == total(plain)
    assert b["cache"] > 0
    assert s["data_setup"]["cache"]["capacity"] == 80


def test_static_cache_over_tiering_holds_other_rows(data, plain):
    s = train(
        data, cfg(gpu_cache_fraction=0.1, score="degree", cache_policy="static", cache_size=0.1)
    )
    assert losses(s) == losses(plain)
    b = s["bytes_by_tier"]
    assert b["cache"] + b["gpu"] + b["host"] == total(plain)
    assert b["cache"] > 0 and b["gpu"] > 0


def test_po_order_covers_every_seed(data):
    s = train(data, cfg(order="po", po_sequences=4))
    n_train = load(data).train_idx.size
    assert all(h["seeds"] == n_train for h in s["history"])
    assert s["order"]["kind"] == "ProximityOrder" and s["order"]["num_sequences"] == 4


def test_reordered_dataset_uses_prefix_mode(data, plain, tmp_path):
    from gnnio.preprocess.hotness import compute_score
    from gnnio.preprocess.reorder import order_by_score, reorder_dataset

    out = tmp_path / "re"
    ds = load(data)
    new2old = order_by_score(compute_score("degree", ds, progress=False))
    reorder_dataset(ds, new2old, out, progress=False, reordered_by="degree")
    s = train(out, cfg(gpu_cache_fraction=0.25, score="degree"))
    assert s["data_setup"]["tiering"]["mode"] == "prefix"
    assert s["data_setup"]["tiering"]["reordered_by_score"]
    assert sum(s["bytes_by_tier"].values()) > 0


def test_a_prefix_ranked_with_other_score_parameters_is_ranked_again(data, tmp_path):
    """The id prefix is the hot set only when the reorder's score had this run's parameters
    (meta["reorder_score"]); else train ranks the rows itself, as for an unreordered dataset."""
    from gnnio.preprocess.hotness import compute_score
    from gnnio.preprocess.reorder import reorder_path
    from gnnio.train.setup import build_store, hot_prefix, needs_score

    other = reorder_path(data, "rpr", out=tmp_path / "d5", progress=False, damping=0.5)
    same = reorder_path(data, "rpr", out=tmp_path / "d85", progress=False)
    assert load(other["out"]).meta["reorder_score"] == {"name": "rpr", "damping": 0.5,
                                                        "iterations": 20}  # fmt: skip
    c = cfg(gpu_cache_fraction=0.25, score="rpr")
    assert hot_prefix(load(same["out"]), c) == (True, None)
    ds = load(other["out"])
    took, why = hot_prefix(ds, c)
    assert not took and "damping 0.5" in why and "damping 0.85" in why, why
    assert needs_score(ds, c)
    score = compute_score("rpr", ds, progress=False)
    st = build_store(ds, c, torch.device("cpu"), score=score)
    top = np.argsort(-score, kind="stable")[: st.store.num_hot]
    assert set(st.gpu_ids.tolist()) == set(top.tolist())  # train's own ranking, not the prefix
    assert st.info["tiering"]["mode"] != "prefix" and not st.info["tiering"]["reordered_by_score"]
    assert st.info["tiering"]["reordered_note"] == why
    # fanout scores: the fanouts must agree too
    fan = reorder_path(data, "sj_fanout", out=tmp_path / "f", progress=False, fanouts=(4, 3))
    assert hot_prefix(load(fan["out"]), cfg(gpu_cache_fraction=0.25, score="sj_fanout"))[0]
    far = hot_prefix(load(fan["out"]), cfg(gpu_cache_fraction=0.25, score="sj_fanout",
                                           fanouts=(5, 3)))  # fmt: skip
    assert far[0] is False and "fanouts [4, 3]" in far[1]


def test_a_legacy_reorder_record_keeps_the_prefix(data, tmp_path):
    """A dataset reordered before the parameters were recorded (only ``reordered_by``): its
    prefix is taken, as before, and the summary says the parameters were not recorded."""
    from gnnio.preprocess.reorder import reorder_path

    out = reorder_path(data, "rpr", out=tmp_path / "r", progress=False, damping=0.5)["out"]
    meta_path = tmp_path / "r" / "meta.json"
    meta = json.loads(meta_path.read_text())
    del meta["reorder_score"]
    meta_path.write_text(json.dumps(meta))
    s = train(out, cfg(gpu_cache_fraction=0.25, score="rpr", epochs=1))
    t = s["data_setup"]["tiering"]
    assert t["mode"] == "prefix" and t["reordered_by_score"]
    assert "not recorded" in t["reordered_note"]


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"gpu_cache_fraction": 1.5}, "--gpu-cache-fraction"),
        ({"gpu_cache_fraction": -0.1}, "--gpu-cache-fraction"),
        ({"score": "hot"}, "--score"),
        ({"placement": "p.npz", "gpu_cache_fraction": 0.1}, "exclude"),
        ({"cache_policy": "arc"}, "--cache-policy"),
        ({"cache_size": 2.0}, "--cache-size"),
        ({"order": "bfs"}, "--order"),
        ({"po_sequences": 0}, "--po-sequences"),
    ],
)
def test_option_errors(kw, match):
    with pytest.raises(UsageError, match=match):
        cfg(**kw).validate()


def test_cli_gpu_cache_fraction_summary_keys(data, tmp_path, capsys):
    from gnnio.cli.main import main

    f = tmp_path / "s.json"
    argv = ["train", str(data), "--gpu-cache-fraction", "0.1", "--score", "wrpr"]
    argv += ["--epochs", "1", "--fanouts", "3,3", "--summary", str(f), "--quiet"]
    assert main(argv) == 0
    s = json.loads(f.read_text())
    assert {"host", "gpu"} <= set(s["bytes_by_tier"])
    assert s["bytes_by_tier"]["gpu"] > 0 and s["bytes_by_tier"]["host"] > 0
    assert "gpu" in capsys.readouterr().out


def test_cli_missing_placement_is_one_line_error(data, tmp_path, capsys):
    from gnnio.cli.main import main

    rc = main(["train", str(data), "--placement", str(tmp_path / "none.npz"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "placement file not found" in err and "\n" not in err


def test_locality_scale_fixed_reads_more_gpu_rows(data):
    base = train(data, cfg(gpu_cache_fraction=0.2, score="degree", epochs=1))
    las = train(data, cfg(gpu_cache_fraction=0.2, score="degree", epochs=1, locality_scale=8.0))
    assert las["sampling"]["sampler"] == "LocalitySampler"
    assert las["sampling"]["scale_per_epoch"] == [8.0]

    def share(s):
        b = s["bytes_by_tier"]
        return b["gpu"] / (b["gpu"] + b["host"])

    assert share(las) > share(base) + 0.05


def test_locality_scale_auto_follows_algorithm2(data):
    # a tiny modeled compute time makes loading dominate: Algorithm 2 doubles s up to MAXS
    s = train(
        data,
        cfg(
            gpu_cache_fraction=0.2,
            score="degree",
            epochs=5,
            locality_scale="auto",
            locality_max_scale=4.0,
            locality_compute_s=1e-9,
        ),
    )
    assert s["sampling"]["scale_per_epoch"] == [1.0, 2.0, 4.0, 4.0, 4.0]
    assert all(h["loading_share_kind"] == "modeled" for h in s["history"])


def test_prune_threshold_uses_pruned_sampler(data):
    s = train(data, cfg(prune_threshold=(0.0, 1.0)))
    assert s["sampling"]["sampler"] == "PrunedUniformSampler"
    assert s["sampling"]["thresholds"] == [4, 3]


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"locality_scale": 4.0}, "needs nodes held on the GPU"),
        ({"locality_scale": 0.5, "gpu_cache_fraction": 0.1}, "--locality-scale"),
        ({"locality_scale": "big", "gpu_cache_fraction": 0.1}, "--locality-scale"),
        ({"prune_threshold": (1.0, -1.0)}, "--prune-threshold"),
    ],
)
def test_locality_option_errors(kw, match):
    with pytest.raises(UsageError, match=match):
        cfg(**kw).validate()


def test_cli_locality_scale(data, tmp_path):
    from gnnio.cli.main import main

    f = tmp_path / "s.json"
    argv = ["train", str(data), "--gpu-cache-fraction", "0.1", "--locality-scale", "2"]
    argv += ["--epochs", "1", "--fanouts", "3,3", "--summary", str(f), "--quiet"]
    assert main(argv) == 0
    s = json.loads(f.read_text())
    assert s["sampling"]["final_scale"] == 2.0 and {"gpu", "host"} <= set(s["bytes_by_tier"])
    assert main(["train", str(data), "--prune-threshold", "1", "--quiet"]) == 2
