"""Hotness scores: hand-computed examples, a dense power-iteration reference, presample counts."""

from __future__ import annotations

from fractions import Fraction as F

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gnnio.errors import DatasetError, UsageError
from gnnio.graph import CSRGraph, load
from gnnio.preprocess import hotness
from tests.helpers import write_tiny_dataset

# The hand example. Edges u -> v ("v aggregates from u"):
#   0->1, 0->2, 1->2, 2->0, 3->2
# CSR of in-neighbours: row0 = [2], row1 = [0], row2 = [0, 1, 3], row3 = [].
#   paper out-degree (how many aggregate from u): u0: {1,2} = 2, u1: {2} = 1, u2: {0} = 1, u3: {2} = 1
#   paper in-degree  (row length):                v0: 1, v1: 1, v2: 3, v3: 0
SRC = np.array([0, 0, 1, 2, 3])
DST = np.array([1, 2, 2, 0, 2])


def hand_graph() -> CSRGraph:
    return CSRGraph.from_edges(SRC, DST, 4)


def as_float(xs) -> np.ndarray:
    return np.array([float(x) for x in xs])


def test_degrees_follow_the_paper_direction():
    g = hand_graph()
    np.testing.assert_array_equal(hotness.out_degree(g), [2, 1, 1, 1])
    np.testing.assert_array_equal(hotness.degree(g), [2, 1, 1, 1])
    np.testing.assert_array_equal(hotness.in_degree(g), [1, 1, 3, 0])
    assert hotness.out_degree(g).dtype == np.float64


def test_reverse_pagerank_one_iteration_by_hand():
    # d = 1/2, N = 4, r0 = 1/4 each. r0 / indeg = [1/4, 1/4, 1/12, 0] (node 3 has indeg 0).
    # r1(u) = (1-d)/N + d * sum_{u->v} r0(v)/indeg(v) = 1/8 + 1/2 * (...)
    #   u0 -> {1, 2}: 1/4 + 1/12 = 1/3  -> 1/8 + 1/6  = 7/24
    #   u1 -> {2}:    1/12             -> 1/8 + 1/24 = 1/6
    #   u2 -> {0}:    1/4              -> 1/8 + 1/8  = 1/4
    #   u3 -> {2}:    1/12             -> 1/6
    want = as_float([F(7, 24), F(1, 6), F(1, 4), F(1, 6)])
    got = hotness.reverse_pagerank(hand_graph(), iterations=1, damping=0.5)
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_weighted_reverse_pagerank_one_iteration_by_hand():
    # train = {2}: weight = N / N_t = 4, r0 = [1/4, 1/4, 4 * 1/4, 1/4] (Algorithm 1 line 10).
    # r0 / indeg = [1/4, 1/4, 1/3, 0]; d = 1/2:
    #   u0 -> {1, 2}: 1/4 + 1/3 = 7/12 -> 1/8 + 7/24 = 5/12
    #   u1 -> {2}:    1/3             -> 1/8 + 1/6  = 7/24
    #   u2 -> {0}:    1/4             -> 1/4
    #   u3 -> {2}:    1/3             -> 7/24
    want = as_float([F(5, 12), F(7, 24), F(1, 4), F(7, 24)])
    got = hotness.weighted_reverse_pagerank(hand_graph(), np.array([2]), iterations=1, damping=0.5)
    np.testing.assert_allclose(got, want, rtol=1e-12)


def dense_rpr(src, dst, n, r0, iterations, d):
    """Dense numpy power iteration of r <- (1-d)/N + d * A (r / indeg), A[u, v] = #edges u->v."""
    a = np.zeros((n, n))
    np.add.at(a, (src, dst), 1.0)
    indeg = a.sum(axis=0)
    r = r0.astype(float)
    for _ in range(iterations):
        share = np.where(indeg > 0, r / np.maximum(indeg, 1), 0.0)
        r = (1 - d) / n + d * (a @ share)
    return r


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 30),
    m=st.integers(0, 120),
    seed=st.integers(0, 2**31),
    iters=st.integers(0, 25),
    d=st.floats(0.0, 1.0),
)
def test_reverse_pagerank_matches_dense_power_iteration(n, m, seed, iters, d):
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, m), rng.integers(0, n, m)
    g = CSRGraph.from_edges(src, dst, n)  # dedups; the reference must see the same edge set
    s, t = g.edges()
    want = dense_rpr(s, t, n, np.full(n, 1.0 / n), iters, d)
    got = hotness.reverse_pagerank(g, iterations=iters, damping=d)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-15)
    train = np.unique(rng.integers(0, n, max(1, n // 3)))
    r0 = np.full(n, 1.0 / n)
    r0[train] *= n / train.size
    want_w = dense_rpr(s, t, n, r0, iters, d)
    got_w = hotness.weighted_reverse_pagerank(g, train, iterations=iters, damping=d)
    np.testing.assert_allclose(got_w, want_w, rtol=1e-10, atol=1e-15)


def test_wrpr_with_every_node_labeled_is_rpr():
    rng = np.random.default_rng(3)
    g = CSRGraph.from_edges(rng.integers(0, 50, 300), rng.integers(0, 50, 300), 50)
    a = hotness.weighted_reverse_pagerank(g, np.arange(50), iterations=5)
    b = hotness.reverse_pagerank(g, iterations=5)
    np.testing.assert_allclose(a, b, rtol=1e-12)


def test_wrpr_weighs_a_repeated_training_node_once():
    # Algorithm 1's weight is N / |train| over distinct nodes: [2, 2] is the train set {2}
    g = hand_graph()
    once = hotness.weighted_reverse_pagerank(g, np.array([2]), iterations=1, damping=0.5)
    twice = hotness.weighted_reverse_pagerank(g, np.array([2, 2]), iterations=1, damping=0.5)
    np.testing.assert_array_equal(twice, once)


def test_reverse_pagerank_tol_stops_early_and_converges():
    rng = np.random.default_rng(4)
    g = CSRGraph.from_edges(rng.integers(0, 40, 200), rng.integers(0, 40, 200), 40)
    r_conv = hotness.reverse_pagerank(g, iterations=500, tol=1e-13)
    np.testing.assert_allclose(r_conv, hotness.reverse_pagerank(g, iterations=500), atol=1e-12)


def test_reverse_pagerank_tol_stops_after_the_first_small_change():
    # the L1 change of one update is at most 2 here: tol 10 stops after the first
    g = hand_graph()
    np.testing.assert_array_equal(
        hotness.reverse_pagerank(g, iterations=50, tol=10.0),
        hotness.reverse_pagerank(g, iterations=1),
    )


def test_sj_plain_by_hand():
    # train = {2}, L = 2, h_l = h_{l-1} + M^T h_{l-1} (M^T x)[u] = sum_{u->v} x[v]:
    #   h0 = [0, 0, 1, 0]
    #   M^T h0 = [1 (0->2), 1 (1->2), 0 (2->0), 1 (3->2)]        -> h1 = [1, 1, 1, 1]
    #   M^T h1 = paper out-degrees [2, 1, 1, 1]                   -> h2 = [3, 2, 2, 2]
    # N_t = 1, so p = h2.
    got = hotness.sj_estimate(hand_graph(), np.array([2]), num_layers=2)
    np.testing.assert_allclose(got, [3, 2, 2, 2])


def test_sj_on_song_jiang_example_graph():
    # Song & Jiang Fig. 2a, reconstructed from the paper's numbers (v2 = v1 A = [1,3,4,3,2,1] and
    # f = [4,6,6,6,5,5]): undirected edges 0-1, 1-2, 1-3, 2-3, 2-4, 2-5; every node trains; L = 2.
    # Walk counts with self-loops, (I + A)^2 1:  h1 = deg + 1 = [2, 4, 5, 3, 2, 2]
    #   h2 = h1 + A h1 = [2+4, 4+(2+5+3), 5+(4+3+2+2), 3+(4+5), 2+5, 2+5] = [6, 14, 16, 12, 7, 7]
    und = [(0, 1), (1, 2), (1, 3), (2, 3), (2, 4), (2, 5)]
    s = np.array([a for a, b in und] + [b for a, b in und])
    t = np.array([b for a, b in und] + [a for a, b in und])
    g = CSRGraph.from_edges(s, t, 6)
    got = hotness.sj_estimate(g, np.arange(6), num_layers=2)
    np.testing.assert_allclose(got * 6, [6, 14, 16, 12, 7, 7])
    # same ranking classes as the paper's distinct counts f: {1,2,3} > {4,5} > {0}
    order = np.argsort(-got, kind="stable")
    assert set(order[:3]) == {1, 2, 3} and set(order[3:5]) == {4, 5} and order[5] == 0


def test_sj_fanout_by_hand():
    # train = {2}, fanouts (1, 1): edge u -> v is taken with probability min(1, 1/indeg(v)).
    #   e0 = [0, 0, 1, 0]; take = [1, 1, 1/3, 0]
    #   e1 = M^T (e0 * take) = M^T [0, 0, 1/3, 0] = [1/3 (0->2), 1/3 (1->2), 0, 1/3 (3->2)]
    #   e2 = M^T (e1 * take) = M^T [1/3, 1/3, 0, 0] = [1/3 (0->1), 0, 1/3 (2->0), 0]
    #   sum = [2/3, 1/3, 4/3, 1/3]
    got = hotness.sj_estimate(hand_graph(), np.array([2]), fanouts=(1, 1))
    np.testing.assert_allclose(got, as_float([F(2, 3), F(1, 3), F(4, 3), F(1, 3)]), rtol=1e-12)
    # fanout -1 (all neighbours) = the unweighted walk propagation without self-loops
    all_nb = hotness.sj_estimate(hand_graph(), np.array([2]), fanouts=(-1, -1))
    # e1 = [1, 1, 0, 1]; e2 = M^T e1 = [1 (0->1), 0, 1 (2->0), 0]; sum with e0 = [2, 1, 2, 1]
    np.testing.assert_allclose(all_nb, [2, 1, 2, 1])


def test_sj_fanout_caps_the_take_probability_at_one():
    # fanouts (2, 2): take = min(1, 2 / indeg) = [1, 1, 2/3, 0] (2/1 capped at 1 on rows 0 and 1)
    #   e1 = M^T [0, 0, 2/3, 0] = [2/3, 2/3, 0, 2/3]
    #   e2 = M^T (e1 * take) = M^T [2/3, 2/3, 0, 0] = [2/3 (0->1), 0, 2/3 (2->0), 0]
    #   sum with e0 = [4/3, 2/3, 5/3, 2/3]
    got = hotness.sj_estimate(hand_graph(), np.array([2]), fanouts=(2, 2))
    np.testing.assert_allclose(got, as_float([F(4, 3), F(2, 3), F(5, 3), F(2, 3)]), rtol=1e-12)


def test_propagate_matches_dense():
    rng = np.random.default_rng(5)
    n = 60
    g = CSRGraph.from_edges(rng.integers(0, n, 400), rng.integers(0, n, 400), n)
    s, t = g.edges()
    a = np.zeros((n, n))
    a[s, t] = 1
    x = rng.standard_normal(n)
    np.testing.assert_allclose(hotness.propagate(g, x), a @ x, rtol=1e-12, atol=1e-12)


def test_presample_counts_match_direct_count():
    ordering = pytest.importorskip("gnnio.ordering", reason="gnnio.ordering not written yet")
    from gnnio.sampling import UniformSampler

    RandomOrder = ordering.RandomOrder

    rng = np.random.default_rng(6)
    n = 300
    g = CSRGraph.from_edges(rng.integers(0, n, 2000), rng.integers(0, n, 2000), n)
    train = np.sort(rng.choice(n, 90, replace=False)).astype(np.int64)
    got = hotness.presample_counts(g, train, fanouts=(3, 2), batch_size=16, epochs=2, seed=9)
    # direct count: same order, same sampler calls, counted with Python sets
    sampler = UniformSampler(g, (3, 2), seed=9)
    order = RandomOrder(train, 16, seed=9)
    want = np.zeros(n)
    for ep in range(2):
        for b, seeds in enumerate(order.batches(ep)):
            mb = sampler.sample(seeds, epoch_seed=(ep << 32) + b)
            for u in set(mb.input_nodes.tolist()):
                want[u] += 1
    np.testing.assert_array_equal(got, want)
    # every training node is a seed once per epoch, so it is counted at least `epochs` times
    assert (got[train] >= 2).all()
    assert got.sum() > 2 * train.size


def test_compute_score_registry(tmp_path):
    ds = load(write_tiny_dataset(tmp_path / "d", num_nodes=40, num_edges=160))
    names = [k for k in hotness.SCORES if k != "presample"]
    for name in names:
        s = hotness.compute_score(name, ds, fanouts=(4, 3), progress=False)
        assert s.shape == (40,) and s.dtype == np.float64 and np.isfinite(s).all(), name
    np.testing.assert_array_equal(
        hotness.compute_score("degree", ds.path, progress=False), ds.graph.out_degrees()
    )
    with pytest.raises(UsageError, match="unknown"):
        hotness.compute_score("pagerank", ds)


def test_scores_need_training_nodes():
    g = hand_graph()
    with pytest.raises(DatasetError, match="empty"):
        hotness.weighted_reverse_pagerank(g, np.array([], dtype=np.int64))
    with pytest.raises(UsageError, match="out of range"):
        hotness.sj_estimate(g, np.array([7]))
    with pytest.raises(UsageError, match="damping"):
        hotness.reverse_pagerank(g, damping=1.5)


def test_presample_refuses_zero_epochs_and_batches():
    g, train = hand_graph(), np.array([2])
    with pytest.raises(UsageError, match="epochs: must be >= 1, got 0"):
        hotness.presample_counts(g, train, fanouts=(2,), epochs=0, progress=False)
    with pytest.raises(UsageError, match="batch_size: must be >= 1, got 0"):
        hotness.presample_counts(g, train, fanouts=(2,), batch_size=0, progress=False)


def test_captured_shares_by_hand():
    from gnnio.bench.hotness import captured_shares

    counts = np.array([5.0, 0.0, 3.0, 2.0])  # 10 accesses
    score = np.array([1.0, 4.0, 3.0, 2.0])  # ranking: 1, 2, 3, 0
    # top ceil(0.25*4)=1 node: {1} -> 0/10; top 2: {1, 2} -> 3/10; top 3: {1, 2, 3} -> 5/10
    got = captured_shares(counts, score, [0.25, 0.5, 0.75, 1.0])
    assert got == {"0.25": 0.0, "0.5": 0.3, "0.75": 0.5, "1.0": 1.0}
    # the oracle ranks by the counts: 0, 2, 3, 1 -> 5/10, 8/10, 10/10
    assert captured_shares(counts, counts, [0.25, 0.5, 0.75]) == {
        "0.25": 0.5,
        "0.5": 0.8,
        "0.75": 1.0,
    }


def test_bench_hotness_reports_every_score(tmp_path):
    pytest.importorskip("gnnio.ordering", reason="gnnio.ordering not written yet")
    import argparse

    from gnnio.bench import hotness as bench

    ds_path = write_tiny_dataset(tmp_path / "d", num_nodes=400, num_edges=3000)
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    png = tmp_path / "curves.png"
    args = p.parse_args([str(ds_path), "--fanouts", "4,3", "--batch-size", "16", "--quiet"])
    args.plot = str(png)
    res = bench.run(args)
    cap = res["captured"]
    for name in ("degree", "rpr", "wrpr", "presample", "oracle"):
        assert set(cap[name]) == {"0.01", "0.05", "0.1", "0.25"}, name
        vals = [cap[name][f] for f in ("0.01", "0.05", "0.1", "0.25")]
        assert all(0 <= v <= 1 for v in vals) and vals == sorted(vals), name
        # nothing beats ranking by the measured counts themselves
        assert all(cap[name][f] <= cap["oracle"][f] + 1e-12 for f in cap[name]), name
    assert res["accesses"] > 0 and png.stat().st_size > 0
    # a hot tier ranked by any score beats a random one (share = fraction) on this skewed graph
    assert cap["wrpr"]["0.25"] > 0.25
