"""BGL's partitioner (§3.3) and the label-propagation refinement, pinned where test_partition.py's
properties leave room: BFS blocks over both edge directions, which blocks count as large and where
small ones merge, the j-hop block neighbourhood, and the refinement's tie and cap rules (each
found by a surviving mutation)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from gnnio.errors import UsageError
from gnnio.graph import load
from gnnio.graph.csr import CSRGraph
from gnnio.preprocess.partition import partition_dataset
from gnnio.preprocess.partition.bfs_block import (
    _assign,
    _block_graph,
    _coarsen,
    _reach,
    bfs_block_parts,
    bfs_blocks,
)
from gnnio.preprocess.partition.refine import refine_parts
from tests.helpers import write_tiny_dataset


def sym(n: int, a, b, w=None) -> sp.csr_matrix:
    """Symmetric block graph on ``n`` blocks with edges ``a[i] - b[i]`` of weight ``w[i]``."""
    a, b = np.asarray(a), np.asarray(b)
    w = np.ones(a.size) if w is None else np.asarray(w, dtype=np.float64)
    m = sp.coo_matrix((w, (a, b)), shape=(n, n)).tocsr()
    return (m + m.T).tocsr()


# ---- step 1: blocks --------------------------------------------------------------------------


def test_bfs_blocks_grow_along_edges_in_both_directions():
    """A directed path is one weakly connected component: one source with a cap above its size
    grows a single block whichever node it starts from (BFS over in- and out-edges)."""
    n = 30
    g = CSRGraph.from_edges(np.arange(n - 1), np.arange(1, n), n)
    for s in range(8):
        block, nb = bfs_blocks(g, 1, n, np.random.default_rng(s))
        assert nb == 1 and (block == 0).all()


# ---- step 2: coarsening ----------------------------------------------------------------------


def test_only_the_top_tenth_by_size_is_large():
    """Ten blocks: only the largest (top 10 %, BGL's footnote 5) is large, so every block with an
    edge to it merges into it, even the second largest and the blocks tied more to that one."""
    sizes = np.array([50.0, 40, 5, 5, 5, 5, 5, 5, 5, 5])
    small = np.arange(1, 10)
    adj = sym(10, np.r_[small, np.arange(2, 10)], np.r_[np.zeros(9, int), np.ones(8, int)],
              np.r_[np.ones(9), np.full(8, 3.0)])  # fmt: skip
    merged = _coarsen(sizes, adj, np.random.default_rng(0))
    assert merged.tolist() == [0] * 10


def test_a_small_block_merges_into_its_heaviest_large_neighbour():
    """Twenty blocks, the two largest are large; each small block, tied to both, merges into the
    one it shares more edges with."""
    sizes = np.r_[50.0, 40, np.ones(18)]
    small = np.arange(2, 20)
    heavy_to_0 = small % 2 == 1
    adj = sym(
        20,
        np.r_[small, small],
        np.r_[np.zeros(18, int), np.ones(18, int)],
        np.r_[np.where(heavy_to_0, 5.0, 1.0), np.where(heavy_to_0, 1.0, 5.0)],
    )
    merged = _coarsen(sizes, adj, np.random.default_rng(0))
    assert merged[0] != merged[1]
    assert (merged[small[heavy_to_0]] == merged[0]).all()
    assert (merged[small[~heavy_to_0]] == merged[1]).all()


def test_isolated_small_blocks_pack_to_the_smallest_large_block():
    """Small blocks with no large neighbour merge at random in groups of about the smallest large
    block's size: large blocks of 8 and 4 nodes, 18 isolated unit blocks -> groups of at most 4."""
    sizes = np.r_[8.0, 4.0, np.ones(18)]
    for s in range(5):
        merged = _coarsen(sizes, sp.csr_matrix((20, 20)), np.random.default_rng(s))
        groups = np.bincount(merged[2:])
        groups = groups[groups > 0]
        assert set(merged[:2].tolist()).isdisjoint(merged[2:].tolist())
        assert groups.sum() == 18 and groups.max() == 4, groups


# ---- step 3: j-hop neighbour blocks ----------------------------------------------------------


def test_reach_counts_blocks_up_to_j_hops_without_the_block_itself():
    """On a path of 6 blocks, block 0's j-hop neighbourhood is blocks 1..j."""
    path = sym(6, np.arange(5), np.arange(1, 6))
    for hops in (1, 2, 3):
        r = _reach(path, hops)
        assert sorted(r.indices[r.indptr[0] : r.indptr[1]].tolist()) == list(range(1, hops + 1))
        want = set(range(max(0, 3 - hops), min(5, 3 + hops) + 1)) - {3}
        assert sorted(r.indices[r.indptr[3] : r.indptr[4]].tolist()) == sorted(want)


def test_reach_matches_bfs_distances_with_many_common_neighbours():
    """Gamma^h(B) is the blocks exactly h hops away (BGL §3.3.2): compared with BFS distances on
    the 0/1 int8 matrix ``_assign`` passes. Blocks 0 and 1 share 256 (then 512) neighbours and no
    edge: their walk count wrapped to 0 in int8, so each lost the other from its 2-hop set."""
    from scipy.sparse.csgraph import shortest_path

    for common in (256, 512):
        n = common + 3  # block n - 1 hangs off block 0 only: 3 hops from block 1
        mid = np.arange(2, common + 2)
        adj = sym(n, np.r_[np.zeros(common, int), np.ones(common, int), 0], np.r_[mid, mid, n - 1])
        a = (adj > 0).astype(np.int8).tocsr()
        dist = shortest_path(a.astype(np.float64), unweighted=True, directed=False)
        for hops in (1, 2, 3):
            r = _reach(a, hops)
            want = (dist <= hops) & (dist > 0)
            assert (r.toarray() > 0).tolist() == want.tolist(), (common, hops)


def test_block_graph_counts_edges_between_blocks_in_both_directions():
    """Entry (a, b) of the block graph is the number of edges between blocks a != b, whichever
    way they point, so it is symmetric; edges inside a block are not counted."""
    rng = np.random.default_rng(4)
    n, e, nb = 40, 160, 6
    g = CSRGraph.from_edges(rng.integers(0, n, e), rng.integers(0, n, e), n)
    label = rng.integers(0, nb, n)
    m = _block_graph(g, label, nb).toarray()
    want = np.zeros((nb, nb))
    for v in range(n):  # v's in-neighbour list: the edges u -> v
        for u in g.indices[g.indptr[v] : g.indptr[v + 1]]:
            a, b = label[u], label[v]
            if a != b:
                want[a, b] += 1
                want[b, a] += 1
    assert np.array_equal(m, want)


def test_documented_defaults_and_the_block_target():
    """Defaults: 64 sources per part, blocks of at most ceil(N / sources) nodes; coarsening
    stops once at most ``max_blocks`` blocks remain."""
    rng = np.random.default_rng(1)
    n = 1000
    g = CSRGraph.from_edges(rng.integers(0, n, 4000), rng.integers(0, n, 4000), n)
    _, facts = bfs_block_parts(g, 2, np.arange(0, n, 2), seed=0)
    assert facts["sources"] == 128 and facts["block_cap"] == -(-n // 128)
    for target in (40, 100):
        _, facts = bfs_block_parts(g, 2, np.arange(0, n, 2), seed=0, max_blocks=target)
        assert facts["levels"] >= 1 and facts["coarsened_blocks"] <= target


def test_weighted_assignment_follows_edge_counts_the_paper_counts_blocks():
    """Block 3 touches block 1 (part 1) by one edge and block 2 (part 2) by five, with equal
    penalties: the paper's block count ties (lowest part wins), ``weighted`` takes part 2.
    Block 0 fills part 0 (C = 41 / 3), so blocks 1 and 2 fall back to the emptiest parts."""
    adj = sym(4, [0, 0, 1, 2], [1, 2, 3, 3], [1, 1, 1, 5])
    sizes, train = np.array([30.0, 5, 5, 1]), np.zeros(4)
    assert _assign(adj, sizes, train, 3, hops=1).tolist() == [0, 1, 2, 1]
    assert _assign(adj, sizes, train, 3, hops=1, weighted=True).tolist() == [0, 1, 2, 2]


# ---- refinement (--refine) -------------------------------------------------------------------


def undirected(n: int, pairs) -> CSRGraph:
    a, b = np.array(pairs, dtype=np.int64).T
    return CSRGraph.from_edges(np.r_[a, b], np.r_[b, a], n)


def test_refine_keeps_a_node_whose_best_part_only_ties():
    """A move needs a strict gain: node 0 with one neighbour in each part stays, and so does
    node 2; nothing moves, and the first round without a move ends the refinement."""
    g = undirected(4, [(0, 1), (0, 2), (2, 3)])
    parts, facts = refine_parts(g, np.array([0, 0, 1, 1]), 2, None, 5, eps=1.0)
    assert parts.tolist() == [0, 0, 1, 1] and facts["refine_moves"] == [0]


def test_refine_fills_a_part_up_to_its_cap_and_no_further():
    """Caps are inclusive: with 4 nodes over 2 parts (cap 2), node 2 may join node 3's part,
    bringing it to exactly 2; node 3 may not join the part of 3 nodes (at its starting load)."""
    g = undirected(4, [(0, 1), (2, 3)])
    for seed in range(4):
        parts, _ = refine_parts(g, np.array([0, 0, 0, 1]), 2, None, 3, seed=seed, eps=0.0)
        assert parts.tolist() == [0, 0, 1, 1]


def test_refine_respects_the_training_node_cap():
    """Training node 3 has both neighbours in part 1, but part 1 already holds its share of
    training nodes (|T| / k = 3 / 2: at most one), so it stays."""
    g = undirected(6, [(0, 1), (1, 2), (0, 2), (3, 4), (3, 5)])
    for seed in range(4):
        parts, facts = refine_parts(
            g, np.array([0, 0, 0, 0, 1, 1]), 2, np.array([0, 3, 4]), 3, seed=seed, eps=0.0
        )
        assert parts.tolist() == [0, 0, 0, 0, 1, 1] and facts["refine_moves"] == [0]


def test_refine_ignores_self_loops():
    """A self loop is not a neighbour in a part: node 0, alone in part 0 with a self loop and one
    edge into part 1, joins part 1."""
    g = CSRGraph.from_edges(np.array([0, 0, 1, 1, 2]), np.array([0, 1, 0, 2, 1]), 3)
    parts, _ = refine_parts(g, np.array([0, 1, 1]), 2, None, 3, eps=1.0)
    assert parts.tolist() == [1, 1, 1]


def test_refine_lets_a_part_over_its_cap_refill_to_its_starting_load():
    """Part 0 starts with 4 nodes, over the cap of 3: once node 3 has left for part 1, node 5
    (all neighbours in part 0) may join it, back to 4 but never beyond; the refinement stops
    at the first round without a move, well before the 10 rounds asked."""
    g = undirected(6, [(0, 1), (1, 2), (0, 2), (3, 4), (5, 0), (5, 1), (5, 2)])
    for seed in range(4):
        parts, facts = refine_parts(
            g, np.array([0, 0, 0, 0, 1, 1]), 2, None, 10, seed=seed, eps=0.0
        )
        assert parts.tolist() == [0, 0, 0, 1, 1, 0], seed
        assert facts["refine_moves"][-1] == 0 and len(facts["refine_moves"]) <= 3


def test_hops_below_one_are_refused(tmp_path):
    """``--hops 0`` names no neighbour block at all: refused with one line, not run as 1."""
    ds = load(write_tiny_dataset(tmp_path / "g", num_nodes=20, num_edges=60, seed=0))
    with pytest.raises(UsageError, match="--hops: must be >= 1, got 0"):
        partition_dataset(ds, 2, "bfs-block", hops=0, measure=False)


def test_refine_visits_nodes_in_a_seeded_order():
    """The visiting order comes from ``seed``: the same seed gives the same parts, other seeds
    (on a random graph whose moves depend on the order) give other parts."""
    rng = np.random.default_rng(7)
    n = 200
    g = CSRGraph.from_edges(rng.integers(0, n, 800), rng.integers(0, n, 800), n)
    start = rng.integers(0, 4, n)
    runs = [refine_parts(g, start, 4, None, 1, seed=s, eps=0.5)[0] for s in (0, 0, 1, 2, 3)]
    assert np.array_equal(runs[0], runs[1])
    assert len({r.tobytes() for r in runs}) > 2
