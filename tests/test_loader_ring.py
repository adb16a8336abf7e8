"""NodeLoader's buffer ring and its liveness: prefetch + 2 slots let the gather run one batch
past a full queue; every slot comes back, so an epoch longer than the ring ends; a gather thread
that ends without a result is reported, not waited for."""

from __future__ import annotations

import time

import pytest

from gnnio.features import InMemoryFeatureStore
from gnnio.pipeline import stages

from .test_loader import check_batch, data, make_loader  # noqa: F401 - data is a fixture


class CountingStore(InMemoryFeatureStore):
    def __init__(self, feats):
        super().__init__(feats)
        self.gathers = 0

    def gather(self, ids, out=None):
        self.gathers += 1
        return super().gather(ids, out=out)


@pytest.mark.parametrize("prefetch", [1, 2])
def test_the_gather_fills_one_slot_past_a_full_queue(data, prefetch):  # noqa: F811
    """Consumer holds batch 0, ``prefetch`` batches wait in the queue, and one more is gathered
    into the last free slot (then the gather waits on the queue, not on a slot)."""
    store = CountingStore(data[1])
    loader = make_loader(data, batch_size=8, store=store, prefetch=prefetch)
    it = loader.epoch(0)
    next(it)
    end = time.monotonic() + 5.0
    while store.gathers < prefetch + 2 and time.monotonic() < end:
        time.sleep(0.01)
    time.sleep(0.1)
    assert store.gathers == prefetch + 2
    it.close()


def test_an_epoch_longer_than_the_ring_ends(data):  # noqa: F811
    """Every slot the consumer held comes back to the ring (else the gather would wait for one
    forever: a stall, reported here after a few seconds instead of a hang)."""
    graph, feats, labels, train = data
    loader = make_loader(data, batch_size=8, prefetch=1, stall_timeout=10.0)
    n = 0
    for mb in loader.epoch(0):
        check_batch(mb, feats, labels)
        n += 1
    assert n == len(loader) > loader.prefetch + 2


def test_a_gather_thread_that_ends_without_a_result_is_reported(data, monkeypatch):  # noqa: F811
    monkeypatch.setattr(stages.EpochRun, "_gather_worker", lambda self: None)
    loader = make_loader(data, stall_timeout=10.0)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="gather thread ended without a result"):
        next(iter(loader.epoch(0)))
    assert time.monotonic() - t0 < 5.0
