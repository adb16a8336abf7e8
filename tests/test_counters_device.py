"""Counts a gather knows only on the device (issue 24: no host sync per batch): queued by
``TierCounters.add_device``, measured per batch by ``mark``/``since`` without a wait, booked when
read. The loader takes a batch's share per batch; it must not read (flush) the counters then."""

from __future__ import annotations

import numpy as np
import torch

from gnnio.features import InMemoryFeatureStore
from gnnio.features.base import BatchCount, TierCounters
from gnnio.utils.syncs import OpCounter
from tests.test_loader import data, make_loader  # noqa: F401 - the fixture

__all__ = ["data"]


def test_device_counts_are_booked_when_read_and_measured_per_batch_without_a_sync():
    c = TierCounters()
    c.add("host", 3, 8)
    m0 = c.mark()
    with OpCounter() as oc:
        c.add_device("gpu", torch.tensor(5), 8)
        c.add_device("host", torch.tensor(2), 8)
        c.add("disk", 1, 8)
        b1 = c.since(m0)
        m1 = c.mark()
        c.add_device("gpu", torch.tensor(4), 8)
        b2 = c.since(m1)
        total = BatchCount()
        total.add(b1)
        total.add(b2)
        total.add({"rows": {"disk": 2}, "bytes": {"disk": 16}})  # a plain dict, as resumed
    assert oc.syncs == 0, dict(oc.sync_ops)
    assert b1.resolve() == {"rows": {"host": 2, "gpu": 5, "disk": 1},
                            "bytes": {"host": 16, "gpu": 40, "disk": 8}}  # fmt: skip
    assert b2.resolve()["rows"] == {"host": 0, "disk": 0, "gpu": 4}
    assert total.resolve()["rows"] == {"host": 2, "gpu": 9, "disk": 3}
    # resolving twice does not add twice; the batch's own tensors were not summed into
    assert total.resolve()["rows"] == {"host": 2, "gpu": 9, "disk": 3}
    assert b1.resolve()["rows"]["gpu"] == 5
    # reading the counters books the queued device counts, once
    assert c.rows == {"host": 5, "gpu": 9, "disk": 1}
    assert c.bytes["gpu"] == 72 and c.snapshot()["rows"]["gpu"] == 9
    c.reset()
    c.add_device("gpu", torch.tensor(1), 8)
    assert c.snapshot() == {"rows": {"gpu": 1}, "bytes": {"gpu": 8}}


class _Spy(InMemoryFeatureStore):
    """A store whose rows are counted partly on the device, and whose counters count flushes."""

    def __init__(self, feats):
        super().__init__(feats)
        self.flushes = 0
        flush = self.counters.flush

        def spy():
            self.flushes += 1
            flush()

        self.counters.flush = spy

    def gather(self, ids, out=None):
        rows = super().gather(ids, out=out)
        ids_t = torch.as_tensor(ids)
        self.counters.add_device("dev_even", (ids_t % 2 == 0).sum(), self.row_bytes)
        return rows


def test_the_loader_counts_each_batch_without_reading_the_counters(data):  # noqa: F811
    graph, feats, labels, train = data
    store = _Spy(feats)
    loader = make_loader(data, store=store, num_workers=2, prefetch=3)
    want_even = want_host = 0
    got = BatchCount()
    for mb in loader:
        ids = mb.input_nodes.numpy()
        want_even += int((ids % 2 == 0).sum())
        want_host += len(ids)
        got.add(mb.meta["counted"])
    assert store.flushes == 0, "the loader read (flushed) the counters per batch"
    r = got.resolve()
    assert r["rows"] == {"host": want_host, "dev_even": want_even}
    assert r["bytes"]["dev_even"] == want_even * feats.shape[1] * 4
    assert np.isfinite(want_even)


def test_the_loader_vouches_for_its_sampler_ids_and_only_in_its_own_thread(data):  # noqa: F811
    import threading

    from gnnio.features.base import ids_in_range, ids_vouched

    seen = []

    class Vouched(InMemoryFeatureStore):
        def gather(self, ids, out=None):
            seen.append(ids_vouched())  # a GPU store would skip its range check read-back
            return super().gather(ids, out=out)

    graph, feats, labels, train = data
    for _ in make_loader(data, store=Vouched(feats), num_workers=1):
        pass
    assert seen and all(seen)
    assert not ids_vouched()
    other = []
    with ids_in_range():
        with ids_in_range():
            assert ids_vouched()
        assert ids_vouched()  # the inner block restores, not clears
        t = threading.Thread(target=lambda: other.append(ids_vouched()))
        t.start()
        t.join()
    assert other == [False] and not ids_vouched()


def test_the_loaders_gather_stage_makes_no_sync_over_a_sync_free_cache(data, monkeypatch):  # noqa: F811
    """The whole gather stage (counters' marks, the cache's batch, labels) run under the sync
    counter in the loader's own thread, the cache's sync-free path forced on the CPU."""
    from gnnio.features.caches.cache import FeatureCache
    from gnnio.pipeline import stages

    graph, feats, labels, train = data
    real = stages.EpochRun._gather_one
    syncs = []

    def counted(self, *a, **kw):
        with OpCounter() as c:
            out = real(self, *a, **kw)
        syncs.append(dict(c.sync_ops))
        return out

    monkeypatch.setattr(stages.EpochRun, "_gather_one", counted)
    for policy in ("fifo", "static"):
        syncs.clear()
        store = FeatureCache(InMemoryFeatureStore(feats), 100, policy,
                             hot_ids=np.arange(len(feats)), sync_free=True)  # fmt: skip
        got = BatchCount()
        for mb in make_loader(data, store=store, num_workers=1):
            assert torch.equal(mb.x, torch.from_numpy(feats[mb.input_nodes.numpy()]))
            got.add(mb.meta["counted"])
        assert syncs and all(s == {} for s in syncs), syncs
        assert sum(got.resolve()["rows"].values()) == store.stats.as_dict()["queries"]
