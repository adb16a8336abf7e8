"""Rules of the synthetic graph generators (``gnnio prepare synthetic``: noisy R-MAT in RAM and
within a memory budget, and the DC-SBM) that a mutation pass found unguarded: a features buffer
of the wrong shape is refused; ``--homophily`` and ``--backbone-degree`` reach the generator; a
zero R-MAT quadrant and a noise above ``(a + d) / 2`` are one-line errors; a sparse graph's
backbone draws at most its target; ``homophily_measured`` is the graph's same-class share; the
rewiring share is the documented ``(h - 1/C) / (1 - 1/C)``; the bounded trim equals the in-memory
one when it reaches the protected pairs; the DC-SBM backbone never leaves a node without its pair
and its trim keeps every node connected at high mixing. Of the graph hotness scores
(:mod:`gnnio.preprocess.graph_scores`, the same pass): a negative PageRank iteration count is
refused."""

from __future__ import annotations

import numpy as np
import pytest

import gnnio
from gnnio.errors import UsageError
from gnnio.importers.synthetic import (
    DCSBM,
    generate_dcsbm_graph,
    generate_features,
    generate_graph,
)


def test_features_refuse_an_out_buffer_of_the_wrong_shape():
    """``out`` must be float32 ``[N, F]``: a buffer with rows to spare would keep garbage rows."""
    labels = np.array([0, 1, 0, 1, 1])
    for shape in ((6, 3), (5, 4)):
        with pytest.raises(ValueError, match=r"out must be float32 \[5, 3\]"):
            generate_features(labels, 3, out=np.zeros(shape, dtype=np.float32))
    out = np.zeros((5, 3), dtype=np.float32)
    assert generate_features(labels, 3, out=out) is out and np.all(out != 0)


def test_cli_passes_homophily_and_backbone_degree_to_the_generator(tmp_path):
    """``--homophily`` and ``--backbone-degree`` reach the generator (not only the defaults)."""
    from gnnio.cli.main import main

    out = tmp_path / "d"
    argv = ["prepare", "synthetic", "--num-nodes", "300", "--avg-degree", "6", "--feat-dim", "2"]
    argv += ["--num-classes", "3", "--homophily", "0.3", "--backbone-degree", "1"]
    assert main([*argv, "--out", str(out), "--quiet"]) == 0
    ds = gnnio.load(out)
    assert (ds.meta["source"]["homophily"], ds.meta["source"]["backbone_degree"]) == (0.3, 1)
    indptr, indices, _ = generate_graph(300, 6, 3, 0, homophily=0.3, backbone_degree=1)
    np.testing.assert_array_equal(ds.graph.indices, indices)


@pytest.mark.parametrize(
    "kw, needle",
    [
        # a zero quadrant is refused as such (not only through the noise bound it also breaks)
        (dict(rmat=(0.6, 0.4, 0.0, 0.0), rmat_noise=0.0), "four positive probabilities"),
        # the noise may not exceed (a + d) / 2, or a - 2 mu a / (a + d) turns negative
        (dict(rmat=(0.1, 0.4, 0.4, 0.1), rmat_noise=0.15), "rmat_noise must be in [0, 0.1]"),
    ],
)
def test_rmat_quadrants_and_noise_bounds_are_one_line_errors(kw, needle):
    with pytest.raises(UsageError) as ei:
        generate_graph(64, avg_degree=4, num_classes=2, **kw)
    assert needle in str(ei.value) and "\n" not in str(ei.value)


def test_a_sparse_graph_draws_no_more_backbone_pairs_than_its_target():
    """With fewer target pairs than ``N * backbone_degree``, the backbone draws only the target
    (a random subset of the nodes' slots), and ``meta.json`` says so."""
    from gnnio.importers._synthetic_graph import generate

    indptr, _, _, info = generate(200, 1.0, 2, 0, 0.5, (0.57, 0.19, 0.19, 0.05), 0.1, 2, False)
    assert info["target_pairs"] == info["backbone_pairs"] == info["pairs"] == 100
    assert indptr[-1] == 200


def test_measured_homophily_is_the_share_of_same_class_edges():
    """``meta.json``'s ``homophily_measured`` is the share of the graph's pairs whose ends share a
    class, as the returned graph and labels show it."""
    from gnnio.importers._synthetic_graph import generate

    indptr, indices, labels, info = generate(
        300, 4.0, 3, 1, 0.6, (0.57, 0.19, 0.19, 0.05), 0.1, 2, False
    )
    dst = np.repeat(np.arange(300), np.diff(indptr))
    assert info["homophily_measured"] == np.mean(labels[dst] == labels[indices])


def test_rewiring_share_gives_the_requested_homophily_before_the_trim():
    """The rewired share ``r = (h - 1/C) / (1 - 1/C)`` makes about ``h`` of the drawn pairs
    same-class already (the trim only corrects the rest), not ``h + (1 - h) / C``."""
    from gnnio.importers._synthetic_graph import draw_pairs

    n, h = 4000, 0.5
    keys, _, cls, _, _, _ = draw_pairs(n, 4.0, 4, 0, h, (0.57, 0.19, 0.19, 0.05), 0.1, 2, False)
    lo, hi = np.divmod(keys.keys, n)
    assert abs(np.mean(cls[lo] == cls[hi]) - h) < 0.03


def test_trim_bounded_draws_as_the_in_memory_trim_into_the_protected_pairs():
    """As tests/test_prepare_bounded.py's trim test, with a surplus so large that protected pairs
    (tier 2, same-class or not) are dropped too: the bounded codes keep their class bit."""
    from gnnio.importers import _synthetic_bounded as sb
    from gnnio.importers._synthetic_graph import _trim
    from tests.test_prepare_bounded import random_pair_keys

    n = 400
    keys, cls = random_pair_keys(n, 1500, 2)
    target = keys.size // 8
    r1, r2 = np.random.default_rng(7), np.random.default_rng(7)
    want, dropped = _trim(r1, keys.copy(), cls, n, target, target // 2)
    store = sb.BoundedKeys(keys, keys.size, 1024, cls, n)
    assert sb.trim_bounded(r2, store, cls, n, target, target // 2) == dropped
    np.testing.assert_array_equal(store.keys, want)


def test_dcsbm_backbone_gives_a_node_a_partner_even_when_every_stub_is_its_own():
    """A node whose community's stubs are all its own (a hub in a tiny community) still gets its
    backbone pair: after the redraws, the next node of the community (never a self-loop)."""
    from gnnio.importers._dcsbm import _backbone, _Sampler

    rng = np.random.default_rng(0)
    comm, starts, sizes = np.zeros(3, dtype=np.int32), np.array([0]), np.array([3])
    smp = _Sampler(rng, np.zeros(5, dtype=np.int32), comm, starts, 1)  # every stub is node 0
    keys = _backbone(rng, smp, np.array([0], dtype=np.int32), comm, starts, sizes, 0.0)
    assert keys.tolist() == [0 * 3 + 1]


@pytest.mark.parametrize("n, avg, seed", [(30, 4, 0), (100, 2, 2)])
def test_dcsbm_trim_keeps_every_node_connected_at_high_mixing(n, avg, seed):
    """With ``target >= N`` no node is isolated, even when the mixing count would have the trim
    drop a node's only pair (the trim keeps the protected pairs first)."""
    indptr, _, _, _, info = generate_dcsbm_graph(
        n, avg, 3, seed, model=DCSBM(communities=2, mixing=0.9)
    )
    assert info["isolated_nodes"] == 0 and np.all(np.diff(indptr) > 0)


def test_a_negative_pagerank_iteration_count_is_refused():
    """``iterations < 0`` is a one-line UsageError, not the initial scores returned as if run."""
    from gnnio.graph import CSRGraph
    from gnnio.preprocess.graph_scores import reverse_pagerank

    g = CSRGraph.from_edges(np.array([0, 0, 1, 2, 3]), np.array([1, 2, 2, 0, 2]), 4)
    with pytest.raises(UsageError, match="iterations: must be >= 0, got -1"):
        reverse_pagerank(g, iterations=-1, progress=False)
    assert reverse_pagerank(g, iterations=0, progress=False).tolist() == [0.25] * 4


@pytest.mark.parametrize("n, k", [(5, 3), (4, 0)])
def test_community_sizes_refuse_communities_that_cannot_fit(n, k):
    """Every community holds >= 2 nodes: more than N / 2 of them is a ValueError, not an endless
    loop (the public entries check it first; this guards the internal call). Run in a forked
    child, so the loop fails the test instead of hanging it."""
    from gnnio.importers._dcsbm import community_sizes
    from tests.helpers import in_forked_child

    def refused() -> bool:
        try:
            community_sizes(n, k, 2.5, 10.0)
        except ValueError as e:
            return "do not fit" in str(e)
        return False

    assert in_forked_child(refused, timeout=20) is True
    assert community_sizes(6, 3, 2.5, 10.0).tolist() == [2, 2, 2]
