"""Song & Jiang §4's sets Q'_l on the paper's own example: ``v_{l+1} = v_l A`` with the ``A`` of
Figure 2, which carries every node's self-loop (a GCN layer aggregates the node's own row too)."""

from __future__ import annotations

import numpy as np

from gnnio.graph.csr import CSRGraph
from gnnio.sampling import LocalitySampler, las_sets
from gnnio.sampling.ladies_locality import LocalityLadiesSampler

# Figure 2a as tests/test_hotness.py reconstructs it: undirected edges, no self-loops stored
UND = [(0, 1), (1, 2), (1, 3), (2, 3), (2, 4), (2, 5)]
B = [1, 2, 3, 4]  # §3.2's example placement: GPU-1 holds 1, 3; GPU-2 holds 2, 4


def figure_2a(self_loops: bool) -> CSRGraph:
    s = [a for a, b in UND] + [b for a, b in UND] + (list(range(6)) if self_loops else [])
    t = [b for a, b in UND] + [a for a, b in UND] + (list(range(6)) if self_loops else [])
    return CSRGraph.from_edges(np.array(s), np.array(t), 6)


def paper_sets(size: int, layers: int) -> list[list[int]]:
    """The paper's procedure, dense: v_1 = 1_B, v_{l+1} = v_l (A + I), the ``size`` largest."""
    a = np.eye(6)
    for u, v in UND:
        a[u, v] = a[v, u] = 1
    v = np.zeros(6)
    v[B] = 1
    out = [sorted(B)]
    for _ in range(1, layers):
        v = v @ a
        ranked = sorted(range(6), key=lambda i: (-v[i], i))
        out.append(sorted(i for i in ranked[:size] if v[i] > 0))
    return out


def test_paper_v2_and_q2_without_stored_self_loops():
    """§4's example: v_2 = v_1 A = [1, 3, 4, 3, 2, 1]. With |Q'_l| = 4 the four largest are nodes
    2, 1, 3, 4 (node 4 sits on GPU-2); counting in-neighbours only ([1, 2, 3, 2, 1, 1]) took node 0,
    which no GPU holds, instead of node 4."""
    assert paper_sets(4, 3)[1] == [1, 2, 3, 4]
    for loops in (False, True):  # a self-loop the graph already stores counts once
        g = figure_2a(loops)
        assert [q.tolist() for q in las_sets(g, B, 3, size=4)] == paper_sets(4, 3)
        assert [q.tolist() for q in las_sets(g, B, 3, size=3)] == paper_sets(3, 3)
        assert [q.tolist() for q in las_sets(g, B, 3, size=3)][1] == [1, 2, 3]  # the paper's Q'_2


def test_both_samplers_build_the_papers_sets():
    g = figure_2a(False)
    want = paper_sets(4, 2)
    assert [q.tolist() for q in LocalitySampler(g, [2, 2], hot_ids=B, q_size=4).q_sets] == want
    lad = LocalityLadiesSampler(g, [2, 2], hot_ids=B, q_size=4)
    assert [q.tolist() for q in lad.q_sets] == want
