"""The pre-sampled access trace (:mod:`gnnio.placement.trace`) against the rule its docstring
states: batch ``b`` of epoch ``e`` of :class:`~gnnio.ordering.RandomOrder` is sampled with
``epoch_seed = e * 2**32 + b`` (``+ d * 2**24`` per device in ``seed_parts`` mode) and dealt to
GPU ``b mod n`` (its own partition's GPU in ``seed_parts`` mode); rules a mutation pass found
untested (2026-11-29)."""

from __future__ import annotations

import numpy as np
import pytest

from gnnio.errors import DatasetError
from gnnio.ordering import RandomOrder
from gnnio.placement.trace import regroup, sample_trace
from gnnio.sampling import UniformSampler
from tests.helpers import random_graph

G = random_graph(200, 1200, seed=2)
TRAIN = np.arange(0, 200, 3, dtype=np.int64)  # 67 seeds: 9 batches of 8
FO, BS, SEED = [3, 2], 8, 5


def _reference(n, epoch, epochs, parts=None):
    s = UniformSampler(G, FO, seed=SEED, num_threads=1)
    counts = np.zeros((n, G.num_nodes), dtype=np.int64)
    batches = [0] * n
    for e in range(epoch, epoch + epochs):
        jobs = (
            [(None, TRAIN)] if parts is None else [(d, TRAIN[parts[TRAIN] == d]) for d in range(n)]
        )
        for dev, seeds_all in jobs:
            if seeds_all.size == 0:
                continue
            for b, seeds in enumerate(RandomOrder(seeds_all, BS, seed=SEED).batches(e)):
                d, key = (
                    (b % n, e * 2**32 + b) if dev is None else (dev, e * 2**32 + dev * 2**24 + b)
                )
                counts[d, s.sample(seeds, epoch_seed=key).input_nodes.numpy()] += 1
                batches[d] += 1
    return counts, batches


@pytest.mark.parametrize("n, epoch, epochs", [(3, 0, 1), (2, 4, 2)])
def test_global_trace_is_the_stated_epochs_dealt_round_robin(n, epoch, epochs):
    t = sample_trace(G, TRAIN, FO, BS, n, seed=SEED, epoch=epoch, epochs=epochs, progress=False)
    counts, batches = _reference(n, epoch, epochs)
    assert (t.counts == counts).all() and t.batches == batches
    assert (t.epoch, t.epochs, t.seeds_mode) == (epoch, epochs, "global")
    assert np.allclose(t.per_epoch, counts / epochs)
    d = t.to_dict()
    assert d["mean_rows_per_batch"] == pytest.approx(counts.sum() / sum(batches))  # per batch
    assert d["rows_per_device"] == pytest.approx((counts.sum(axis=1) / epochs).tolist())


def test_parts_trace_seeds_each_device_with_its_own_keys():
    parts = np.arange(G.num_nodes) % 3
    parts[TRAIN[:5]] = 2  # uneven parts
    t = sample_trace(G, TRAIN, FO, BS, 3, seed=SEED, epoch=1, seed_parts=parts, progress=False)
    counts, batches = _reference(3, 1, 1, parts)
    assert (t.counts == counts).all() and t.batches == batches


def test_a_device_without_training_nodes_reads_nothing():
    parts = np.zeros(G.num_nodes, dtype=np.int64)  # every seed on GPU 0; GPU 1 has none
    t = sample_trace(G, TRAIN, FO, BS, 2, seed=SEED, seed_parts=parts, progress=False)
    assert t.batches[1] == 0 and t.counts[1].sum() == 0 and t.batches[0] == 9


def test_refusals():
    with pytest.raises(DatasetError, match="no training nodes"):
        sample_trace(G, np.array([], dtype=np.int64), FO, BS, 2, progress=False)
    with pytest.raises(ValueError, match="epochs: must be >= 1, got 0"):
        sample_trace(G, TRAIN, FO, BS, 2, epochs=0, progress=False)
    t = sample_trace(G, TRAIN, FO, BS, 4, seed=SEED, progress=False)
    parts = sample_trace(G, TRAIN, FO, BS, 2, seed_parts=np.zeros(200, int), progress=False)
    with pytest.raises(ValueError, match="only a global-mode trace"):
        regroup(parts, 1)
    for bad in (0, 3, 8):
        with pytest.raises(ValueError, match="does not divide"):
            regroup(t, bad)
    assert regroup(t, 4) is t


def test_regroup_sums_slots_and_keeps_the_epochs():
    t = sample_trace(G, TRAIN, FO, BS, 4, seed=SEED, epoch=2, epochs=2, progress=False)
    r = regroup(t, 2)
    want = sample_trace(G, TRAIN, FO, BS, 2, seed=SEED, epoch=2, epochs=2, progress=False)
    assert (r.counts == want.counts).all() and r.batches == want.batches
    assert (r.epoch, r.epochs) == (2, 2) and np.allclose(r.per_epoch, want.per_epoch)
