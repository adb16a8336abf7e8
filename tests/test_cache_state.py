"""A cache restored from its state_dict continues exactly as the cache it was saved from: same
hits, same evictions, same contents (the policy's maps, cursors and the clock that orders recency
ticks all come back)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gnnio.features import InMemoryFeatureStore
from gnnio.features.caches.cache import FeatureCache

from .test_cache import _feats


def _run(c, batches):
    for b in batches:
        c.gather(np.asarray(b, dtype=np.int64))


@pytest.mark.parametrize("policy", ["fifo", "lru", "lfu", "sieve", "s3fifo"])
def test_a_restored_cache_continues_as_the_original(policy):
    n, cap = 60, 12
    feats = _feats(n)
    rng = np.random.default_rng(7)
    before = [rng.integers(0, n, 15) for _ in range(8)]
    after = [rng.integers(0, n, 15) for _ in range(12)]
    a = FeatureCache(InMemoryFeatureStore(feats), cap, policy)
    _run(a, before)
    b = FeatureCache(InMemoryFeatureStore(feats), cap, policy)
    b.load_state_dict(a.state_dict())
    for x in after:
        ids = np.asarray(x, dtype=np.int64)
        h0a, h0b = a.stats.hits, b.stats.hits
        assert torch.equal(b.gather(ids), a.gather(ids))
        assert b.stats.hits - h0b == a.stats.hits - h0a
        assert sorted(b.cached_ids().tolist()) == sorted(a.cached_ids().tolist())


def test_lru_recency_survives_a_restore_hand_example():
    """LRU, 4 rows: 0 is used again after the save, 1 after the restore; 2 is then the least
    recently used and goes first (a clock restarted at 0 would give 1 the oldest tick)."""
    feats = _feats(10)
    a = FeatureCache(InMemoryFeatureStore(feats), 4, "lru")
    _run(a, [[0, 1, 2, 3], [0]])
    b = FeatureCache(InMemoryFeatureStore(feats), 4, "lru")
    b.load_state_dict(a.state_dict())
    _run(b, [[1], [9]])
    assert sorted(b.cached_ids().tolist()) == [0, 1, 3, 9]
