"""The sharded multi-GPU cache against the per-id reference: shard ``k`` behaves exactly as one
cache fed only the ids it owns (``v % S == k``), so its contents, hits, insertions and evictions
are those of :func:`tests.test_cache.reference_simulation` over that sub-stream; the reader's
counters split the hits into its own shard ("local") and the others ("peer")."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gnnio.features import InMemoryFeatureStore
from gnnio.features.caches.cache import POLICIES
from gnnio.features.caches.multi import ShardedFeatureCache

from .test_cache import _feats, _hot, reference_simulation, workloads


def _per_shard_reference(policy, cap, batches, n, shards, hot):
    """Per shard: (per-batch stats aligned with ``batches``, final set of global ids)."""
    out = []
    for k in range(shards):
        nkeys = (n - k + shards - 1) // shards
        # (deduplicated: the sharded cache counts unique ids, a static one too)
        sub = [list(dict.fromkeys(v for v in b if v % shards == k)) for b in batches]
        hot_k = None if hot is None else [int(v) for v in hot if v % shards == k]
        per, final = reference_simulation(policy, cap, sub, nkeys, hot_ids=hot_k)
        it = iter(per)
        none = dict(hits=0, misses=0, insertions=0, evictions=0)
        out.append(([next(it) if len(b) else none for b in sub], final))
    return out


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads(max_rows=40, max_batches=10, max_len=30), shards=st.integers(1, 3))
# more misses than a shard holds: the last ones are admitted; hits on the other shards are peer reads
@example(w=(12, 2, [[0, 2, 4, 6, 8], [6, 8, 1, 3, 5, 7], [5, 7, 6, 8, 0]], 0), shards=2)
def test_each_shard_is_the_reference_cache_of_its_ids(policy, w, shards):
    n, cap, batches, seed = w
    hot = _hot(n, seed)
    feats = _feats(n)
    c = ShardedFeatureCache(InMemoryFeatureStore(feats), shards, cap, policy, hot_ids=hot)
    readers = [c] + [c.for_reader(r) for r in range(1, shards)]
    ref = _per_shard_reference(policy, cap, batches, n, shards, hot)
    for i, b in enumerate(batches):
        r = readers[i % shards]
        ids = np.array(b, dtype=np.int64)
        rows0 = r.counters.snapshot()["rows"]
        s0 = (r.stats.hits, r.stats.misses, r.stats.insertions, r.stats.evictions)
        assert torch.equal(r.gather(ids), torch.from_numpy(feats[ids]))
        per = [ref[k][0][i] for k in range(shards)]
        want = tuple(sum(p[f] for p in per) for f in ("hits", "misses", "insertions", "evictions"))
        got = (
            r.stats.hits - s0[0],
            r.stats.misses - s0[1],
            r.stats.insertions - s0[2],
            r.stats.evictions - s0[3],
        )
        assert got == want
        rows1 = r.counters.snapshot()["rows"]
        peer = rows1.get("peer", 0) - rows0.get("peer", 0)
        assert peer == sum(p["hits"] for k, p in enumerate(per) if k != i % shards)
    for k, held in enumerate(c.cached_ids()):
        assert set(held.tolist()) == ref[k][1]
