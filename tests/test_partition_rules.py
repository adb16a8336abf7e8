"""HyDRA's HDR and the simple partitioners, pinned where test_partition.py's properties leave
room: ties and rounding of the replicated set, the replicated nodes' home parts, the greedy
group size and range parts that do not divide evenly (each found by a surviving mutation)."""

from __future__ import annotations

import numpy as np

from gnnio.graph import CSRGraph
from gnnio.preprocess.partition.methods import (
    hdr_greedy_parts,
    hdr_replicated,
    random_parts,
    range_parts,
)


def _cycle(n: int) -> CSRGraph:
    """Every node has in-degree 1: all degrees tie."""
    src = np.arange(n)
    return CSRGraph.from_edges(src, (src + 1) % n, n)


def test_hdr_replicated_ties_go_to_lower_ids_and_the_count_rounds():
    g = _cycle(10)
    assert hdr_replicated(g, 0.2).tolist() == [0, 1]
    assert hdr_replicated(g, 0.27).tolist() == [0, 1, 2]  # round(2.7) = 3, not 2
    assert hdr_replicated(g, 0.0).size == 0


def test_replicated_nodes_get_home_parts_round_robin():
    g = _cycle(20)
    rep = np.array([3, 8, 11, 17, 19])
    parts = hdr_greedy_parts(g, 3, rep, group=2)
    assert parts[rep].tolist() == [0, 1, 2, 0, 1]


def test_greedy_default_group_gives_every_part_many_groups():
    """Default group ``ceil(N' / (16 M))`` consecutive ids: 320 nodes, 2 parts -> groups of 10."""
    g = _cycle(320)
    parts = hdr_greedy_parts(g, 2, np.zeros(0, dtype=np.int64))
    changes = np.flatnonzero(np.diff(parts)) + 1
    assert (changes % 10 == 0).all() and changes.size >= 16
    assert np.bincount(parts, minlength=2).tolist() == [160, 160]


def test_range_and_random_parts_when_nodes_do_not_divide():
    assert range_parts(10, 4).tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]
    r = random_parts(10, 4, seed=1)
    assert sorted(np.bincount(r, minlength=4).tolist()) == [1, 3, 3, 3] and r.max() == 3


def test_quality_report_by_hand():
    """Node 0 (part 0, the only training node) reads node 2's list (part 1) at hop 2."""
    from gnnio.preprocess.partition.quality import partition_quality

    g = CSRGraph.from_edges(np.array([2, 3]), np.array([0, 2]), 4)  # 2 -> 0, 3 -> 2
    parts = np.array([0, 0, 1, 1], dtype=np.int16)
    none = np.zeros(0, dtype=np.int64)
    q = partition_quality(g, parts, none, np.array([0]), fanouts=(1, 1), batch_size=4)
    # reads: hop 1 node 0; hop 2 nodes 0 and 2 -- node 2 remote
    assert q["neighbour_list_reads"] == 3 and q["remote_fraction"] == 1 / 3
    assert q["edge_cut"] == 0.5 and q["memory_increase"] == 1.0
    rep = partition_quality(g, parts, np.array([2]), np.array([0]), fanouts=(1, 1))
    assert rep["remote_fraction"] == 0.0 and rep["memory_increase"] == 1.5
    skew = partition_quality(g, np.array([0, 0, 0, 1], dtype=np.int16), none, None)
    assert skew["node_balance"] == 1.5  # max over mean


def test_bfs_block_fallback_takes_the_largest_penalty_product():
    """BGL §3.3.2 with no assigned neighbour: the part with the largest product of the two
    penalties, which the training-node term can send away from the part with fewest nodes."""
    import scipy.sparse as sp

    from gnnio.preprocess.partition.bfs_block import _assign

    sizes, train = np.array([3, 2, 2]), np.array([0, 2, 0])  # no edges between the blocks
    parts = _assign(sp.csr_matrix((3, 3), dtype=np.int64), sizes, train, 2, hops=1)
    # A -> 0; B -> 1 (part 0 fuller); C: part 1 holds all training nodes (penalty 0) -> 0
    assert parts.tolist() == [0, 1, 0]
