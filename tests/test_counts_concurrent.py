"""Stores shared by readers on concurrent threads book each reader's own rows.

A wrapper (a cache, cross-batch reuse, the loader's per-batch count) counted the rows its backing
served by the backing's counter difference across its gather (``mark()`` / ``since()``), which
took in the rows another thread read from the same backing meanwhile: two caches over one store,
a cache whose store is also read directly, two loaders over one store. The backing here makes
the windows overlap for sure: every gather waits for the other thread's before it counts, and
again after it counted."""

from __future__ import annotations

import threading

import numpy as np
import torch

from gnnio.features import InMemoryFeatureStore
from gnnio.features.caches.cache import FeatureCache
from gnnio.features.caches.multi import ShardedFeatureCache
from gnnio.features.caches.reuse import CrossBatchReuse
from gnnio.graph import CSRGraph
from gnnio.ordering import RandomOrder
from gnnio.pipeline.loader import NodeLoader
from gnnio.sampling import UniformSampler

N, F = 60, 3
FEATS = np.arange(N * F, dtype=np.float32).reshape(N, F)


class _Overlapping(InMemoryFeatureStore):
    """Two gathers at once: both enter before either counts, both count before either returns."""

    def __init__(self, feats, armed: bool = True):
        super().__init__(feats)
        self.enter = self.leave = None
        if armed:
            self.arm()

    def arm(self) -> None:
        self.enter, self.leave = (threading.Barrier(2, timeout=5) for _ in range(2))

    def gather(self, ids, out=None):
        if self.enter is None:  # (not armed: a static cache loading its rows)
            return super().gather(ids, out)
        self.enter.wait()
        rows = super().gather(ids, out)  # (counts its rows under "host")
        self.leave.wait()
        return rows


def _both(*calls):
    """Run the calls on threads at once; their results, re-raising a failure."""
    res: list = [None] * len(calls)
    errs: list = []

    def run(i, fn):
        try:
            res[i] = fn()
        except BaseException as e:  # noqa: BLE001 (re-raised below)
            errs.append(e)

    ts = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate(calls)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(10)
    if errs:
        raise errs[0]
    return res


def _rows(store) -> dict[str, int]:
    return {t: r for t, r in store.counters.snapshot()["rows"].items() if r}


def test_two_caches_over_one_store_book_their_own_rows():
    back = _Overlapping(FEATS)
    c1, c2 = (FeatureCache(back, 8, "fifo", timing=False) for _ in range(2))
    a = np.array([0, 1, 2, 0], dtype=np.int64)  # 3 misses, a repeat
    b = np.arange(20, 40, dtype=np.int64)  # 20 misses
    ra, rb = _both(lambda: c1.gather(a), lambda: c2.gather(b))
    assert torch.equal(ra, torch.from_numpy(FEATS[a]))
    assert torch.equal(rb, torch.from_numpy(FEATS[b]))
    assert _rows(c1) == {"host": 3, "cache": 1}  # (was host 23: the other cache's 20 too)
    assert _rows(c2) == {"host": 20}
    assert _rows(back) == {"host": 23}


def test_cache_whose_store_is_read_directly_books_only_its_misses():
    back = _Overlapping(FEATS)
    c = FeatureCache(back, 8, "lru", timing=False)
    a = np.array([5, 6], dtype=np.int64)
    _both(lambda: c.gather(a), lambda: back.gather(np.arange(30, dtype=np.int64)))
    assert _rows(c) == {"host": 2} and c.stats.misses == 2


def test_static_cache_and_reuse_over_one_store_book_their_own_rows():
    back = _Overlapping(FEATS, armed=False)
    st = FeatureCache(back, 4, "static", hot_ids=np.arange(4), timing=False)
    back.arm()
    ru = CrossBatchReuse(back, timing=False)
    a = np.array([0, 1, 10, 11], dtype=np.int64)  # 2 hits, 2 misses
    b = np.arange(40, 50, dtype=np.int64)
    _both(lambda: st.gather(a), lambda: ru.gather(b))
    assert _rows(st) == {"cache": 2, "host": 2}
    assert _rows(ru) == {"host": 10}


def test_sharded_readers_fetch_at_once_and_book_their_own_rows():
    """The readers' miss fetches overlap (no lock around them any more), each booked right."""
    back = _Overlapping(FEATS)
    r0 = ShardedFeatureCache(back, 2, 4, "fifo", timing=False)
    r1 = r0.for_reader(1)
    a, b = np.arange(0, 4, dtype=np.int64), np.arange(30, 45, dtype=np.int64)
    _both(lambda: r0.gather(a), lambda: r1.gather(b))
    assert sum(_rows(r0).values()) == 4 and _rows(r0).get("host") == r0.stats.misses
    assert sum(_rows(r1).values()) == 15 and _rows(r1).get("host") == r1.stats.misses


def test_two_loaders_over_one_store_count_their_own_batches():
    rng = np.random.default_rng(0)
    graph = CSRGraph.from_edges(rng.integers(0, N, 200), rng.integers(0, N, 200), N)
    back = _Overlapping(FEATS)
    seeds = [np.arange(0, 4, dtype=np.int64), np.arange(30, 50, dtype=np.int64)]
    loaders = [
        NodeLoader(UniformSampler(graph, [2], seed=1), back, RandomOrder(s, len(s), seed=0))
        for s in seeds
    ]
    got = _both(*(lambda ld=ld: list(ld.epoch(0)) for ld in loaders))
    for batches in got:
        (mb,) = batches
        rows = mb.meta["counted"].resolve()["rows"]
        assert rows == {"host": int(mb.input_nodes.shape[0])}


class _SecondCallInside(InMemoryFeatureStore):
    """A backing whose first gather starts ``second`` on another thread and waits (a while) for
    it to end before reading."""

    def __init__(self, feats):
        super().__init__(feats)
        self.second = None
        self.ended_inside: bool | None = None

    def gather(self, ids, out=None):
        if self.second is not None:
            fn, self.second = self.second, None
            done = threading.Event()
            self.thread = threading.Thread(target=lambda: (fn(), done.set()))
            self.thread.start()
            self.ended_inside = done.wait(0.3)
        return super().gather(ids, out)


def test_one_sharded_reader_on_two_threads_gathers_one_batch_at_a_time():
    """One reader's dedup scratch, stats and counters are its own: two threads in its gather at
    once got wrong rows or an IndexError (a stress run: 1 bad batch in 600, then a crash)."""
    back = _SecondCallInside(FEATS)
    r0 = ShardedFeatureCache(back, 2, 4, "fifo", timing=False)
    a, b = np.array([0, 1, 2, 0], dtype=np.int64), np.array([9, 9, 8], dtype=np.int64)
    r0.gather(b)  # cached: the second call needs no backing fetch (no lock of the backing's)
    got = {}
    back.second = lambda: got.setdefault("b", r0.gather(b))
    assert torch.equal(r0.gather(a), torch.from_numpy(FEATS[a]))
    back.thread.join(5)
    assert back.ended_inside is False  # the second call waited for the first to end
    assert torch.equal(got["b"], torch.from_numpy(FEATS[b]))
    assert sum(_rows(r0).values()) == 3 + 4 + 3 and r0.stats.batches == 3


def test_counting_collects_this_threads_device_adds_only():
    from gnnio.features.base import TierCounters

    c = TierCounters()
    c.add("disk", 1, 4)  # before: listed with 0, like since()
    start, mid = threading.Barrier(2, timeout=5), threading.Barrier(2, timeout=5)
    out: list = [None, None]

    def reader(k, n):
        with c.counting() as got:
            start.wait()
            c.add_device("gpu", torch.tensor(n), 4)
            acc = c.device_total("host", 4, torch.device("cpu"))
            acc.add_(10 * n)  # (what a kernel adds)
            mid.wait()
        out[k] = got.resolve()

    _both(lambda: reader(0, 2), lambda: reader(1, 3))
    for k, n in ((0, 2), (1, 3)):
        assert out[k]["rows"] == {"disk": 0, "gpu": n, "host": 10 * n}, out[k]
    assert c.snapshot()["rows"] == {"disk": 1, "gpu": 5, "host": 50}
