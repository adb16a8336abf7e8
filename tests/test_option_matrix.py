"""Training across the options, two by two against a baseline:

- **where rows live does not change what is learnt**: every option of the data path (the store,
  threads, loader depth, heap, isolation, Data Tiering's GPU tier and its budget, BGL's caches)
  gives the baseline's ``loss_history``, test accuracy and rows per epoch bit for bit on the
  CPU -- a cache or tier that returned one wrong row, or a loader that reordered batches,
  changes the losses;
- **a resumed run ends as the uninterrupted one** for every option that keeps state across
  batches (the seed order, the samplers' random streams, the caches, the locality scale,
  pruning): killed after a mid-epoch checkpoint (or, for the caches that run ahead of
  training within an epoch and so checkpoint at epoch ends only, after an epoch) and resumed,
  the run has the same history, losses, accuracies, bytes per tier and parameters.

``test_checkpoint.py`` holds the resume machinery's own tests; ``test_train_disk.py`` the disk
tier's resume and its losses against memory; ``test_dist_invariance.py`` the same across ranks
(where HyDRA's cross-batch reuse acts)."""

from __future__ import annotations

import pytest

from gnnio.importers.synthetic import prepare_synthetic
from gnnio.train import TrainConfig, train
from gnnio.train.checkpoint import checkpoint_files
from tests.helpers import final_params, results, same_params


@pytest.fixture(scope="module")
def easy(tmp_path_factory):
    out = tmp_path_factory.mktemp("data") / "easy"
    prepare_synthetic(out, num_nodes=1200, avg_degree=8, feat_dim=16, num_classes=4, seed=0,
                      split=(0.5, 0.2, 0.3), progress=False)  # fmt: skip
    return out


def cfg(**kw) -> TrainConfig:
    # 600 training seeds in batches of 64: 10 batches an epoch, so the caches and the loader's
    # queue carry state from batch to batch
    base = dict(fanouts=(5, 5), batch_size=64, epochs=2, hidden=16, lr=0.01, progress=False)
    return TrainConfig(**{**base, **kw})


#: options that only move rows or time: the model must see the same rows in the same order
DATA_PATH = {
    "mmap": {"store": "mmap"},
    "threads-1": {"threads": 1},
    "prefetch-1": {"prefetch": 1},
    "prefetch-5": {"prefetch": 5},
    "heap-system": {"heap": "system"},
    "isolation": {"isolation": "auto"},
    "tier-10%": {"gpu_cache_fraction": 0.1},
    "tier-all": {"gpu_cache_fraction": 1.0},
    "tier-degree": {"gpu_cache_fraction": 0.25, "score": "degree"},
    "tier-budget": {"gpu_cache_fraction": 0.5, "gpu_budget_bytes": 4096},
    "static": {"cache_policy": "static", "cache_size": 0.1},
    "fifo": {"cache_policy": "fifo", "cache_size": 0.1},
    "lru": {"cache_policy": "lru", "cache_size": 0.05},
    "lfu": {"cache_policy": "lfu", "cache_size": 0.05},
    "lookahead": {"cache_policy": "lookahead", "cache_size": 0.05, "lookahead": 3},
    "two-level": {"cache_policy": "fifo", "cache_size": 0.02, "cpu_cache_size": 0.1},
    "tier+fifo": {"gpu_cache_fraction": 0.1, "cache_policy": "fifo", "cache_size": 0.05},
}


@pytest.fixture(scope="module")
def baseline(easy):
    return train(easy, cfg())


@pytest.mark.filterwarnings("ignore:TieredFeatureStore")  # the budget's clamp warns, as it should
@pytest.mark.parametrize("name", sorted(DATA_PATH))
def test_where_rows_live_does_not_change_what_is_learnt(easy, baseline, name):
    s = train(easy, cfg(**DATA_PATH[name]))
    assert s["loss_history"] == baseline["loss_history"]
    acc = ("test_acc", "best_valid_acc")
    assert [s[k] for k in acc] == [baseline[k] for k in acc]
    # the same rows reached the model, from other tiers
    rows = [sum(h["rows_by_tier"].values()) for h in s["history"]]
    assert rows == [sum(h["rows_by_tier"].values()) for h in baseline["history"]]


#: options whose state crosses batches; the caches that run ahead of training within an epoch
#: checkpoint at epoch ends only (``--checkpoint-every`` refuses them)
STATEFUL = {
    "po-order": ({"order": "po"}, 4),
    "labor": ({"sampler": "labor"}, 4),
    "ladies": ({"sampler": "ladies", "layer_size": 64}, 4),
    "locality-8": ({"gpu_cache_fraction": 0.1, "locality_scale": 8.0}, 4),
    "prune": ({"prune_threshold": (1.0, 1.0)}, 4),
    "static": ({"cache_policy": "static", "cache_size": 0.1}, 4),
    "tier": ({"gpu_cache_fraction": 0.1}, 4),
    "gat": ({"model": "gat"}, 4),
    "eval-full": ({"eval": "full"}, 4),
    "patience": ({"patience": 1, "epochs": 4}, 4),
    "fifo": ({"cache_policy": "fifo", "cache_size": 0.1}, None),
    "lfu": ({"cache_policy": "lfu", "cache_size": 0.05}, None),
    "lookahead": ({"cache_policy": "lookahead", "cache_size": 0.05, "lookahead": 3}, None),
    "two-level": ({"cache_policy": "fifo", "cache_size": 0.02, "cpu_cache_size": 0.1}, None),
}


@pytest.mark.parametrize("name", sorted(STATEFUL))
def test_a_resumed_run_ends_as_the_uninterrupted_one(easy, tmp_path, name):
    kw, every = STATEFUL[name]
    kw = {"epochs": 3, **kw}
    full = train(easy, cfg(**kw, checkpoint_dir=str(tmp_path / "a")))
    cut = {**kw, "epochs": 2}
    train(easy, cfg(**cut, checkpoint_dir=str(tmp_path / "b"), checkpoint_every=every))
    files = checkpoint_files(tmp_path / "b")
    if every:  # killed after batch 8 of epoch 1 (10 batches an epoch), before its end
        assert [(e, b) for e, b, _ in files] == [(1, 8), (2, 0)]
        files[-1][2].unlink()
    resumed = train(easy, cfg(**kw, resume=str(tmp_path / "b")))
    assert resumed["resumed_from"].endswith(
        "ckpt-e000001-b000000008.pt" if every else "ckpt-e000002-b000000000.pt"
    )
    assert results(resumed) == results(full)
    assert same_params(final_params(tmp_path / "a"), final_params(tmp_path / "b"))
