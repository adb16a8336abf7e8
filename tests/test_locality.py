"""Locality-aware sampler: unbiased HT weights, s = 1 is uniform, LAS sets, layer mapping, pruning,
invariants and determinism."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.stats import chi2_contingency, chisquare

from gnnio.graph.csr import CSRGraph
from gnnio.sampling import (
    LocalitySampler,
    MiniBatch,
    PrunedUniformSampler,
    UniformSampler,
    inclusion_probabilities,
    las_sets,
    prune_thresholds,
)
from gnnio.sampling import _las_kernels as K

from .helpers import random_graph, shared_neighbourhood_graph, subset_counts

# ---- helpers -------------------------------------------------------------------------------------


def one_hop(sampler, rows: int, deg: int, epoch_seed: int = 0) -> MiniBatch:
    return sampler.sample(torch.arange(deg, deg + rows), epoch_seed=epoch_seed)


def picks_and_weights(mb: MiniBatch, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``[rows, k]`` global ids picked per seed and their weights (1-hop batch, k per row)."""
    blk = mb.blocks[-1]
    g = mb.input_nodes[blk.edge_index[0]].numpy().reshape(-1, k)
    w = blk.edge_weight.double().numpy().reshape(-1, k)
    return g, w


def check_batch(mb: MiniBatch, graph: CSRGraph, seeds, fanouts, thresholds) -> None:
    """Id-space invariants, edges exist and are distinct, counts = min(window, fanout)."""
    indptr, indices = np.asarray(graph.indptr), np.asarray(graph.indices)
    seeds = np.asarray(seeds, dtype=np.int64)
    b, L = len(seeds), len(fanouts)
    inp = mb.input_nodes.numpy()
    assert np.array_equal(inp[:b], seeds)
    assert len(np.unique(inp)) == len(inp)
    hop_nodes = mb.meta["hop_nodes"]
    assert hop_nodes[0] == b and hop_nodes[-1] == len(inp) and len(mb.blocks) == L
    deg = np.diff(indptr)
    for h, fanout in enumerate(fanouts):
        blk = mb.blocks[L - 1 - h]
        assert (blk.num_dst, blk.num_src) == (hop_nodes[h], hop_nodes[h + 1])
        src, dst = blk.edge_index[0].numpy(), blk.edge_index[1].numpy()
        assert blk.edge_index.dtype == torch.int64
        assert (np.diff(dst) >= 0).all()
        n = deg[inp[: blk.num_dst]]
        if thresholds[h] > 0:
            n = np.minimum(n, thresholds[h])
        want = n if fanout < 0 else np.minimum(n, fanout)
        assert np.array_equal(np.bincount(dst, minlength=blk.num_dst), want)
        gs, gd = inp[src], inp[dst]
        n_all = graph.num_nodes
        graph_keys = np.sort(np.repeat(np.arange(n_all), deg) * n_all + indices)
        keys = np.sort(gd * n_all + gs)
        pos = np.minimum(np.searchsorted(graph_keys, keys), max(graph_keys.size - 1, 0))
        assert keys.size == 0 or (graph_keys[pos] == keys).all(), (
            "a sampled edge is not in the graph"
        )
        assert (np.diff(keys) > 0).all(), "repeated edge"
        nxt = hop_nodes[h]
        for s in src.tolist():
            if s >= nxt:
                assert s == nxt
                nxt += 1
        assert nxt == hop_nodes[h + 1]
        w = blk.edge_weight.numpy()
        assert w.dtype == np.float32 and w.shape == src.shape
        assert np.isfinite(w).all() and (w >= 1 - 1e-6).all(), "1/pi >= 1"


# ---- inclusion probabilities and the design ------------------------------------------------------


@pytest.mark.parametrize(
    "n,a,k,s",
    [(20, 5, 6, 2.0), (20, 5, 6, 8.0), (20, 1, 6, 8.0), (20, 15, 6, 8.0), (7, 3, 6, 4.0),
     (50, 2, 10, 0.5), (100, 40, 25, 3.0), (9, 4, 3, 1.0), (200, 30, 60, 8.0)],
)  # fmt: skip
def test_inclusion_probs_sum_to_fanout_and_follow_eq8(n, a, k, s):
    q_in, q_out = inclusion_probabilities(n, a, k, s)
    assert a * q_in + (n - a) * q_out == pytest.approx(min(n, k), rel=1e-12)
    assert 0 < q_in <= 1 and 0 < q_out <= 1
    c = k / (a * s + n - a)  # Eq. 8 with uniform base probabilities k / n
    if max(c * s, c) <= 1:
        assert (q_in, q_out) == pytest.approx((c * s, c), rel=1e-12)
    else:
        assert max(q_in, q_out) == 1.0  # capped class
    # the conditional Poisson law of m reaches exactly a * q_in
    pmf = np.empty(2 * k + 2)
    lo, hi, tot = K.solve_nch(a, n - a, k, q_in, q_out, pmf)
    p = pmf[: hi - lo + 1] / tot
    assert p.sum() == pytest.approx(1.0)
    assert (np.arange(lo, hi + 1) * p).sum() == pytest.approx(a * q_in, rel=1e-10, abs=1e-10)


def test_nch_at_omega_one_is_hypergeometric():
    """s = 1 targets q = k/n; the solved law of m must be the hypergeometric one."""
    from scipy.stats import hypergeom

    n, a, k = 30, 9, 7
    pmf = np.empty(2 * k + 2)
    lo, hi, tot = K.solve_nch(a, n - a, k, k / n, k / n, pmf)
    want = hypergeom(n, a, k).pmf(np.arange(lo, hi + 1))
    np.testing.assert_allclose(pmf[: hi - lo + 1] / tot, want, atol=1e-10)


# ---- unbiasedness (Eq. 1) ------------------------------------------------------------------------

ROWS, DEG, HOT, FAN = 4000, 24, 6, 5


def _features(deg: int) -> np.ndarray:
    """Neighbour features where members of B differ strongly from the rest (a biased estimator
    shows at once)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal(deg) + 1.0
    x[:HOT] += 6.0
    return x


def _estimates(sampler, x: np.ndarray) -> np.ndarray:
    """Per destination row: the HT estimate ``sum_j w_j x_j``."""
    g, w = picks_and_weights(one_hop(sampler, ROWS, DEG), FAN)
    return (w * x[g]).sum(1)


@pytest.mark.parametrize("prune", [None, (0.2, 2.0)])
@pytest.mark.parametrize("s", [1.0, 2.0, 4.0, 8.0])
def test_ht_estimate_is_unbiased(s, prune):
    """Mean over ROWS independent draws of sum_j x_j / pi_j lies within 4 standard errors of the
    exact neighbour sum, for several s (and with threshold pruning)."""
    # avg degree ~6 -> threshold 0.2*6+2*5 = 12 < 24
    g = shared_neighbourhood_graph(ROWS, DEG, extra=3 * ROWS)
    sampler = LocalitySampler(g, [FAN], hot_ids=np.arange(HOT), scale=s, seed=3, prune=prune)
    if prune is not None:
        assert 0 < sampler.thresholds[0] < DEG
    x = _features(DEG)
    est = _estimates(sampler, x)
    exact = x.sum()
    se = est.std(ddof=1) / np.sqrt(ROWS)
    assert abs(est.mean() - exact) < 4 * se, (est.mean(), exact, se)
    # the same sampler with mean weights estimates the neighbour mean
    sampler_m = LocalitySampler(
        g, [FAN], hot_ids=np.arange(HOT), scale=s, seed=3, prune=prune, weights="ht_mean"
    )
    mb = one_hop(sampler_m, ROWS, DEG)
    gm, wm = picks_and_weights(mb, FAN)
    em = (wm * x[gm]).sum(1)
    assert abs(em.mean() - x.mean()) < 4 * em.std(ddof=1) / np.sqrt(ROWS)
    if s > 1:  # the locality effect is there: B is drawn more often than uniformly
        frac_hot = (picks_and_weights(mb, FAN)[0] < HOT).mean()
        assert frac_hot > HOT / DEG * 1.2


def test_unbiasedness_test_can_fail():
    """Plain uniform weights deg/k on a skewed (s = 8) sample are biased: the same check fails."""
    g = shared_neighbourhood_graph(ROWS, DEG)
    sampler = LocalitySampler(g, [FAN], hot_ids=np.arange(HOT), scale=8.0, seed=3)
    x = _features(DEG)
    mb = one_hop(sampler, ROWS, DEG)
    gp, _ = picks_and_weights(mb, FAN)
    est = (DEG / FAN * x[gp]).sum(1)
    se = est.std(ddof=1) / np.sqrt(ROWS)
    assert abs(est.mean() - x.sum()) > 10 * se


@pytest.mark.parametrize(
    "deg,hot,s",
    [(DEG, HOT, 2.0), (DEG, HOT, 8.0), (200, 180, 2.0)],  # the last maps ranks by binary search
)
def test_realized_inclusion_frequencies_match_q(deg, hot, s):
    g = shared_neighbourhood_graph(ROWS, deg)
    members = np.random.default_rng(deg).permutation(deg)[:hot]  # interleaved with the others
    sampler = LocalitySampler(g, [FAN], hot_ids=members, scale=s, seed=11)
    mb = one_hop(sampler, ROWS, deg)
    check_batch(mb, g, np.arange(deg, deg + ROWS), [FAN], [0])
    gp, w = picks_and_weights(mb, FAN)
    q_in, q_out = inclusion_probabilities(deg, hot, FAN, s)
    q = np.where(np.isin(np.arange(deg), members), q_in, q_out)
    counts = np.bincount(gp.ravel(), minlength=deg)
    assert chisquare(counts, ROWS * q).pvalue > 1e-4
    np.testing.assert_allclose(w, 1 / q[gp], rtol=1e-6)  # weights = 1 / pi


def test_unbiased_with_long_member_lists_and_windows():
    """Rows of 200 with 150 members, pruned to windows of 100: the rank-to-position mapping takes
    the binary-search path inside wrapped windows; the estimate stays unbiased."""
    deg = 200
    # avg degree < 4 -> threshold = 20 * 5 + 1
    g = shared_neighbourhood_graph(ROWS, deg, extra=60 * ROWS)
    rng = np.random.default_rng(3)
    members = rng.permutation(deg)[:150]
    sampler = LocalitySampler(g, [FAN], hot_ids=members, scale=4.0, seed=5, prune=(0.1, 20))
    assert 100 <= sampler.thresholds[0] < deg
    x = rng.standard_normal(deg) + np.where(np.isin(np.arange(deg), members), 0.0, 8.0)
    mb = one_hop(sampler, ROWS, deg)
    check_batch(mb, g, np.arange(deg, deg + ROWS), [FAN], sampler.thresholds)
    gp, w = picks_and_weights(mb, FAN)
    assert all(_fits_circular_window(r, deg, sampler.thresholds[0]) for r in gp)
    est = (w * x[gp]).sum(1)
    assert abs(est.mean() - x.sum()) < 4 * est.std(ddof=1) / np.sqrt(ROWS)


def test_capped_member_always_taken():
    """s = 8 with a single member among 24 neighbours and k = 5: Eq. 8 gives q_in > 1, so the
    member is taken every time (q_in = 1) and the others share k - 1."""
    g = shared_neighbourhood_graph(500, DEG)
    sampler = LocalitySampler(g, [FAN], hot_ids=[0], scale=8.0, seed=1)
    gp, w = picks_and_weights(one_hop(sampler, 500, DEG), FAN)
    assert (gp == 0).any(axis=1).all()
    assert np.allclose(w[gp == 0], 1.0) and np.allclose(w[gp != 0], (DEG - 1) / (FAN - 1))


# ---- s = 1 is the uniform sampler ----------------------------------------------------------------


def test_scale_one_is_uniform_without_replacement():
    rows, deg, k = 6000, 6, 2
    g = shared_neighbourhood_graph(rows, deg)
    las = LocalitySampler(g, [k], hot_ids=[0, 1, 2], scale=1.0, seed=5)
    picks_las, w = picks_and_weights(one_hop(las, rows, deg), k)
    assert np.allclose(w, deg / k)
    c_las = subset_counts(picks_las, deg)
    assert chisquare(c_las).pvalue > 1e-4  # every k-subset equally likely
    assert chisquare(np.bincount(picks_las.ravel(), minlength=deg)).pvalue > 1e-4
    uni = UniformSampler(g, [k], seed=5)
    blk = one_hop(uni, rows, deg).blocks[-1]
    picks_uni = one_hop(uni, rows, deg).input_nodes[blk.edge_index[0]].numpy().reshape(-1, k)
    c_uni = subset_counts(picks_uni, deg)
    assert chi2_contingency(np.stack([c_las, c_uni])).pvalue > 1e-4  # same law as UniformSampler
    # ... and the test has power: s = 2 is not uniform
    las.scale = 2.0
    c2 = subset_counts(picks_and_weights(one_hop(las, rows, deg), k)[0], deg)
    assert chisquare(c2).pvalue < 1e-6


def test_no_hot_set_or_all_hot_is_plain_uniform():
    g = random_graph(300, 2500, seed=1)
    seeds = np.arange(40)
    a = LocalitySampler(g, [4, 3], hot_ids=None, scale=8.0, seed=2).sample(seeds, epoch_seed=1)
    b = LocalitySampler(g, [4, 3], hot_ids=np.arange(300), scale=8.0, seed=2)
    mb = b.sample(seeds, epoch_seed=1)  # every neighbour is in Q'_1: s has nothing to favour
    assert torch.equal(a.blocks[0].edge_index, mb.blocks[0].edge_index)
    assert torch.equal(a.blocks[0].edge_weight, mb.blocks[0].edge_weight)


# ---- LAS sets and layer mapping ------------------------------------------------------------------


def dense_las_sets(graph: CSRGraph, hot: np.ndarray, layers: int, size: int) -> list[np.ndarray]:
    n = graph.num_nodes
    indptr, indices = np.asarray(graph.indptr), np.asarray(graph.indices)
    M = np.eye(n, dtype=np.int64)  # M[v, u] = 1 for u -> v, and the paper's self-loops
    for v in range(n):
        for u in indices[indptr[v] : indptr[v + 1]]:
            M[v, u] += int(u != v)
    v = np.zeros(n, dtype=np.int64)
    v[hot] = 1
    out = [np.sort(hot)]
    for _ in range(1, layers):
        v = M @ v
        ranked = sorted(range(n), key=lambda i: (-v[i], i))
        out.append(np.sort([i for i in ranked[:size] if v[i] > 0]).astype(np.int64))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_las_sets_match_dense_reference(seed):
    g = random_graph(60, 150, seed=seed)
    hot = np.random.default_rng(seed).permutation(60)[:8]
    got = las_sets(g, hot, 4)
    want = dense_las_sets(g, hot, 4, 8)
    assert len(got) == 4
    for a, b in zip(got, want):
        assert np.array_equal(a, b)
    got5 = las_sets(g, hot, 3, size=5)
    assert [len(x) for x in got5[1:]] == [min(5, len(w)) for w in dense_las_sets(g, hot, 3, 5)[1:]]


def test_las_sets_paper_example_shape():
    """A path 0-1-2-3 (both directions), B = {3}, self-loops in A: v_2 = [0, 0, 1, 1] gives
    Q'_2 = {2, 3}; v_3 = [0, 1, 2, 2] gives Q'_3 = {2, 3}, and {1, 2, 3} with room for three."""
    src = np.array([0, 1, 1, 2, 2, 3])
    dst = np.array([1, 0, 2, 1, 3, 2])
    g = CSRGraph.from_edges(src, dst, 4)
    assert [x.tolist() for x in las_sets(g, [3], 3, size=2)] == [[3], [2, 3], [2, 3]]
    assert [x.tolist() for x in las_sets(g, [3], 3, size=3)] == [[3], [2, 3], [1, 2, 3]]


def test_hops_use_their_layer_sets_and_weights_are_one_over_pi():
    """Hop h (0-based) fills blocks[L-1-h] = layer L-h and favours Q'_{L-h}; every edge's weight
    is 1/q of its class in its destination's row, with a = |N(v) ∩ Q'_layer|."""
    g = random_graph(400, 6000, seed=4)
    hot = np.random.default_rng(4).permutation(400)[:40]
    fanouts = [6, 4, 3]
    s = 3.0
    sampler = LocalitySampler(g, fanouts, hot_ids=hot, scale=s, seed=9, q_size=50)
    qs = sampler.q_sets
    assert len(qs) == 3 and np.array_equal(qs[0], np.sort(hot)) and len(qs[1]) == 50
    mb = sampler.sample(np.arange(30), epoch_seed=2)
    indptr, indices = np.asarray(g.indptr), np.asarray(g.indices)
    inp = mb.input_nodes.numpy()
    L = len(fanouts)
    for h, fo in enumerate(fanouts):
        layer = sampler.layer_of_hop(h)
        assert layer == L - h
        blk = mb.blocks[layer - 1]
        qset = set(qs[layer - 1].tolist())
        src, dst = inp[blk.edge_index[0].numpy()], inp[blk.edge_index[1].numpy()]
        for u, v, wt in zip(src, dst, blk.edge_weight.numpy()):
            nb = indices[indptr[v] : indptr[v + 1]]
            a = sum(int(x) in qset for x in nb)
            q_in, q_out = inclusion_probabilities(len(nb), a, fo, s)
            assert wt == pytest.approx(1 / (q_in if int(u) in qset else q_out), rel=1e-6)


# ---- threshold pruning ---------------------------------------------------------------------------


def test_prune_thresholds_eq4():
    assert prune_thresholds(6.5, [10, 5, -1], (1, 1)) == [17, 12, 0]
    assert prune_thresholds(6.5, [10], (2, 0.5)) == [18]
    assert prune_thresholds(6.5, [10], None) == [0]
    with pytest.raises(ValueError, match="prune"):
        prune_thresholds(6.5, [10], (-1, 1))
    assert prune_thresholds(0.0, [0, 3], (1, 1)) == [0, 3]
    with pytest.raises(ValueError, match=">= 1"):
        prune_thresholds(6.5, [5], (0, 0))
    g = random_graph(100, 700, seed=0)  # avg degree 6.9ish (dedup): threshold = ceil(avg + fanout)
    s = PrunedUniformSampler(g, [10, 5])
    assert s.thresholds == [int(np.ceil(s.avg_degree + 10)), int(np.ceil(s.avg_degree + 5))]


def test_a_huge_prune_threshold_prunes_nothing():
    g = random_graph(100, 700, seed=0)
    assert prune_thresholds(6.5, [10], (1e30, 1)) == [2**31 - 1]  # capped (was an OverflowError)
    huge = PrunedUniformSampler(g, [10, 5], prune=(1e30, 1), seed=3)
    plain = PrunedUniformSampler(g, [10, 5], prune=None, seed=3)
    a, b = huge.sample(np.arange(8)), plain.sample(np.arange(8))
    assert torch.equal(a.input_nodes, b.input_nodes)
    for x, y in zip(a.blocks, b.blocks, strict=True):
        assert torch.equal(x.edge_index, y.edge_index)
        assert torch.equal(x.edge_weight, y.edge_weight)


def _fits_circular_window(pos: np.ndarray, d: int, theta: int) -> bool:
    p = np.sort(pos)
    gaps = np.diff(np.concatenate([p, [p[0] + d]]))  # gap after each position (circular)
    return d - gaps.max() + 1 <= theta


@pytest.mark.parametrize("hot", [None, [3, 17, 30, 44]])
def test_pruning_draws_from_a_circular_window(hot):
    rows, deg, k = 3000, 50, 5
    g = shared_neighbourhood_graph(rows, deg)
    sampler = LocalitySampler(g, [k], hot_ids=hot, scale=4.0, seed=2, prune=(0.0, 2.0))
    theta = sampler.thresholds[0]
    assert theta == 10
    gp, w = picks_and_weights(one_hop(sampler, rows, deg), k)
    assert all(_fits_circular_window(r, deg, theta) for r in gp)
    wraps = sum((r.min() < theta) and (r.max() >= deg - theta) for r in gp)
    assert wraps > 0, "windows starting near the end must wrap around"
    if hot is None:
        # uniform inside a uniformly placed circular window: marginals stay k / deg, weights deg/k
        assert chisquare(np.bincount(gp.ravel(), minlength=deg)).pvalue > 1e-4
        assert np.allclose(w, deg / k)
        # but neighbours far apart in the list are never drawn together (pruning's variance cost)
        assert not ((gp == 0).any(axis=1) & (gp == deg // 2).any(axis=1)).any()


def test_pruning_shrinks_hub_rows_only():
    g = random_graph(500, 20000, seed=6)
    seeds = np.arange(200)
    s = PrunedUniformSampler(g, [5], prune=(0.5, 1.0), seed=1)
    mb = s.sample(seeds, epoch_seed=0)
    check_batch(mb, g, seeds, [5], s.thresholds)


# ---- invariants, determinism, errors -------------------------------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(5, 80),
    m=st.integers(0, 600),
    gseed=st.integers(0, 10_000),
    fanouts=st.lists(st.integers(-1, 7), min_size=1, max_size=3),
    nhot=st.integers(0, 30),
    s=st.sampled_from([1.0, 0.5, 2.5, 8.0]),
    prune=st.sampled_from([None, (0.5, 1.0), (0.0, 1.5)]),
)
def test_hypothesis_invariants(n, m, gseed, fanouts, nhot, s, prune):
    g = random_graph(n, m, gseed)
    rng = np.random.default_rng(gseed)
    hot = rng.permutation(n)[: min(nhot, n)]
    sampler = LocalitySampler(g, fanouts, hot_ids=hot, scale=s, seed=gseed, prune=prune)
    seeds = rng.permutation(n)[: max(1, n // 3)]
    mb = sampler.sample(torch.from_numpy(seeds), epoch_seed=gseed)
    check_batch(mb, g, seeds, fanouts, sampler.thresholds)
    again = sampler.sample(torch.from_numpy(seeds), epoch_seed=gseed)
    for b1, b2 in zip(mb.blocks, again.blocks):
        assert torch.equal(b1.edge_index, b2.edge_index)
        assert torch.equal(b1.edge_weight, b2.edge_weight)


def test_determinism_threads_and_counter():
    g = random_graph(5000, 60000, seed=2)
    hot = np.arange(0, 5000, 7)
    seeds = np.random.default_rng(0).permutation(5000)[:3000]  # hops above the parallel cut-off
    kw = dict(hot_ids=hot, scale=4.0, seed=1, prune=(1, 1))
    one = LocalitySampler(g, [5, 3], num_threads=1, **kw).sample(seeds, epoch_seed=7)
    four = LocalitySampler(g, [5, 3], num_threads=4, **kw)
    many = four.sample(seeds, epoch_seed=7)
    assert torch.equal(one.input_nodes, many.input_nodes)
    for b1, b2 in zip(one.blocks, many.blocks):
        assert torch.equal(b1.edge_index, b2.edge_index)
        assert torch.equal(b1.edge_weight, b2.edge_weight)
    four.close()
    c1 = LocalitySampler(g, [5], **kw)
    c2 = LocalitySampler(g, [5], **kw)
    x1 = [c1.sample(seeds[:50]).blocks[0].edge_index for _ in range(2)]
    x2 = [c2.sample(seeds[:50]).blocks[0].edge_index for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(x1, x2))
    assert not torch.equal(x1[0], x1[1])  # successive calls differ


def test_scale_setter_weights_none_and_errors():
    g = random_graph(50, 300, seed=0)
    s = LocalitySampler(g, [3], hot_ids=[1, 2], weights="none")
    s.scale = 4
    assert s.scale == 4.0
    mb = s.sample([0, 1, 2], epoch_seed=0)
    assert mb.blocks[0].edge_weight is None and mb.meta["scale"] == 4.0
    with pytest.raises(ValueError, match="scale"):
        s.scale = 0
    with pytest.raises(ValueError, match="weights"):
        LocalitySampler(g, [3], weights="bogus")
    with pytest.raises(ValueError, match="hot_ids"):
        LocalitySampler(g, [3], hot_ids=[50])
    with pytest.raises(ValueError, match="hot_ids"):
        LocalitySampler(g, [3], hot_ids=np.ones(10, dtype=bool))
    with pytest.raises(ValueError, match="more than once"):
        s.sample([1, 1])
    with pytest.raises(ValueError, match="out of range"):
        s.sample([60])
    mask = np.zeros(50, dtype=bool)
    mask[[1, 2]] = True
    assert np.array_equal(LocalitySampler(g, [3], hot_ids=mask).q_sets[0], [1, 2])


def test_empty_seeds_and_zero_fanout():
    g = random_graph(50, 300, seed=0)
    s = LocalitySampler(g, [3, 0, -1], hot_ids=[1, 2, 3], scale=4.0, prune=(1, 1))
    assert s.thresholds[1:] == [0, 0]
    mb = s.sample(torch.empty(0, dtype=torch.int64))
    assert mb.meta["hop_nodes"] == [0, 0, 0, 0] and all(b.num_edges == 0 for b in mb.blocks)
    seeds = np.array([0, 5, 9])
    mb = s.sample(seeds, epoch_seed=1)
    check_batch(mb, g, seeds, [3, 0, -1], s.thresholds)
    assert mb.blocks[1].num_edges == 0


@pytest.mark.parametrize("model", ["sage", "gcn", "gat", "gin"])
def test_models_consume_the_weights(model):
    """Every model runs on a LAS batch; SAGE's default (Hajek) mean equals the plain mean at
    s = 1 (equal weights per row), and SAGE 'sum' with 'ht_mean' weights is the HT mean."""
    from gnnio.train.models import SAGELayer, aggregate, build_model

    g = random_graph(300, 3000, seed=8)
    seeds = np.arange(25)
    torch.manual_seed(0)
    x_all = torch.randn(300, 6)
    las = LocalitySampler(g, [4, 3], hot_ids=np.arange(0, 300, 5), scale=4.0, seed=1)
    mb = las.sample(seeds, epoch_seed=0)
    net = build_model(model, 6, 8, 3, 2, dropout=0.0).eval()
    out = net(x_all[mb.input_nodes], mb.blocks)
    assert out.shape == (25, 3) and torch.isfinite(out).all()
    if model != "sage":
        return
    las.scale = 1.0
    mb = las.sample(seeds, epoch_seed=0)
    x = x_all[mb.input_nodes]
    blk = mb.blocks[-1]
    plain = type(blk)(blk.edge_index, blk.num_src, blk.num_dst)
    torch.testing.assert_close(aggregate(x, blk, "mean"), aggregate(x, plain, "mean"))
    las_m = LocalitySampler(g, [4, 3], hot_ids=np.arange(0, 300, 5), seed=1, weights="ht_mean")
    blk_m = las_m.sample(seeds, epoch_seed=0).blocks[-1]  # same draws, weights 1/(deg pi)
    layer = SAGELayer(6, 4, edge_weight_norm="sum")
    torch.testing.assert_close(aggregate(x, blk_m, "sum"), aggregate(x, plain, "mean"))
    assert layer(x, blk_m).shape == (blk_m.num_dst, 4)


@pytest.mark.parametrize("s", [1e300, 1e308, 5e-324, 0.0, -1.0, float("nan"), float("inf")])
def test_inclusion_probabilities_refuse_a_scale_outside_the_samplers_range(s):
    """The samplers' range ``[1e-200, 1e200]``: at 1e308 Eq. 8's sums overflowed and a row of 10
    neighbours, 3 in Q', fanout 4 got ``(0, 0)`` (summing to 0, not 4), silently."""
    with pytest.raises(ValueError, match="1e-200, 1e200"):
        inclusion_probabilities(10, 3, 4, s)
    q_in, q_out = inclusion_probabilities(10, 3, 4, 1e200)  # (the edge of the range: still exact)
    assert 3 * q_in + 7 * q_out == pytest.approx(4.0) and q_in == 1.0
