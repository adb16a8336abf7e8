"""BGL's proximity-aware ordering: permutations, BFS locality, shuffling error, choice of k."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gnnio.graph.csr import CSRGraph
from gnnio.ordering import SeedOrder
from gnnio.ordering.po import (
    ProximityOrder,
    bfs_regions,
    combine_regions,
    paper_bound,
    shuffling_error,
    transpose_csr,
)

HYP = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def cliques(num: int, size: int) -> tuple[CSRGraph, np.ndarray]:
    """``num`` disjoint directed cliques of ``size`` nodes; label = clique index."""
    src, dst = [], []
    for c in range(num):
        nodes = np.arange(c * size, (c + 1) * size)
        s, d = np.meshgrid(nodes, nodes)
        keep = s != d
        src.append(s[keep])
        dst.append(d[keep])
    g = CSRGraph.from_edges(np.concatenate(src), np.concatenate(dst), num * size)
    return g, np.repeat(np.arange(num), size)


def random_graph(n: int, e: int, seed: int) -> CSRGraph:
    rng = np.random.default_rng(seed)
    return CSRGraph.from_edges(rng.integers(0, n, e), rng.integers(0, n, e), n)


# ---- shuffling error -------------------------------------------------------------------------


def test_shuffling_error_hand_examples():
    # global distribution (1/2, 1/2); batches [0 0] and [1 1]: TV 1/2 each
    assert shuffling_error(np.array([0, 0, 1, 1]), 2) == pytest.approx(0.5)
    assert shuffling_error(np.array([0, 1, 1, 0]), 2) == pytest.approx(0.0)
    # q = (3/6, 2/6, 1/6); batches [0 0 0] -> p = (1, 0, 0): TV = (1/2 + 2/6 + 1/6) / 2 = 1/2;
    # [1 1 2] -> p = (0, 2/3, 1/3): TV = (1/2 + 1/3 + 1/6) / 2 = 1/2
    assert shuffling_error(np.array([0, 0, 0, 1, 1, 2]), 3) == pytest.approx(0.5)
    # [0 1 2] -> (1/3, 1/3, 1/3): TV = (1/6 + 0 + 1/6) / 2 = 1/6, twice
    assert shuffling_error(np.array([0, 1, 2, 0, 1, 0]), 3) == pytest.approx(
        np.mean([1 / 6, abs(2 / 3 - 1 / 2) / 2 + abs(1 / 3 - 1 / 3) / 2 + 1 / 12])
    )
    # unlabeled (-1) seeds are ignored; the incomplete last batch is ignored
    assert shuffling_error(np.array([0, -1, 1, 0, 1, 1, 0]), 3) == pytest.approx(
        np.mean([0.0, abs(1 / 3 - 1 / 2)])
    )
    # two ranks: shards [0 0 | 1 1] and [1 1 | 0 0] (world_size 2, batch 2), all TV 1/2
    assert shuffling_error(np.array([0, 0, 1, 1, 1, 1, 0, 0]), 2, world_size=2) == pytest.approx(
        0.5
    )


def test_paper_bound():
    assert paper_bound(1024, 8, 1_200_000) == pytest.approx(math.sqrt(1024 * 8) / 1_200_000)


# ---- the BFS pool and the merge --------------------------------------------------------------


def test_transpose_csr_lists_out_neighbours():
    g = random_graph(30, 120, 1)
    rptr, ridx = transpose_csr(g)
    rev = g.reverse()
    for v in range(30):
        assert sorted(ridx[rptr[v] : rptr[v + 1]].tolist()) == sorted(
            rev.indices[rev.indptr[v] : rev.indptr[v + 1]].tolist()
        )


def test_regions_are_bfs_blocks_inside_components():
    g, _ = cliques(6, 10)
    seeds = np.arange(0, 60, 2)
    reg = bfs_regions(g, seeds, 4, np.random.default_rng(0))
    assert sorted(reg.seeds_by_region.tolist()) == list(range(30))
    assert reg.sizes.max() <= math.ceil(30 / 4) and reg.sizes.min() >= 1
    # a component is walked by one tree per root inside it (or one restart), and each tree's seeds
    # are consecutive: 6 cliques + 4 roots give at most 9 clique changes along the layout
    clique = seeds[reg.seeds_by_region] // 10
    assert int((np.diff(clique) != 0).sum()) <= 6 + 4 - 1
    one = bfs_regions(g, seeds, 1, np.random.default_rng(0))  # one root: cliques contiguous
    assert int((np.diff(seeds[one.seeds_by_region] // 10) != 0).sum()) == 5


@HYP
@given(
    sizes=st.lists(st.integers(1, 12), min_size=1, max_size=15),
    k=st.integers(1, 20),
    seed=st.integers(0, 1000),
)
def test_combine_regions_is_a_round_robin_permutation(sizes, k, seed):
    from gnnio.ordering.po import BFSRegions

    sizes = np.array(sizes, dtype=np.int64)
    n = int(sizes.sum())
    reg = BFSRegions(np.random.default_rng(seed).permutation(n), sizes, np.cumsum(sizes) - sizes)
    perm = combine_regions(reg, k, np.random.default_rng(seed))
    assert sorted(perm.tolist()) == list(range(n))
    # every block's items keep their BFS order up to one circular shift of their sequence
    pos = np.empty(n, dtype=np.int64)
    pos[perm] = np.arange(n)
    for s, m in zip(reg.starts, reg.sizes):
        p = pos[reg.seeds_by_region[s : s + m]]
        assert int((np.diff(p) < 0).sum()) <= 1


# ---- the order -------------------------------------------------------------------------------


@pytest.mark.parametrize("world_size", [1, 3])
def test_every_epoch_is_a_permutation_and_ranks_partition_it(world_size):
    g = random_graph(400, 1500, 2)
    seeds = np.random.default_rng(0).choice(400, 150, replace=False)
    labels = np.random.default_rng(1).integers(0, 4, 400)
    orders = [
        ProximityOrder(g, seeds, labels, 16, seed=3, num_sequences=3, rank=r, world_size=world_size)
        for r in range(world_size)
    ]
    assert isinstance(orders[0], SeedOrder)
    for epoch in range(4):
        full = orders[0].epoch_order(epoch)
        assert sorted(full.tolist()) == sorted(seeds.tolist())
        got = np.concatenate([np.concatenate(list(o.batches(epoch))) for o in orders])
        assert sorted(got.tolist()) == sorted(seeds.tolist())
        assert all(len(b) <= 16 for o in orders for b in o.batches(epoch))
    assert not np.array_equal(orders[0].epoch_order(0), orders[0].epoch_order(1))
    again = ProximityOrder(g, seeds, labels, 16, seed=3, num_sequences=3)
    assert np.array_equal(again.epoch_order(2), orders[0].epoch_order(2))  # (seed, epoch) only


def test_one_sequence_keeps_batches_inside_components():
    """On disjoint cliques, k = 1 changes clique only between BFS trees; a shuffle changes
    almost every step."""
    g, labels = cliques(20, 25)
    seeds = np.arange(500)
    po = ProximityOrder(g, seeds, labels, 25, seed=0, num_sequences=1, pool_size=1)
    order = po.epoch_order(0)
    assert int((np.diff(order // 25) != 0).sum()) <= 20  # 20 trees, one circular shift
    many = ProximityOrder(g, seeds, labels, 25, seed=0, num_sequences=1, pool_size=20)
    # trees: <= 20 roots + 20 restarts; blocks cut them further
    assert int((np.diff(many.epoch_order(0) // 25) != 0).sum()) <= 40 + many.regions.num_regions
    rnd = np.random.default_rng(0).permutation(500)
    assert int((np.diff(rnd // 25) != 0).sum()) > 400
    assert po.shuffling_error(0) > 0.8  # batches are nearly pure cliques


def test_num_sequences_is_the_smallest_meeting_the_bound():
    g, labels = cliques(16, 30)
    seeds = np.arange(480)
    bound = 0.45
    po = ProximityOrder(g, seeds, labels, 32, seed=1, bound=bound, max_sequences=32)
    k = po.num_sequences
    assert po.bound_met and po.bound_value == bound
    assert po.errors[k] <= bound
    assert all(po.errors[j] > bound for j in range(1, k))
    assert sorted(po.errors) == list(range(1, k + 1))
    assert k > 1  # one sequence gives pure-clique batches


def test_bounds_random_and_paper():
    g, labels = cliques(8, 40)
    seeds = np.arange(320)
    po = ProximityOrder(g, seeds, labels, 32, seed=0)  # default: the random-order floor
    rnd = np.mean(
        [
            shuffling_error(labels[np.random.default_rng([0, 0xE58, d]).permutation(320)], 32)
            for d in range(po.draws)
        ]
    )
    assert po.draws == 8 and po.bound_value == pytest.approx(1.25 * rnd)
    assert po.errors[po.num_sequences] <= po.bound_value
    with pytest.warns(UserWarning, match="no k"):
        paper = ProximityOrder(g, seeds, labels, 32, seed=0, bound="paper", max_sequences=6)
    assert paper.bound_value == pytest.approx(paper_bound(32, 1, 320))
    assert not paper.bound_met and paper.num_sequences == 6 and len(paper.errors) == 6


def test_labels_per_seed_or_per_node_and_errors():
    g, labels = cliques(4, 10)
    seeds = np.array([1, 5, 12, 33, 38])
    a = ProximityOrder(g, seeds, labels, 2, num_sequences=2)
    b = ProximityOrder(g, seeds, labels[seeds], 2, num_sequences=2)
    assert np.array_equal(a.labels, b.labels)
    with pytest.raises(ValueError, match="labels"):
        ProximityOrder(g, seeds, labels[:7], 2)
    with pytest.raises(ValueError, match="duplicates"):
        ProximityOrder(g, np.array([1, 1]), labels, 2)
    with pytest.raises(ValueError, match="seeds"):
        ProximityOrder(g, np.array([1, 99]), labels, 2)
    with pytest.raises(ValueError, match="bound"):
        ProximityOrder(g, seeds, labels, 2, bound="tight")
    with pytest.raises(ValueError, match="num_sequences"):
        ProximityOrder(g, seeds, labels, 2, num_sequences=0)
    with pytest.raises(ValueError, match="epoch"):
        a.epoch_order(-1)


def test_graph_without_edges_and_tiny_inputs():
    g = CSRGraph.from_edges(np.array([], dtype=np.int64), np.array([], dtype=np.int64), 10)
    po = ProximityOrder(g, np.arange(10), np.zeros(10, dtype=np.int64), 3, num_sequences=2)
    assert sorted(po.epoch_order(0).tolist()) == list(range(10))
    assert po.num_batches == 4
    one = ProximityOrder(g, np.array([4]), np.zeros(10, dtype=np.int64), 3)
    assert one.epoch_order(0).tolist() == [4]
    none = ProximityOrder(g, np.array([], dtype=np.int64), np.zeros(10, dtype=np.int64), 3)
    assert none.epoch_order(0).tolist() == [] and none.num_batches == 0


def test_each_sequence_starts_at_a_random_offset():
    """BGL's circular shift: one region of 50 seeds, one sequence -- every epoch is the region's
    BFS order rotated, and the rotation varies with the randomness (a giant graph's small
    components, appended at the end of a BFS, do not always come last)."""
    from gnnio.ordering.po import BFSRegions

    seq = np.random.default_rng(0).permutation(50)
    reg = BFSRegions(seq, np.array([50]), np.array([0]))
    firsts = set()
    for seed in range(40):
        perm = combine_regions(reg, 1, np.random.default_rng(seed))
        shift = int(np.flatnonzero(seq == perm[0])[0])
        assert np.array_equal(perm, np.roll(seq, -shift))
        firsts.add(shift)
    assert len(firsts) > 10


def test_distributed_po_reads_seed_aligned_labels_when_every_node_is_a_seed():
    """The shuffling error that picks k must see each seed's own label. When every node is a
    training seed (in any order) ProximityOrder reads ``N`` labels by global id; the distributed
    caller holds them aligned with the seeds, and handed them over as they were, so seed ``i``
    was given the label of node ``seeds[i]``'s position instead of its own."""
    from types import SimpleNamespace

    from gnnio.distributed.labels import read_seed_labels
    from gnnio.distributed.plan import proximity_order

    g, labels = cliques(4, 8)
    seeds = np.random.default_rng(0).permutation(g.num_nodes)
    ds = SimpleNamespace(graph=g)
    cfg = SimpleNamespace(po_sequences=None, progress=False)
    order = proximity_order(ds, cfg, seeds, read_seed_labels(labels, seeds), 8, 0, 0, 1, False)
    assert order.labels.tolist() == labels[seeds].tolist()
