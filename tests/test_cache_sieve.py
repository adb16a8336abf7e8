"""SIEVE and S3-FIFO host-cache policies (issue 25) against per-id reference simulations of the
documented batch semantics (:mod:`gnnio.features.caches.sieve`)."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings

from gnnio.features import FeatureCache, InMemoryFeatureStore
from gnnio.features.caches.sieve import S3FIFOPolicy, SIEVEPolicy
from tests.test_cache import workloads  # (n, capacity, batches, seed)

HYP = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _uniq(batch) -> list[int]:
    seen: list[int] = []
    for x in batch:
        if int(x) not in seen:
            seen.append(int(x))
    return seen


def sieve_reference(cap, batches):
    """SIEVE one id at a time: a list oldest -> newest, a hand naming the next key to look at."""
    queue: list[int] = []
    visited: dict[int, bool] = {}
    hand = None
    states = []
    for b in batches:
        if len(b) == 0:
            continue
        u = _uniq(b)
        hits = [x for x in u if x in visited]
        misses = [x for x in u if x not in visited]
        for x in hits:
            visited[x] = True
        admitted = misses[-cap:] if cap else []
        for _ in range(max(0, len(queue) + len(admitted) - cap)):
            i = queue.index(hand) if hand is not None else 0
            while visited[queue[i]]:
                visited[queue[i]] = False
                i = (i + 1) % len(queue)
            hand = queue[i + 1] if i + 1 < len(queue) else None
            del visited[queue.pop(i)]
        for x in admitted:
            queue.append(x)
            visited[x] = False
        states.append((len(hits), set(queue)))
    return states


def s3fifo_reference(cap, batches):
    """S3-FIFO one id at a time with deques (tail = left)."""
    small = max(1, round(0.1 * cap)) if cap else 0
    s_q: deque[int] = deque()
    m_q: deque[int] = deque()
    ghost: deque[int] = deque(maxlen=max(1, cap - small))
    freq: dict[int, int] = {}
    states = []
    for b in batches:
        if len(b) == 0:
            continue
        u = _uniq(b)
        hits = [x for x in u if x in freq]
        misses = [x for x in u if x not in freq]
        for x in hits:
            freq[x] = min(freq[x] + 1, 3)
        admitted = misses[-cap:] if cap else []
        for _ in range(max(0, len(s_q) + len(m_q) + len(admitted) - cap)):
            victim = None
            while len(s_q) > small or (s_q and not m_q):
                t = s_q.popleft()
                if freq[t] >= 1:
                    freq[t] = 0
                    m_q.append(t)
                else:
                    ghost.append(t)
                    victim = t
                    break
            while victim is None:
                t = m_q.popleft()
                if freq[t] > 0:
                    freq[t] -= 1
                    m_q.append(t)
                else:
                    victim = t
            del freq[victim]
        for x in admitted:
            freq[x] = 0
            (m_q if x in ghost else s_q).append(x)
        states.append((len(hits), set(s_q) | set(m_q)))
    return states


REFERENCES = {"sieve": sieve_reference, "s3fifo": s3fifo_reference}


@pytest.mark.parametrize("policy", ["sieve", "s3fifo"])
@HYP
@given(w=workloads())
def test_hits_and_contents_match_the_per_id_reference(policy, w):
    n, cap, batches, _ = w
    feats = np.random.default_rng(n).standard_normal((n, 3)).astype(np.float32)
    cache = FeatureCache(InMemoryFeatureStore(feats), cap, policy)
    want = REFERENCES[policy](min(cap, n), batches)
    got = []
    for b in batches:
        ids = np.array(b, dtype=np.int64)
        before = cache.stats.hits
        rows = cache.gather(ids)
        assert torch.equal(rows, torch.from_numpy(feats[ids]))  # rows always right
        if len(b):
            got.append((cache.stats.hits - before, set(cache.cached_ids().tolist())))
    assert got == want


@pytest.mark.parametrize("policy", ["sieve", "s3fifo"])
def test_a_scan_does_not_flush_the_hot_set(policy):
    """The point of both over FIFO: a hot set hit every batch survives a stream of one-time ids."""
    n, hot = 10_000, np.arange(50)
    feats = np.zeros((n, 1), dtype=np.float32)
    caches = {p: FeatureCache(InMemoryFeatureStore(feats), 100, p) for p in (policy, "fifo")}
    for c in caches.values():
        c.gather(hot)
        c.gather(hot)  # hit once: visited / frequency set
    for step in range(40):  # every batch: the hot set, then 30 ids never seen again
        batch = np.concatenate([hot, 1000 + 30 * step + np.arange(30)])
        for c in caches.values():
            c.gather(batch)
    kept = {p: np.isin(hot, c.cached_ids().numpy()).mean() for p, c in caches.items()}
    assert kept[policy] == 1.0
    assert kept["fifo"] < kept[policy]


def test_state_round_trips_and_gpu_is_refused():
    feats = np.arange(40, dtype=np.float32).reshape(20, 2)
    for policy in ("sieve", "s3fifo"):
        a = FeatureCache(InMemoryFeatureStore(feats), 6, policy)
        b = FeatureCache(InMemoryFeatureStore(feats), 6, policy)
        rng = np.random.default_rng(0)
        for _ in range(5):
            a.gather(rng.integers(0, 20, 8))
        b.load_state_dict(a.state_dict())
        for _ in range(5):
            ids = rng.integers(0, 20, 8)
            assert torch.equal(a.gather(ids), b.gather(ids))
            assert a.cached_ids().tolist() == b.cached_ids().tolist()
    for cls in (SIEVEPolicy, S3FIFOPolicy):
        with pytest.raises(ValueError, match="on the CPU"):
            cls(4, 10, device="meta")


@pytest.mark.parametrize("policy", ["sieve", "s3fifo"])
@pytest.mark.parametrize("seed", range(4))
def test_long_skewed_workloads_match_the_reference(policy, seed):
    """Many batches of skewed ids over a cache of a fifth of the rows: entries get hit several
    times, promoted from S to M, reinserted in M more than three times, and ghosts come back
    (what short random workloads rarely reach: S3-FIFO's frequency cap and its promotion rule)."""
    rng = np.random.default_rng(seed)
    n, cap = 60, 12
    weights = 1.0 / np.arange(1, n + 1) ** 1.1
    batches = [rng.choice(n, size=8, p=weights / weights.sum()) for _ in range(150)]
    feats = np.random.default_rng(n).standard_normal((n, 3)).astype(np.float32)
    cache = FeatureCache(InMemoryFeatureStore(feats), cap, policy)
    want = REFERENCES[policy](cap, batches)
    got = []
    for b in batches:
        before = cache.stats.hits
        assert torch.equal(cache.gather(b), torch.from_numpy(feats[b]))
        got.append((cache.stats.hits - before, set(cache.cached_ids().tolist())))
    assert got == want
