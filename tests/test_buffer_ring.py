"""A buffer ring shared by loaders whose epochs do not overlap (``gnnio train``: the training,
valid and test loaders), and the slots' size: never more rows than the store has."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import gnnio
from gnnio.features import InMemoryFeatureStore
from gnnio.ordering import RandomOrder
from gnnio.pipeline.loader import BufferRing, NodeLoader
from gnnio.sampling import UniformSampler
from gnnio.train import TrainConfig
from gnnio.train.build import build_training
from gnnio.train.loop import LocalRun

from .helpers import write_tiny_dataset
from .test_loader import check_batch, data  # noqa: F401 - data is a fixture


def _loader(data, seeds, batch_size, **kw):  # noqa: F811
    graph, feats, labels, _ = data
    sampler = UniformSampler(graph, [4, 3], seed=1)
    order = RandomOrder(np.asarray(seeds, dtype=np.int64), batch_size, seed=2)
    return NodeLoader(sampler, kw.pop("store", None) or InMemoryFeatureStore(feats), order,
                      labels=labels, **kw)  # fmt: skip


def _epoch(loader, epoch=0):
    """The epoch's batches as ``(input nodes, x copy)`` (``x`` is a slot: copied)."""
    return [(mb.input_nodes.clone(), mb.x.clone()) for mb in loader.epoch(epoch)]


def test_loaders_sharing_a_ring_give_their_own_batches_from_one_set_of_slots(data):  # noqa: F811
    """Two loaders over other seeds and batch sizes, one ring: each gives the batches it gives
    with a ring of its own, and they hold ``prefetch + 2`` slots between them."""
    graph, feats, labels, train = data
    other = np.setdiff1d(np.arange(feats.shape[0]), train)[:250]
    ring = BufferRing(4)
    a, b = _loader(data, train, 16, ring=ring), _loader(data, other, 64, ring=ring)
    alone_a, alone_b = _loader(data, train, 16), _loader(data, other, 64)
    for e in range(2):
        for shared, alone in ((a, alone_a), (b, alone_b)):
            got, want = _epoch(shared, e), _epoch(alone, e)
            assert len(got) == len(want) > 3
            for (ids, x), (ids2, x2) in zip(got, want, strict=True):
                assert torch.equal(ids, ids2) and torch.equal(x, x2)
                assert np.array_equal(x.numpy(), feats[ids.numpy()])
    assert a._slots is b._slots is ring.slots and len(ring.slots) == 4
    assert all(s is not None for s in ring.slots)


def test_an_epoch_of_a_ring_waits_for_the_other_loaders_epoch_to_end(data):  # noqa: F811
    """While one loader of a ring is in an epoch, another's epoch is refused (its slots would
    overwrite the running epoch's ``batch.x``); once that epoch ends or is closed it starts."""
    graph, feats, labels, train = data
    ring = BufferRing(3)
    a, b = _loader(data, train, 16, ring=ring, prefetch=1), _loader(data, train, 32, ring=ring,
                                                                   prefetch=1)  # fmt: skip
    it = a.epoch(0)
    first = next(it)
    with pytest.raises(ValueError, match="still running"):
        b.epoch(0)
    check_batch(first, feats, labels)  # (the refused start touched nothing)
    it.close()
    assert len(_epoch(b)) == len(b)  # closed: b runs
    assert len(_epoch(a)) == len(a)  # b's epoch ran to its end: a runs again
    assert len(_epoch(a, 1)) == len(a)  # (a loader after itself: as without a ring)


def test_a_ring_refuses_loaders_it_cannot_serve(data):  # noqa: F811
    """A loader whose ``prefetch + 2`` is not the ring's size, or whose rows differ in width or
    dtype from the ring's first loader's, is refused when made; fewer than 3 slots too."""
    graph, feats, labels, train = data
    ring = BufferRing(4)
    _loader(data, train, 16, ring=ring)
    with pytest.raises(ValueError, match="prefetch \\+ 2"):
        _loader(data, train, 16, ring=ring, prefetch=1)
    narrow = InMemoryFeatureStore(np.ascontiguousarray(feats[:, :4]))
    with pytest.raises(ValueError, match="shared with a loader of rows"):
        _loader(data, train, 16, ring=ring, store=narrow)
    half = InMemoryFeatureStore(feats.astype(np.float16))
    with pytest.raises(ValueError, match="shared with a loader of rows"):
        _loader(data, train, 16, ring=ring, store=half)
    with pytest.raises(ValueError, match=">= 3 slots"):
        BufferRing(2)


def test_gnnio_trains_with_one_ring_for_its_loaders(tmp_path):
    """``build_training``'s training and evaluation loaders share one ring, and a run's losses
    and accuracies are those of loaders with rings of their own."""
    path = write_tiny_dataset(tmp_path / "d", num_nodes=200, num_edges=1200, feat_dim=6)
    cfg = TrainConfig(fanouts=(3, 2), batch_size=16, hidden=8, epochs=2, progress=False, seed=0)
    parts = build_training(gnnio.load(path), cfg, LocalRun(), torch.device("cpu"))
    loaders = [parts.train_loader, *parts.eval_loaders.values()]
    assert len(loaders) == 3 and all(ld._slots is loaders[0]._slots for ld in loaders)
    assert len(loaders[0]._slots) == cfg.prefetch + 2

    from gnnio.train import train

    shared = train(gnnio.load(path), cfg)
    real_init = NodeLoader.__init__

    def own_ring(self, *a, **kw):
        kw.pop("ring", None)
        real_init(self, *a, **kw)

    NodeLoader.__init__ = own_ring
    try:
        alone = train(gnnio.load(path), cfg)
    finally:
        NodeLoader.__init__ = real_init
    for k in ("loss_history", "best_valid_acc", "test_acc"):
        assert shared[k] == alone[k], k


def test_a_slot_holds_at_most_the_stores_rows(data):  # noqa: F811
    """Headroom of 1.25x the batch, but never more rows than the store has: a batch of every
    node makes a slot of exactly ``num_rows``; a batch repeating ids beyond that still fits."""
    graph, feats, labels, train = data
    n = feats.shape[0]
    loader = _loader(data, train, 16)
    assert tuple(loader._slot_view(0, n - 10).shape) == (n - 10, feats.shape[1])
    assert loader._slots[0].shape[0] == n  # (1.25 * (n - 10) rows: capped at n)
    loader._slot_view(1, 40)
    assert loader._slots[1].shape[0] == 50  # below the store's rows: 1.25x
    loader._slot_view(2, n + 7)  # (ids repeated: more than the store's rows)
    assert loader._slots[2].shape[0] == n + 7
