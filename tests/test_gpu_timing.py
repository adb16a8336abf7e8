"""Timing on a GPU without device-wide synchronisation, and what a run says it simulated
(issue 15, faults 5 and 7), checked on the CPU with fake CUDA events.

``fake_events`` replaces ``torch.cuda.Event`` with a logging double and makes
``torch.cuda.synchronize()`` fail the test: a timer that synchronizes the device waits for every
stream (the loader's copies too) and so cancels the overlap it measures.
"""

from __future__ import annotations

import json
import types

import numpy as np
import pytest
import torch

from gnnio.features import accounting
from gnnio.features.stores.memory import InMemoryFeatureStore
from tests.fake_cuda import fake_cuda, fake_events

CUDA0 = torch.device("cuda", 0)


def _cuda_timer(device, enabled, laps=None):
    return accounting._Timer(CUDA0, enabled, laps)  # the CUDA branch, on CPU tensors


def test_timer_laps_are_events_resolved_later(monkeypatch):
    log = fake_events(monkeypatch)
    laps = accounting.EventLaps()
    t = accounting._Timer(CUDA0, True, laps)
    assert t.lap("manage") == 0.0 and t.lap("copy") == 0.0 and t.lap("copy") == 0.0
    assert len(laps) == 3 and not any(op == "synchronize" for op, *_ in log)
    assert laps.resolve(wait=False) == {}  # nothing completed yet: nothing read, nothing lost
    got = laps.resolve(wait=True)
    assert got == {"manage": pytest.approx(1e-3), "copy": pytest.approx(2e-3)}
    assert len(laps) == 0
    assert accounting._Timer(CUDA0, False, laps).lap("manage") == 0.0 and len(laps) == 0


@pytest.mark.parametrize("policy", ["static", "fifo"])
def test_cache_timing_on_cuda_uses_events(monkeypatch, policy):
    from gnnio.features.caches import cache as cache_mod

    fake_events(monkeypatch)
    monkeypatch.setattr(cache_mod, "_Timer", _cuda_timer)
    feats = np.arange(200, dtype=np.float32).reshape(50, 4)
    c = cache_mod.FeatureCache(
        InMemoryFeatureStore(feats),
        10,
        policy,
        hot_ids=np.arange(10) if policy == "static" else None,
    )
    for b in ([1, 2, 30], [2, 3, 40], [30, 41, 1]):
        assert np.array_equal(c.gather(torch.tensor(b)).numpy(), feats[b])
    d = c.stats.as_dict()  # resolves the pending laps, waiting on their events only
    assert d["manage_s"] > 0 and d["copy_s"] > 0 and len(c.stats.laps) == 0
    assert "laps" not in d and json.dumps(d)


def test_reuse_timing_on_cuda_uses_events(monkeypatch):
    from gnnio.features.caches import reuse as reuse_mod

    fake_events(monkeypatch)
    monkeypatch.setattr(reuse_mod, "_Timer", _cuda_timer)
    feats = np.arange(200, dtype=np.float32).reshape(50, 4)
    r = reuse_mod.CrossBatchReuse(InMemoryFeatureStore(feats))
    for b in ([1, 2, 30], [2, 3, 40]):
        assert np.array_equal(r.gather(torch.tensor(b)).numpy(), feats[b])
    r.flush()
    assert r.stats["manage_s"] > 0 and r.stats["copy_s"] > 0


def test_training_step_timing_needs_no_device_sync(monkeypatch, tmp_path):
    """The loop's compute timer on a CUDA device records events around each step and waits for
    the last one only (before issue 15 it called ``torch.cuda.synchronize`` after every step)."""
    from gnnio.graph import load
    from gnnio.sampling import UniformSampler
    from gnnio.train import loop
    from gnnio.train.config import TrainConfig
    from gnnio.train.evaluate import make_node_loader
    from gnnio.train.models import build_model
    from tests.helpers import write_tiny_dataset

    ds = load(write_tiny_dataset(tmp_path / "d", num_nodes=80, num_edges=400, feat_dim=6))
    labels = torch.from_numpy(np.asarray(ds.labels, dtype=np.int64))
    store = InMemoryFeatureStore(np.asarray(ds.features))
    sampler = UniformSampler(ds.graph, [3, 2], seed=0)
    ld = make_node_loader(sampler, store, ds.train_idx, labels, 5, 0, "cpu")
    model = build_model("sage", ds.feat_dim, 8, ds.num_classes, 2)
    opt = torch.optim.Adam(model.parameters())
    log = fake_events(monkeypatch)
    rec = loop._train_epoch(model, opt, ld, store, 0, TrainConfig(progress=False), CUDA0)
    syncs = [e for e in log if e[0] == "synchronize"]
    assert rec["batches"] == ld.order.num_batches and len(syncs) == 1  # the last step's event
    assert rec["breakdown_s"]["compute"] > 0 and 0.0 <= rec["hidden_fraction"] <= 1.0


def test_cache_lives_on_the_training_gpu(monkeypatch, tmp_path):
    """``--cache-policy`` with ``--device cuda`` puts the cache on that GPU (it stayed in host
    memory before, so its "cache" rows still crossed PCIe)."""
    from gnnio.features.caches import cache as cache_mod
    from gnnio.graph import load
    from gnnio.train.config import TrainConfig
    from gnnio.train.setup import build_store
    from tests.helpers import write_tiny_dataset

    fake_cuda(monkeypatch)
    made = []
    real = cache_mod.FeatureCache

    def spy(*a, device=None, **k):
        made.append(device)
        return real(*a, **k)  # built on the CPU: only the device asked for is checked

    monkeypatch.setattr(cache_mod, "FeatureCache", spy)
    # ... over the host rows read zero-copy (a tiered store with no hot rows): the GPU cache's
    # batch then needs no host sync (gnnio.features.caches.nosync)
    from gnnio.features.tiers import tiered as tiered_mod

    tiers = []
    real_t = tiered_mod.TieredFeatureStore

    def tspy(base, hot=None, device=None, **k):
        tiers.append((hot, device))
        return real_t(base, hot, device="cpu", **k)  # simulated: only the request is checked

    monkeypatch.setattr(tiered_mod, "TieredFeatureStore", tspy)
    ds = load(write_tiny_dataset(tmp_path / "d", num_nodes=40, num_edges=100))
    cfg = TrainConfig(cache_policy="fifo", cache_size=0.2, progress=False)
    setup = build_store(ds, cfg, CUDA0)
    assert made == [CUDA0] and setup.info["cache"]["capacity"] == 8
    assert tiers == [(0, CUDA0)] and isinstance(setup.store.backing, real_t)
    assert "misses" in setup.info["cache"]
    build_store(ds, cfg, torch.device("cpu"))
    assert made[-1] is None and len(tiers) == 1


def test_cpu_run_summary_says_simulated_and_hidden_fraction(tmp_path):
    from gnnio.cli.main import main
    from tests.helpers import write_tiny_dataset

    path = write_tiny_dataset(tmp_path / "d", num_nodes=120, num_edges=600, feat_dim=8)
    out = tmp_path / "s.json"
    args = ["train", str(path), "--device", "cpu", "--epochs", "1", "--fanouts", "3,2"]
    args += ["--batch-size", "16", "--hidden", "8", "--quiet", "--summary", str(out)]
    args += ["--gpu-cache-fraction", "0.2", "--cache-policy", "fifo", "--cache-size", "0.1"]
    assert main(args) == 0
    s = json.loads(out.read_text())
    assert s["simulated"] is True
    assert any(p.startswith("tiering") for p in s["simulated_parts"])
    assert any(p.startswith("device") for p in s["simulated_parts"])
    assert s["data_setup"]["tiering"]["cold_mode"].endswith("(simulated)")
    assert 0.0 <= s["hidden_fraction"] <= 1.0
    assert 0.0 <= s["history"][0]["hidden_fraction"] <= 1.0
    assert isinstance(types.SimpleNamespace(**s).simulated, bool)


def test_compute_timer_sums_event_pairs_in_seconds_waiting_for_the_last_end_only(monkeypatch):
    """``ComputeTimer`` on CUDA: one (start, end) event pair per step on the current stream,
    read at ``total_s``, which waits for the last end event alone and gives seconds (the
    events' milliseconds / 1000); pairs read once are not counted again."""
    from gnnio.train.timing import ComputeTimer

    log = fake_events(monkeypatch)
    timer = ComputeTimer(CUDA0)
    for _ in range(3):
        timer.start()
        timer.stop()  # the fake events: 1 ms between a step's two
    assert [op for op, *_ in log] == ["record"] * 6
    assert timer.total_s() == pytest.approx(3e-3)
    assert [(op, i) for op, i, _ in log if op == "synchronize"] == [("synchronize", log[-2][1])]
    assert timer.total_s() == pytest.approx(3e-3)
    timer.start()
    timer.stop()
    assert timer.total_s() == pytest.approx(4e-3)
