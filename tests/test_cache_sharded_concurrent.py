"""The sharded multi-GPU cache with its readers on concurrent threads (data-parallel training runs
one per GPU, BGL §3.2.3): each reader books only its own rows. Before the fix a reader's count of
the shared backing's tiers (``since(mark)`` around its miss fetch) took in the rows another reader
fetched meanwhile, so ``local + peer + host`` exceeded the rows it asked for."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from gnnio.features import InMemoryFeatureStore
from gnnio.features.caches.multi import ShardedFeatureCache


class _Interleaving(InMemoryFeatureStore):
    """A backing whose first gather lets another reader's whole gather run before it reads."""

    def __init__(self, feats):
        super().__init__(feats)
        self.other = None  # (reader, ids), set by the test

    def gather(self, ids, out=None):
        if self.other is not None:
            reader, other_ids = self.other
            self.other = None
            done = threading.Event()
            t = threading.Thread(target=lambda: (reader.gather(other_ids), done.set()))
            t.start()
            done.wait(0.5)  # with the fix the other reader waits for this fetch to end
            self._thread = t
        return super().gather(ids, out)


def test_concurrent_readers_book_only_their_own_rows():
    n, s = 40, 2
    feats = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
    back = _Interleaving(feats)
    c0 = ShardedFeatureCache(back, s, 4, "fifo", timing=False)
    c1 = c0.for_reader(1)
    a = np.array([0, 1, 2, 3, 0], dtype=np.int64)  # 4 misses, one repeat
    b = np.arange(10, 30, dtype=np.int64)  # 20 misses
    back.other = (c1, b)
    assert torch.equal(c0.gather(a), torch.from_numpy(feats[a]))
    back._thread.join(5)
    for reader, ids in ((c0, a), (c1, b)):
        rows = reader.counters.snapshot()["rows"]
        assert sum(rows.values()) == ids.shape[0]
        assert rows.get("host", 0) == reader.stats.misses
    assert back.counters.snapshot()["rows"]["host"] == 4 + 20


def test_static_hot_ids_out_of_range_are_named_by_their_global_id():
    """A bad hot id is reported as the caller's id, not as the shard key ``id // S`` (which was
    "static cache key 6 out of [0, 5)" for id 12 of 10 rows on 2 shards)."""
    back = InMemoryFeatureStore(np.zeros((10, 2), dtype=np.float32))
    for bad in (12, -1):
        with pytest.raises(ValueError, match=rf"node id {bad} out of \[0, 10\)"):
            ShardedFeatureCache(back, 2, 3, "static", hot_ids=np.array([0, bad]))
