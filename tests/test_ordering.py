"""Seed orders: a permutation per epoch, different per epoch, sharding over ranks, drop_last."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gnnio.ordering import RandomOrder, SeedOrder


def epoch_seeds(order: SeedOrder, epoch: int) -> np.ndarray:
    parts = [b.numpy() for b in order.batches(epoch)]
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


def test_each_epoch_is_a_permutation_and_epochs_differ():
    seeds = np.arange(100, 1100, 3)
    order = RandomOrder(torch.from_numpy(seeds), batch_size=64, seed=5)
    e0, e1 = epoch_seeds(order, 0), epoch_seeds(order, 1)
    assert np.array_equal(np.sort(e0), np.sort(seeds)) and np.array_equal(np.sort(e1), seeds)
    assert not np.array_equal(e0, e1) and not np.array_equal(e0, seeds)
    assert np.array_equal(e0, epoch_seeds(order, 0)), "an epoch is reproducible"
    other = RandomOrder(seeds, batch_size=64, seed=6)
    assert not np.array_equal(e0, epoch_seeds(other, 0)), "the seed matters"
    batches = list(order.batches(0))
    assert len(batches) == order.num_batches == len(order) == -(-len(seeds) // 64)
    assert all(b.dtype == torch.int64 for b in batches)
    assert [len(b) for b in batches[:-1]] == [64] * (len(batches) - 1)


def test_drop_last():
    order = RandomOrder(np.arange(10), batch_size=4, drop_last=True)
    batches = list(order.batches(3))
    assert order.num_batches == 2 and [len(b) for b in batches] == [4, 4]
    assert len(set(np.concatenate([b.numpy() for b in batches]).tolist())) == 8
    keep = RandomOrder(np.arange(10), batch_size=4)
    assert keep.num_batches == 3 and [len(b) for b in keep.batches(3)] == [4, 4, 2]
    assert RandomOrder(np.arange(3), batch_size=4, drop_last=True).num_batches == 0


@settings(max_examples=50, deadline=None, derandomize=True)
@given(
    n=st.integers(0, 200),
    world=st.integers(1, 5),
    bs=st.integers(1, 40),
    epoch=st.integers(0, 3),
    drop_last=st.booleans(),
)
def test_ranks_disjoint_and_covering(n, world, bs, epoch, drop_last):
    seeds = np.arange(n) * 7 + 1
    orders = [
        RandomOrder(seeds, bs, seed=3, drop_last=drop_last, rank=r, world_size=world)
        for r in range(world)
    ]
    shares = [epoch_seeds(o, epoch) for o in orders]
    allseen = np.concatenate(shares)
    assert len(np.unique(allseen)) == len(allseen), "ranks must never share a seed"
    assert set(allseen.tolist()) <= set(seeds.tolist())
    for o, s in zip(orders, shares):
        assert len(s) == (o.num_batches * bs if drop_last else o.shard_size)
        assert len(list(o.batches(epoch))) == o.num_batches
    if not drop_last:
        assert np.array_equal(np.sort(allseen), np.sort(seeds)), "ranks together cover all seeds"
        counts = [o.num_batches for o in orders]
        assert max(counts) - min(counts) <= 1
    else:
        assert len({o.num_batches for o in orders}) == 1, "drop_last: same batch count per rank"


def test_shards_are_slices_of_one_permutation():
    seeds = np.arange(50)
    full = RandomOrder(seeds, 8, seed=1).epoch_order(2)
    parts = [RandomOrder(seeds, 8, seed=1, rank=r, world_size=3).shard(2) for r in range(3)]
    assert np.array_equal(np.concatenate(parts), full)


def test_custom_order_plugs_in():
    class Reverse(SeedOrder):
        def epoch_order(self, epoch):
            return self.seeds[::-1].copy()

    o = Reverse(np.arange(7), batch_size=3, rank=1, world_size=2)
    assert [b.tolist() for b in o.batches(0)] == [[3, 2, 1], [0]]


def test_bad_arguments():
    with pytest.raises(ValueError, match="batch_size"):
        RandomOrder(np.arange(4), 0)
    with pytest.raises(ValueError, match="rank"):
        RandomOrder(np.arange(4), 2, rank=2, world_size=2)
    with pytest.raises(ValueError, match="world_size"):
        RandomOrder(np.arange(4), 2, world_size=0)
    with pytest.raises(ValueError, match="1-D"):
        RandomOrder(np.zeros((2, 2), dtype=np.int64), 2)
    with pytest.raises(ValueError, match="integer"):
        RandomOrder(np.array([0.5]), 2)
    with pytest.raises(ValueError, match="epoch"):
        next(RandomOrder(np.arange(4), 2).batches(-1))


def test_does_not_alias_caller_array():
    seeds = np.arange(6)
    order = RandomOrder(seeds, 2)
    seeds[:] = 99
    assert set(epoch_seeds(order, 0).tolist()) == set(range(6))
