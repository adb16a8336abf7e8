"""Cross-batch reuse (HyDRA ValPt / LocPt) and the redundancy rate eta1."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gnnio.features import FeatureStore, InMemoryFeatureStore
from gnnio.features.caches.cache import FeatureCache
from gnnio.features.caches.reuse import CrossBatchReuse, ReuseTracker, redundancy_rates

HYP = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _feats(n, dim=3, seed=0):
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


def test_tracker_hand_example():
    tr = ReuseTracker(10)
    reuse, src, fetch = tr.step(torch.tensor([1, 2, 3]))
    assert reuse.tolist() == [] and fetch.tolist() == [0, 1, 2]
    assert tr.valpt.tolist() == [0, 1, 1, 1, 0, 0, 0, 0, 0, 0]  # first batch marked 1
    reuse, src, fetch = tr.step(torch.tensor([3, 4, 2]))
    assert reuse.tolist() == [0, 2] and src.tolist() == [2, 1] and fetch.tolist() == [1]
    assert tr.valpt.tolist() == [0, 0, 2, 2, 2, 0, 0, 0, 0, 0]  # marks alternate: now 2
    reuse, src, fetch = tr.step(torch.tensor([1, 9]))  # 1 was in the batch before last only
    assert reuse.tolist() == [] and fetch.tolist() == [0, 1]
    reuse, src, fetch = tr.step(torch.tensor([9, 1, 5]))
    assert reuse.tolist() == [0, 1] and src.tolist() == [1, 0]


def test_redundancy_rates_hand_example():
    rates = redundancy_rates(
        [np.arange(10), np.arange(5, 15), np.arange(100, 110), [100, 100, 7]], 200
    )
    assert rates.tolist() == [0.5, 0.0, 0.5]  # last batch: distinct {100, 7}, 100 was there


@st.composite
def batch_lists(draw, max_rows=30):
    n = draw(st.integers(1, max_rows))
    batches = draw(st.lists(st.lists(st.integers(0, n - 1), max_size=30), min_size=1, max_size=10))
    return n, batches


@HYP
@given(
    w=batch_lists(),
    mode=st.sampled_from(["fresh", "one-buffer", "two-buffers"]),
    keep=st.sampled_from(["reference", "copy"]),
)
def test_reuse_returns_the_backing_rows(w, mode, keep):
    n, batches = w
    feats = _feats(n)
    store = InMemoryFeatureStore(feats)
    r = CrossBatchReuse(store, keep=keep)
    bufs = [torch.empty(40, 3), torch.empty(40, 3)]
    for i, b in enumerate(batches):
        ids = np.array(b, dtype=np.int64)
        out = None if mode == "fresh" else bufs[0 if mode == "one-buffer" else i % 2]
        got = r.gather(ids, out=out)
        assert torch.equal(got, torch.from_numpy(feats[ids]))
    s = r.stats
    assert s["reused"] + s["fetched"] == s["unique"]
    assert store.counters.snapshot()["rows"].get("host", 0) == s["fetched"]
    assert sum(r.counters.snapshot()["rows"].values()) == sum(len(b) for b in batches)


def test_eta1_of_the_store_matches_redundancy_rates():
    rng = np.random.default_rng(3)
    batches = [rng.choice(500, 120, replace=False) for _ in range(12)]
    r = CrossBatchReuse(InMemoryFeatureStore(_feats(500)))
    for b in batches:
        r.gather(b)
    assert r.eta1 == pytest.approx(redundancy_rates(batches, 500).mean())
    assert r.stats["eta1_batches"] == 11


def test_reuse_over_a_cache_only_fetches_the_difference():
    feats = _feats(100)
    base = InMemoryFeatureStore(feats)
    cache = FeatureCache(base, 10, "fifo")
    r = CrossBatchReuse(cache)
    r.gather(np.arange(0, 50))
    r.gather(np.arange(25, 75))  # 25 reused, 25 new
    assert cache.stats.last["unique"] == 25
    assert r.counters.snapshot()["rows"]["reuse"] == 25


class _Flaky(FeatureStore):
    """Fails on its second gather."""

    def __init__(self, feats):
        super().__init__()
        self.inner = InMemoryFeatureStore(feats)
        self.num_rows, self.dim, self.dtype, self.device = 50, 3, torch.float32, torch.device("cpu")
        self.calls = 0

    def gather(self, ids, out=None):
        self.calls += 1
        if self.calls == 2:
            raise RuntimeError("disk hiccup")
        rows = self.inner.gather(ids, out=out)
        self.counters.add("host", rows.shape[0], self.row_bytes)
        return rows


def test_a_failed_gather_leaves_no_stale_state():
    feats = _feats(50)
    r = CrossBatchReuse(_Flaky(feats))
    r.gather(np.arange(10))
    with pytest.raises(RuntimeError):
        r.gather(np.arange(5, 20))
    got = r.gather(np.arange(5, 20))
    assert torch.equal(got, torch.from_numpy(feats[5:20]))
    # the batch after the failure has no predecessor: left out of eta1, nothing counted reused
    assert r.stats["eta1_batches"] == 0 and r.stats["reused"] == 0


def test_tracker_memory_is_flat():
    tr = ReuseTracker(1000)
    rng = np.random.default_rng(0)
    ptrs = (tr.valpt.data_ptr(), tr.locpt.data_ptr())
    for _ in range(200):
        tr.step(torch.from_numpy(rng.choice(1000, int(rng.integers(1, 300)), replace=False)))
        assert int((tr.valpt != 0).sum()) == tr.prev.numel()  # only the last batch is marked
    assert (tr.valpt.data_ptr(), tr.locpt.data_ptr()) == ptrs


def test_bad_keep_is_refused():
    with pytest.raises(ValueError, match="keep"):
        CrossBatchReuse(InMemoryFeatureStore(_feats(3)), keep="maybe")


def test_keep_copy_survives_a_caller_that_writes_into_the_rows():
    """keep="copy": the returned rows are the caller's (an in-place op on them, or a recycled
    out= buffer written by someone else, does not reach the next batch's reused rows)."""
    feats = _feats(30)
    r = CrossBatchReuse(InMemoryFeatureStore(feats), keep="copy")
    out = torch.empty((10, 3))
    first = r.gather(np.arange(10), out=out)
    first.mul_(0)  # e.g. an in-place dropout on the batch, or the buffer reused elsewhere
    got = r.gather(np.arange(5, 15))
    assert r.stats["reused"] == 5
    assert torch.equal(got, torch.from_numpy(feats[5:15]))
