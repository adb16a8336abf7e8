"""Seed orders pinned where test_ordering.py and test_ordering_po.py leave room: the checks users
hit, the documented defaults, BGL's BFS regions over both edge directions with restarts dealt in
turn, the k-sequence merge against a reference written from its docstring, and the shuffling
error's partial batches (each found by a surviving mutation)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gnnio.graph.csr import CSRGraph
from gnnio.ordering import RandomOrder, SeedOrder
from gnnio.ordering.po import (
    BFSRegions,
    ProximityOrder,
    bfs_regions,
    combine_regions,
    shuffling_error,
)

from .test_ordering_po import cliques


def edgeless(n: int) -> CSRGraph:
    e = np.zeros(0, dtype=np.int64)
    return CSRGraph.from_edges(e, e, n)


# ---- arguments -------------------------------------------------------------------------------


def test_proximity_order_refuses_bad_arguments_with_its_own_words():
    """Seeds one past the last node, float labels, zero draws and a negative seed are refused
    by name at construction (not by an IndexError, a silent cast or a NaN estimate later)."""
    g = edgeless(10)
    lab = np.zeros(10, dtype=np.int64)
    with pytest.raises(ValueError, match=r"seeds: ids must be in \[0, 10\)"):
        ProximityOrder(g, np.array([3, 10]), lab, 2, num_sequences=1)
    with pytest.raises(ValueError, match="labels: need a 1-D integer array"):
        ProximityOrder(g, np.arange(4), np.zeros(10), 2, num_sequences=1)
    with pytest.raises(ValueError, match="draws"):
        ProximityOrder(g, np.arange(4), lab, 2, draws=0)
    with pytest.raises(ValueError, match="seed: must be >= 0"):
        ProximityOrder(g, np.arange(4), lab, 2, seed=-1, num_sequences=1)


def test_random_order_and_equal_batches_refusals():
    """A negative seed is refused at construction; equal_batches with batch size 1 and a seed
    count the ranks do not divide is refused (a rank would get an empty batch)."""
    with pytest.raises(ValueError, match="seed"):
        RandomOrder(np.arange(4), 2, seed=-1)
    with pytest.raises(ValueError, match="batch size 1"):
        RandomOrder(np.arange(5), 1, rank=0, world_size=2, equal_batches=True)
    ok = [RandomOrder(np.arange(6), 1, rank=r, world_size=2, equal_batches=True) for r in (0, 1)]
    assert [[len(b) for b in o.batches(0)] for o in ok] == [[1, 1, 1], [1, 1, 1]]


def test_sequence_defaults_and_clamps():
    """max_sequences defaults to min(batch_size, 1024); the pool grows to an explicit k larger
    than it; k never exceeds the number of regions (at most one per seed)."""
    g = edgeless(2000)
    lab = np.zeros(2000, dtype=np.int64)
    assert ProximityOrder(g, np.arange(50), lab, 8, num_sequences=1).max_sequences == 8
    assert ProximityOrder(g, np.arange(50), lab, 2000, num_sequences=1).max_sequences == 1024
    big = ProximityOrder(g, np.arange(100), lab, 4, num_sequences=10)
    assert big.num_sequences == 10 and big.regions.num_regions >= 10
    few = ProximityOrder(g, np.arange(10), lab, 4, num_sequences=50)
    assert few.regions.num_regions == 10 and few.num_sequences == 10


def test_the_seed_moves_the_bfs_roots():
    """``seed`` seeds everything random, the BFS roots of the pool included."""
    g, lab = cliques(10, 10)
    pools = {
        tuple(
            ProximityOrder(
                g, np.arange(100), lab, 10, seed=s, num_sequences=4
            ).regions.seeds_by_region
        )
        for s in range(4)
    }
    assert len(pools) > 1


def test_each_candidate_averages_distinct_draws():
    """Every candidate k's estimate is a mean over ``draws`` different orders, not one order
    counted ``draws`` times: one draw and four draws give different estimates."""
    g, lab = cliques(8, 12)
    kw = dict(bound=-1.0, max_sequences=6)  # never met: every k is estimated
    with pytest.warns(UserWarning, match="no k"):
        one = ProximityOrder(g, np.arange(96), lab, 12, draws=1, **kw)
    with pytest.warns(UserWarning, match="no k"):
        four = ProximityOrder(g, np.arange(96), lab, 12, draws=4, **kw)
    assert sorted(one.errors) == sorted(four.errors) == list(range(1, 7))
    assert any(one.errors[k] != four.errors[k] for k in one.errors)


def test_a_candidate_equal_to_the_bound_meets_it():
    """The automatic choice keeps the first k with ``eps <= bound``: a bound equal to the
    smallest estimate picks the first k reaching it."""
    g, lab = cliques(8, 12)
    with pytest.warns(UserWarning, match="no k"):
        probe = ProximityOrder(g, np.arange(96), lab, 12, bound=-1.0, max_sequences=8)
    best = min(probe.errors.values())
    first = min(k for k, e in probe.errors.items() if e == best)
    po = ProximityOrder(g, np.arange(96), lab, 12, bound=best, max_sequences=8)
    assert po.bound_met and po.num_sequences == first


# ---- BFS regions -----------------------------------------------------------------------------


def test_restarted_trees_are_dealt_to_the_regions_in_turn():
    """Without edges every seed is its own tree: 4 roots, then 6 restarts dealt to regions
    0, 1, 2, 3, 0, 1 give regions of 3, 3, 2, 2 seeds, none over ceil(10 / 4) = 3, so none is
    cut: 4 blocks."""
    for s in range(5):
        reg = bfs_regions(edgeless(10), np.arange(10), 4, np.random.default_rng(s))
        assert reg.sizes.tolist() == [3, 3, 2, 2]
        assert reg.starts.tolist() == [0, 3, 6, 8]


def test_bfs_follows_edges_in_both_directions():
    """On a directed path 0 -> 1 -> ... -> 19 and a second one 20 -> ... -> 39, one root
    walks its whole path outward in both directions (distance from the root never decreases),
    then a restart walks the other path: each path's seeds are consecutive."""
    n = 20
    src = np.r_[np.arange(n - 1), np.arange(n, 2 * n - 1)]
    g = CSRGraph.from_edges(src, src + 1, 2 * n)
    for s in range(6):
        order = bfs_regions(g, np.arange(2 * n), 1, np.random.default_rng(s)).seeds_by_region
        assert int((np.diff(order // n) != 0).sum()) == 1
        for part in (order[:n], order[n:]):
            assert (np.diff(np.abs(part - part[0])) >= 0).all(), part


# ---- the k-sequence merge --------------------------------------------------------------------


def reference_combine(regions: BFSRegions, k: int, rng: np.random.Generator) -> np.ndarray:
    """combine_regions' docstring, step by step: regions dealt round-robin in a random order into
    k sequences, each shifted circularly by ``floor(U * L)``, items merged by ``(i + u) / L``."""
    r = regions.num_regions
    k = max(1, min(k, r))
    deal = rng.permutation(r)
    seqs = [
        np.concatenate([regions.seeds_by_region[s : s + m] for s, m in
                        zip(regions.starts[deal[g::k]], regions.sizes[deal[g::k]])])
        for g in range(k)
    ]  # fmt: skip
    lengths = np.array([len(s) for s in seqs])
    shifts = (rng.random(k) * lengths).astype(np.int64)
    offsets = rng.random(k)
    keyed = [
        ((i + offsets[g]) / lengths[g], int(np.roll(seqs[g], -shifts[g])[i]))
        for g in range(k)
        for i in range(lengths[g])
    ]
    return np.array([v for _, v in sorted(keyed)], dtype=np.int64)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(1, 9), min_size=1, max_size=12),
    k=st.integers(1, 14),
    seed=st.integers(0, 10_000),
)
def test_combine_regions_matches_the_reference(sizes, k, seed):
    """The epoch order is exactly the docstring's merge: whole regions per sequence, a random
    circular shift and a random offset per sequence, keys ``(i + u_g) / L_g`` smallest first."""
    sizes = np.array(sizes, dtype=np.int64)
    n = int(sizes.sum())
    reg = BFSRegions(np.random.default_rng(seed).permutation(n), sizes, np.cumsum(sizes) - sizes)
    got = combine_regions(reg, k, np.random.default_rng([seed, 1]))
    want = reference_combine(reg, k, np.random.default_rng([seed, 1]))
    assert np.array_equal(got, want)


def test_a_short_sequence_lands_anywhere_in_the_epoch():
    """The random offset ``u_g``: a sequence of one seed beside one of three is read at key
    ``u_1`` against ``(i + u_2) / 3``, so over many epochs it takes every one of the 4 places
    (with no offset it would always come first or second)."""
    reg = BFSRegions(np.arange(4), np.array([1, 3]), np.array([0, 1]))
    places = {
        int(np.flatnonzero(combine_regions(reg, 2, np.random.default_rng(s)) == 0)[0])
        for s in range(200)
    }
    assert places == {0, 1, 2, 3}


# ---- shuffling error -------------------------------------------------------------------------


def test_shuffling_error_partial_batches_and_global_distribution():
    """A rank with no full batch counts its partial one; the global distribution counts every
    labelled seed, the ones in an incomplete last batch too."""
    # two ranks of 3 seeds, batch 4: partial batches [0 0 0] and [1 1 1], TV 1/2 each
    assert shuffling_error(np.array([0, 0, 0, 1, 1, 1]), 4, world_size=2) == pytest.approx(0.5)
    # q = (2/6, 4/6) over all six; the one full batch [0 1 0 1] has TV 1/6
    assert shuffling_error(np.array([0, 1, 0, 1, 1, 1]), 4) == pytest.approx(1 / 6)


class Identity(SeedOrder):
    def epoch_order(self, epoch):
        return self.seeds.copy()


@settings(max_examples=40, deadline=None)
@given(
    labels=st.lists(st.integers(-1, 3), min_size=1, max_size=40),
    world=st.integers(1, 4),
    bs=st.integers(1, 9),
)
def test_shuffling_error_reads_the_batches_seedorder_makes(labels, world, bs):
    """The shuffling error averages the label TV over exactly the batches SeedOrder gives every
    rank: the full ones, or a rank's partial batch when it has no full one."""
    lab = np.array(labels)
    if not (lab >= 0).any():
        return
    c = int(lab.max()) + 1
    q = np.bincount(lab[lab >= 0], minlength=c) / (lab >= 0).sum()
    tvs = []
    for r in range(world):
        got = [
            b.numpy()
            for b in Identity(np.arange(lab.size), bs, rank=r, world_size=world).batches(0)
        ]
        full = [b for b in got if b.size == bs] or [b for b in got if b.size]
        for b in full:
            x = lab[b][lab[b] >= 0]
            if x.size:
                tvs.append(0.5 * np.abs(np.bincount(x, minlength=c) / x.size - q).sum())
    want = float(np.mean(tvs)) if tvs else 0.0
    assert shuffling_error(lab, bs, world_size=world) == pytest.approx(want)


def test_the_order_measures_its_error_over_all_ranks_shards():
    """``world_size`` enters ProximityOrder's shuffling error: 2 ranks of 5 seeds and batch 4
    read positions 0-3 and 5-8, one rank would read 0-3 and 4-7."""
    g, lab = cliques(5, 2)
    differ = 0
    for seed in range(10):
        po = ProximityOrder(g, np.arange(10), lab, 4, seed=seed, num_sequences=1, world_size=2)
        order = lab[po.epoch_order(0)]
        assert po.shuffling_error(0) == pytest.approx(shuffling_error(order, 4, world_size=2))
        differ += shuffling_error(order, 4, world_size=2) != pytest.approx(
            shuffling_error(order, 4)
        )
    assert differ > 0
