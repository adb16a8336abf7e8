"""NodeLoader's smaller rules (mutation pass): a resumed epoch is the tail of the full one with any
number of workers; the note a stage's exception carries; the stall message's choice of stage; the
hidden fraction's arithmetic."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
import torch

from gnnio.features import InMemoryFeatureStore
from gnnio.pipeline.loader import LoaderStats
from gnnio.pipeline.stages import EpochRun

from .test_loader import FlakySampler, check_batch, data, make_loader  # noqa: F401 - a fixture


def test_hidden_fraction_by_hand():
    st = LoaderStats(sample_s=1.0, gather_s=0.5, transfer_s=0.5, wait_s=0.5)
    assert st.stage_sum_s == 2.0 and st.hidden_fraction == 0.75
    assert LoaderStats(sample_s=1.0, wait_s=3.0).hidden_fraction == 0.0  # clipped at 0
    assert LoaderStats(wait_s=1.0).hidden_fraction == 1.0  # no loading work
    assert LoaderStats(gather_s=1.0).as_dict()["hidden_fraction"] == 1.0


@pytest.mark.parametrize("num_workers", [1, 2, 3])
def test_a_resumed_epoch_is_the_tail_of_the_full_one(data, num_workers):  # noqa: F811
    """Batch ``i`` is sampled with key ``(epoch, i)`` whatever ``start`` is; with several workers
    the gather takes batch ``start + j`` from worker ``j % num_workers``'s queue, as that worker
    sampled it."""
    graph, feats, labels, train = data
    # (a batch taken from the wrong worker's queue waits forever: the stall timeout ends it)
    loader = make_loader(data, batch_size=40, num_workers=num_workers, stall_timeout=30)
    full = [(mb.seeds.clone(), mb.input_nodes.clone()) for mb in loader.epoch(3)]
    for start in (1, 2, len(full) - 1):
        got = []
        for mb in loader.epoch(3, start=start):
            check_batch(mb, feats, labels)
            got.append((mb.seeds.clone(), mb.input_nodes.clone()))
        assert len(got) == len(full) - start and loader.stats.complete
        for (s, n), (fs, fn) in zip(got, full[start:]):
            assert torch.equal(s, fs) and torch.equal(n, fn)
        assert loader.stats.num_batches == len(got)


def test_start_at_the_end_is_an_empty_epoch_and_past_it_an_error(data):  # noqa: F811
    loader = make_loader(data, batch_size=40)
    assert list(loader.epoch(0, start=len(loader))) == [] and loader.stats.complete
    assert loader.stats.timed_by_events is False  # no streams: timed by the wall clock
    for bad in (-1, len(loader) + 1):
        with pytest.raises(ValueError, match="start"):
            loader.epoch(0, start=bad)


def test_a_stage_exception_says_where_it_was_raised(data):  # noqa: F811
    graph, feats, labels, train = data
    sampler = FlakySampler(graph, [4, 3], seed=1, fail_at=2)
    loader = make_loader(data, sampler=sampler, num_workers=2)
    with pytest.raises(KeyError) as err:
        for _ in loader.epoch(4):
            pass
    notes = getattr(err.value, "__notes__", [])
    assert notes == [
        "(raised in the gnnio loader's sample (worker 0) stage: sampler.sample for batch 2 "
        "of epoch 4)"
    ]

    class Broken(InMemoryFeatureStore):
        def gather(self, ids, out=None):
            raise OSError("disk on fire")

    with pytest.raises(OSError) as err:
        next(iter(make_loader(data, store=Broken(feats)).epoch(1, start=3)))
    assert err.value.__notes__ == [
        "(raised in the gnnio loader's gather stage: store.gather for batch 3 of epoch 1)"
    ]


def _run(busy, threads=()):
    return SimpleNamespace(busy=busy, epoch=7, threads=list(threads))


def test_the_stall_message_names_the_stage_busy_longest():
    now = time.monotonic()
    run = _run({"sample (worker 1)": ("sampler.sample", 9, now - 5.0),
                "gather": ("store.gather", 4, now - 60.0)})  # fmt: skip
    msg = EpochRun.stalled(run, 61.0)
    assert msg.startswith("no batch from the loader for 61 s (--stall-timeout), epoch 7: ")
    assert msg.endswith("the gather stage has been in store.gather for batch 4 for 60 s")
    done = threading.Thread(target=lambda: None, name="gnnio-sample-0")
    done.start()
    done.join()
    alive = SimpleNamespace(name="gnnio-gather", is_alive=lambda: True)
    assert EpochRun.stalled(_run({}, [done, alive]), 3.0).endswith(
        "epoch 7: no stage is busy (ended: gnnio-sample-0)"
    )
    assert EpochRun.stalled(_run({}, [alive]), 3.0).endswith("epoch 7: no stage is busy")


def test_a_carried_batch_that_differs_is_not_taken(data):  # noqa: F811
    """A sampler that takes ``epoch_seed`` but ignores it draws the next epoch's batches anew:
    the batches announced at the end of the previous epoch differ, and each batch keeps its own
    input nodes (not the carried ones, which belong to another draw)."""
    from gnnio.features.caches.cache import FeatureCache
    from gnnio.sampling import UniformSampler

    graph, feats, labels, train = data

    class KeyIgnored(UniformSampler):
        calls = 0

        def sample(self, seeds, epoch_seed=None):
            self.calls += 1
            mb = super().sample(seeds, epoch_seed=self.calls)
            mb.meta["drawn"] = mb.input_nodes.clone()
            return mb

    cache = FeatureCache(InMemoryFeatureStore(feats), 100, "lookahead", lookahead=3)
    loader = make_loader(data, batch_size=40, store=cache, sampler=KeyIgnored(graph, [4, 3]))
    for epoch in range(2):
        for mb in loader.epoch(epoch):
            assert torch.equal(mb.input_nodes, mb.meta["drawn"])
            check_batch(mb, feats, labels)


def test_each_batch_carries_the_store_mark_after_its_gather(data):  # noqa: F811
    """A store with a ``mark()`` (state a mid-epoch checkpoint rewinds to) has it taken right
    after each batch's gather, and the batch carries it."""
    graph, feats, labels, train = data

    class Marked(InMemoryFeatureStore):
        gathers = 0

        def gather(self, ids, out=None):
            self.gathers += 1
            return super().gather(ids, out=out)

        def mark(self):
            return self.gathers

    loader = make_loader(data, batch_size=40, store=Marked(feats))
    marks = [mb.meta["store_mark"] for mb in loader.epoch(0)]
    assert marks == list(range(1, len(loader) + 1))


def test_a_sampler_without_keys_feeds_a_lookahead_store(data):  # noqa: F811
    """``sample(seeds)`` only: the next epoch's first batches cannot be sampled ahead (they would
    be other draws), so none are; every batch is announced within its own epoch."""
    from gnnio.features.caches.cache import FeatureCache
    from gnnio.sampling import UniformSampler

    graph, feats, labels, train = data

    class Unkeyed:
        def __init__(self, inner):
            self.inner = inner

        def sample(self, seeds):
            return self.inner.sample(seeds)

    cache = FeatureCache(InMemoryFeatureStore(feats), 100, "lookahead", lookahead=3)
    sampler = Unkeyed(UniformSampler(graph, [4, 3], seed=1))
    loader = make_loader(data, batch_size=40, store=cache, sampler=sampler)
    for epoch in range(2):
        for mb in loader.epoch(epoch):
            check_batch(mb, feats, labels)
        assert loader.stats.complete and loader.stats.num_batches == len(loader)
