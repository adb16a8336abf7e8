"""One cache gathered by two threads: the calls take turns (a second call waits for the first to
end), so rows, stats and the policy's state (FIFO's ring head, LRU's ticks) stay right. Without
the cache's lock the second call ran inside the first's miss fetch: a hammer of two threads then
got 12-38 wrong batches in 200 (FIFO, LRU). A lookahead cache serves one stream of announced
batches: two threads' announcements interleaved are refused, never served as wrong rows."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from gnnio.features import InMemoryFeatureStore
from gnnio.features.caches.cache import FeatureCache
from gnnio.features.caches.reuse import CrossBatchReuse
from tests.test_counts_concurrent import FEATS, _SecondCallInside


def _make(kind: str, back):
    if kind == "reuse":
        return CrossBatchReuse(back, timing=False)
    hot = np.arange(4) if kind in ("static", "lookahead") else None
    return FeatureCache(back, 6, kind, hot_ids=hot, timing=False)


@pytest.mark.parametrize("kind", ["fifo", "lru", "lfu", "static", "lookahead", "reuse"])
def test_a_second_gather_on_another_thread_waits_for_the_first(kind):
    a = np.array([0, 10, 11, 10, 12], dtype=np.int64)  # misses in every kind
    b = np.array([11, 13, 0, 13], dtype=np.int64)
    warm = _make(kind, InMemoryFeatureStore(FEATS))  # (compiled kernels: b's call is quick)
    warm.gather(a), warm.gather(b)
    back = _SecondCallInside(FEATS)
    c = _make(kind, back)
    got = {}
    back.second = lambda: got.setdefault("b", c.gather(b))  # started inside a's miss fetch
    assert torch.equal(c.gather(a), torch.from_numpy(FEATS[a]))
    back.thread.join(5)
    assert back.ended_inside is False  # b's gather waited for a's to end
    assert torch.equal(got["b"], torch.from_numpy(FEATS[b]))
    assert sum(c.counters.rows.values()) == a.size + b.size
    if kind != "reuse":
        s = c.stats
        assert s.batches == 2 and s.hits + s.misses == s.unique_queries


def test_lookahead_batches_of_two_threads_interleaved_are_refused():
    c = FeatureCache(InMemoryFeatureStore(FEATS), 6, "lookahead", lookahead=2, timing=False)
    a, b = torch.tensor([1, 2, 3]), torch.tensor([4, 5])
    c.announce(a)  # thread 1's next batch
    c.announce(b)  # thread 2's next batch, announced second
    with pytest.raises(ValueError, match="not the batch announced next"):
        c.gather(b)  # served first: refused, not served with a's window
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("a", c.gather(a)))
    t.start()
    t.join(5)
    assert torch.equal(out["a"], torch.from_numpy(FEATS[[1, 2, 3]]))
