"""LABOR-0 sampler: per-edge inclusion probability min(1, k/deg), uniform k-subsets per row, unbiased
aggregation (each with a biased variant the test rejects), shared variates cut distinct nodes,
block invariants, determinism."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from gnnio.graph.csr import CSRGraph
from gnnio.sampling import LaborSampler, MiniBatch, UniformSampler
from gnnio.sampling.labor import labor_weights

from .helpers import random_graph, shared_neighbourhood_graph, subset_counts

# ---- helpers (also used by tests/test_ladies.py) -------------------------------------------------


def check_blocks(mb: MiniBatch, graph: CSRGraph, seeds, want_counts=None) -> None:
    """The contract of :mod:`gnnio.sampling.base`: seeds first, distinct input nodes, each hop's new
    nodes numbered in first-appearance order, blocks chained by the prefix rule, every edge in the
    graph, no repeated edge, finite weights >= 1 / deg. ``want_counts(h, dst_global)`` (optional)
    gives the expected in-edge count per destination of hop ``h``."""
    indptr, indices = np.asarray(graph.indptr), np.asarray(graph.indices)
    seeds = np.asarray(seeds, dtype=np.int64)
    n = graph.num_nodes
    inp = mb.input_nodes.numpy()
    assert np.array_equal(inp[: len(seeds)], seeds) and len(np.unique(inp)) == len(inp)
    hop_nodes = mb.meta["hop_nodes"]
    L = len(mb.blocks)
    assert hop_nodes[0] == len(seeds) and hop_nodes[-1] == len(inp) and len(hop_nodes) == L + 1
    graph_keys = np.repeat(np.arange(n), np.diff(indptr)) * n + indices  # sorted (dst, src)
    for h in range(L):
        blk = mb.blocks[L - 1 - h]
        assert (blk.num_dst, blk.num_src) == (hop_nodes[h], hop_nodes[h + 1])
        src, dst = blk.edge_index[0].numpy(), blk.edge_index[1].numpy()
        assert blk.edge_index.dtype == torch.int64
        assert ((src >= 0) & (src < blk.num_src)).all() and (np.diff(dst) >= 0).all()
        keys = np.sort(inp[dst] * n + inp[src])
        pos = np.minimum(np.searchsorted(graph_keys, keys), max(graph_keys.size - 1, 0))
        assert keys.size == 0 or (graph_keys[pos] == keys).all(), (
            "a sampled edge is not in the graph"
        )
        assert (np.diff(keys) > 0).all(), "repeated edge"
        nxt = hop_nodes[h]
        for s in src[src >= hop_nodes[h]].tolist():
            if s >= nxt:
                assert s == nxt, "new nodes must be numbered in order of first appearance"
                nxt += 1
        assert nxt == hop_nodes[h + 1]
        if want_counts is not None:
            got = np.bincount(dst, minlength=blk.num_dst)
            assert np.array_equal(got, want_counts(h, inp[: blk.num_dst]))
        if blk.edge_weight is not None:
            w = blk.edge_weight.numpy()
            assert w.dtype == np.float32 and w.shape == src.shape and np.isfinite(w).all()


def edge_counts(sampler, graph: CSRGraph, seeds: np.ndarray, batches: int) -> np.ndarray:
    """How often each graph edge (CSR position) was sampled for ``seeds`` (1-hop), over
    ``batches`` independent batches (``epoch_seed`` 0..)."""
    indptr = np.asarray(graph.indptr)
    n = graph.num_nodes
    graph_keys = np.repeat(np.arange(n), np.diff(indptr)) * n + np.asarray(graph.indices)
    counts = np.zeros(graph_keys.size, dtype=np.int64)
    for b in range(batches):
        mb = sampler.sample(seeds, epoch_seed=b)
        inp = mb.input_nodes.numpy()
        ei = mb.blocks[-1].edge_index.numpy()
        counts += np.bincount(
            np.searchsorted(graph_keys, inp[ei[1]] * n + inp[ei[0]]), minlength=counts.size
        )
    return counts


def inclusion_z(counts: np.ndarray, batches: int, pi: np.ndarray) -> np.ndarray:
    """Per-edge z-scores of sampled counts against Binomial(batches, pi) (edges with pi < 1)."""
    m = pi < 1
    return (counts[m] - batches * pi[m]) / np.sqrt(batches * pi[m] * (1 - pi[m]))


def overlapping_rows_graph(rows: int = 60, pool: int = 40, seed: int = 0) -> CSRGraph:
    """Rows ``pool .. pool + rows - 1`` draw 2..25 distinct in-neighbours from a shared pool of
    ``pool`` nodes: many destinations share neighbours, degrees vary."""
    rng = np.random.default_rng(seed)
    src, dst = [], []
    for i in range(rows):
        d = int(rng.integers(2, 26))
        src.append(rng.choice(pool, size=d, replace=False))
        dst.append(np.full(d, pool + i))
    return CSRGraph.from_edges(np.concatenate(src), np.concatenate(dst), pool + rows)


def edge_pi(graph: CSRGraph, fanout: int) -> np.ndarray:
    """LABOR-0 / node-wise inclusion probability min(1, k / deg(dst)) of every CSR edge."""
    deg = np.diff(np.asarray(graph.indptr))
    d = np.repeat(deg, deg).astype(np.float64)
    return np.minimum(1.0, fanout / d)


# ---- marginals ----------------------------------------------------------------------------------

K, BATCHES = 4, 1500


@pytest.mark.parametrize("design", ["fixed", "poisson"])
def test_edge_inclusion_probability_is_min_one_k_over_deg(design):
    """Every edge t -> s is sampled in a fraction min(1, k/deg(s)) of independent batches: all
    |z| < 5 and mean z^2 near 1, although the rows share their neighbours (and r_t)."""
    g = overlapping_rows_graph()
    seeds = np.arange(40, 100)
    sampler = LaborSampler(g, [K], seed=1, design=design)
    counts = edge_counts(sampler, g, seeds, BATCHES)
    pi = edge_pi(g, K)
    z = inclusion_z(counts, BATCHES, pi)
    assert np.abs(z).max() < 5 and 0.7 < (z**2).mean() < 1.4, (np.abs(z).max(), (z**2).mean())
    assert (counts[pi == 1] == BATCHES).all()


def test_inclusion_test_rejects_a_biased_labor():
    """The same z-test flags a LABOR with an off-by-one threshold r_t < k / (deg + 1)."""
    g = overlapping_rows_graph()
    indptr, indices = np.asarray(g.indptr), np.asarray(g.indices)
    rng = np.random.default_rng(0)
    counts = np.zeros(indices.size, dtype=np.int64)
    deg = np.diff(indptr)
    for _ in range(BATCHES):
        r = rng.random(g.num_nodes)  # one variate per vertex, shared by all rows
        d = np.repeat(deg, deg)
        counts += r[indices] < K / (d + 1)
    z = inclusion_z(counts, BATCHES, edge_pi(g, K))
    assert np.abs(z).max() > 5


def test_fixed_design_rows_are_uniform_k_subsets():
    """Rows with disjoint neighbourhoods (independent r_t): each row's k-subset is uniform over all
    C(deg, k), exactly as uniform sampling without replacement -- and the chi-square has power."""
    rows, deg, k = 3000, 6, 2
    src = np.arange(rows * deg)
    dst = rows * deg + np.repeat(np.arange(rows), deg)
    g = CSRGraph.from_edges(src, dst, rows * deg + rows)
    mb = LaborSampler(g, [k], seed=3).sample(np.arange(rows * deg, rows * deg + rows), epoch_seed=0)
    picks = mb.input_nodes[mb.blocks[-1].edge_index[0]].numpy().reshape(rows, k)
    local = picks - (picks.min(axis=1, keepdims=True) // deg) * deg  # 0..deg-1 per row
    counts = subset_counts(local, deg)
    assert chisquare(counts).pvalue > 1e-4
    skewed = np.where(local == 0, 1, local)  # a sampler that never keeps position 0
    assert chisquare(np.bincount(skewed.ravel(), minlength=deg)).pvalue < 1e-6


# ---- unbiased aggregation -----------------------------------------------------------------------


def _agg_estimates(mb: MiniBatch, x: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    blk = mb.blocks[-1]
    inp = mb.input_nodes.numpy()
    src, dst = blk.edge_index.numpy()
    w = blk.edge_weight.double().numpy() if weights is None else weights
    return np.bincount(dst, weights=w * x[inp[src]], minlength=blk.num_dst)


@pytest.mark.parametrize("design", ["fixed", "poisson"])
def test_aggregation_is_unbiased(design):
    """Over independent batches, sum_j w_j x_j (weights "ht") averages to the exact neighbour sum of
    every row, and "ht_mean" to the exact neighbour mean; a plain sum of the kept neighbours (the
    biased variant) misses by many standard errors."""
    g = overlapping_rows_graph(seed=2)
    seeds = np.arange(40, 100)
    rng = np.random.default_rng(5)
    x = rng.standard_normal(g.num_nodes) + 3.0
    indptr, indices = np.asarray(g.indptr), np.asarray(g.indices)
    exact = np.array([x[indices[indptr[s] : indptr[s + 1]]].sum() for s in seeds])
    deg = np.diff(indptr)[seeds]
    ht = LaborSampler(g, [K], seed=4, design=design)
    htm = LaborSampler(g, [K], seed=4, design=design, weights="ht_mean")
    est, est_m, plain = [], [], []
    for b in range(600):
        mb = ht.sample(seeds, epoch_seed=b)
        est.append(_agg_estimates(mb, x))
        est_m.append(_agg_estimates(htm.sample(seeds, epoch_seed=b), x))
        plain.append(_agg_estimates(mb, x, np.ones(mb.blocks[-1].num_edges)))
    sampled = deg > K  # (rows with deg <= k keep every neighbour: exact every time)
    for e, want in ((np.array(est), exact), (np.array(est_m), exact / deg)):
        np.testing.assert_allclose(
            e[:, ~sampled], np.broadcast_to(want[~sampled], e[:, ~sampled].shape), rtol=1e-5
        )
        se = e[:, sampled].std(axis=0, ddof=1) / np.sqrt(len(e))
        z = (e[:, sampled].mean(axis=0) - want[sampled]) / se
        assert np.abs(z).max() < 5, np.abs(z).max()
    p = np.array(plain)[:, sampled]
    z = (p.mean(axis=0) - exact[sampled]) / (p.std(axis=0, ddof=1) / np.sqrt(len(p)))
    assert np.abs(z).max() > 10


def test_labor_weights():
    np.testing.assert_allclose(labor_weights(np.array([0, 3, 10]), 5, "ht"), [1, 1, 2])
    np.testing.assert_allclose(labor_weights(np.array([0, 3, 10]), 5, "ht_mean"), [1, 1 / 3, 1 / 5])
    np.testing.assert_allclose(labor_weights(np.array([4]), -1, "ht_mean"), [0.25])
    with pytest.raises(ValueError, match="weights"):
        labor_weights(np.array([1]), 2, "bogus")


# ---- fewer distinct nodes ------------------------------------------------------------------------


def test_shared_variates_cut_distinct_nodes():
    """Rows sharing one neighbourhood keep the *same* k neighbours (fixed design): the batch needs
    rows + k input nodes where node-wise sampling needs about rows + deg."""
    rows, deg, k = 200, 30, 5
    g = shared_neighbourhood_graph(rows, deg)
    seeds = np.arange(deg, deg + rows)
    mb = LaborSampler(g, [k], seed=0).sample(seeds, epoch_seed=0)
    check_blocks(mb, g, seeds, lambda h, d: np.minimum(np.diff(np.asarray(g.indptr))[d], k))
    assert len(mb.input_nodes) == rows + k
    assert len(UniformSampler(g, [k], seed=0).sample(seeds, epoch_seed=0).input_nodes) > rows + 25
    g2 = random_graph(3000, 60000, seed=1)
    s2 = np.arange(0, 3000, 10)
    n_lab = np.mean([len(LaborSampler(g2, [10, 5]).sample(s2, epoch_seed=e).input_nodes)
                     for e in range(3)])  # fmt: skip
    n_uni = np.mean([len(UniformSampler(g2, [10, 5]).sample(s2, epoch_seed=e).input_nodes)
                     for e in range(3)])  # fmt: skip
    assert n_lab < 0.9 * n_uni


# ---- invariants, determinism, errors -------------------------------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(5, 80),
    m=st.integers(0, 600),
    gseed=st.integers(0, 10_000),
    fanouts=st.lists(st.integers(-1, 7), min_size=1, max_size=3),
    design=st.sampled_from(["fixed", "poisson"]),
    ld=st.booleans(),
)
def test_hypothesis_invariants(n, m, gseed, fanouts, design, ld):
    g = random_graph(n, m, gseed)
    rng = np.random.default_rng(gseed)
    seeds = rng.permutation(n)[: max(1, n // 3)]
    s = LaborSampler(g, fanouts, seed=gseed, design=design, layer_dependency=ld)
    deg = np.diff(np.asarray(g.indptr))

    def want(h, dst):
        return deg[dst] if fanouts[h] < 0 else np.minimum(deg[dst], fanouts[h])

    mb = s.sample(torch.from_numpy(seeds), epoch_seed=gseed)
    check_blocks(mb, g, seeds, want if design == "fixed" else None)
    for h, fo in enumerate(fanouts):
        blk = mb.blocks[len(fanouts) - 1 - h]
        d = deg[mb.input_nodes.numpy()[blk.edge_index[1].numpy()]]
        np.testing.assert_allclose(blk.edge_weight.numpy(), labor_weights(d, fo), rtol=1e-6)
    again = s.sample(torch.from_numpy(seeds), epoch_seed=gseed)
    assert all(torch.equal(a.edge_index, b.edge_index) for a, b in zip(mb.blocks, again.blocks))


def test_determinism_threads_counter_and_layer_dependency():
    g = random_graph(5000, 60000, seed=2)
    seeds = np.random.default_rng(0).permutation(5000)[:3000]  # hops above the parallel cut-off
    one = LaborSampler(g, [5, 3], num_threads=1, seed=1).sample(seeds, epoch_seed=7)
    four = LaborSampler(g, [5, 3], num_threads=4, seed=1)
    many = four.sample(seeds, epoch_seed=7)
    four.close()
    assert torch.equal(one.input_nodes, many.input_nodes)
    assert all(torch.equal(a.edge_index, b.edge_index) for a, b in zip(one.blocks, many.blocks))
    c = LaborSampler(g, [5], seed=1)
    assert not torch.equal(c.sample(seeds[:50]).input_nodes, c.sample(seeds[:50]).input_nodes)
    ld = LaborSampler(g, [5, 3], seed=1, layer_dependency=True).sample(seeds, epoch_seed=7)
    assert torch.equal(ld.blocks[-1].edge_index, one.blocks[-1].edge_index)  # hop 1 is the same
    assert not torch.equal(ld.input_nodes, one.input_nodes)


def test_errors_and_no_weights():
    g = random_graph(50, 300, seed=0)
    with pytest.raises(ValueError, match="design"):
        LaborSampler(g, [3], design="bogus")
    with pytest.raises(ValueError, match="weights"):
        LaborSampler(g, [3], weights="bogus")
    s = LaborSampler(g, [3, 2], weights="none")
    mb = s.sample([0, 1, 2], epoch_seed=0)
    assert all(b.edge_weight is None for b in mb.blocks) and mb.meta["sampler"] == "labor"
    with pytest.raises(ValueError, match="more than once"):
        s.sample([1, 1])
    assert s.sample(torch.empty(0, dtype=torch.int64)).meta["hop_nodes"] == [0, 0, 0]


def test_models_consume_labor_batches():
    from gnnio.train.models import build_model

    g = random_graph(300, 3000, seed=8)
    x_all = torch.randn(300, 6)
    mb = LaborSampler(g, [4, 3], seed=1).sample(np.arange(25), epoch_seed=0)
    for model in ("sage", "gcn"):
        out = build_model(model, 6, 8, 3, 2, dropout=0.0).eval()(x_all[mb.input_nodes], mb.blocks)
        assert out.shape == (25, 3) and torch.isfinite(out).all()


# ---- wiring: gnnio train / bench sampling --------------------------------------------------------


def test_cli_train_and_bench_sampling_with_labor(tmp_path, capsys):
    import json

    from gnnio.cli.main import main

    from .helpers import write_tiny_dataset

    d = write_tiny_dataset(tmp_path / "tiny", num_nodes=80, num_edges=600)
    argv = ["bench", "sampling", str(d), "--fanouts", "3,2", "--batch-size", "8", "--batches", "3"]
    for kind in ("uniform", "labor"):
        rc = main([*argv, "--passes", "1", "--sampler", kind, "--json", "--no-progress"])
        assert rc == 0
        out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert out["sampler"] == kind and out["edges_per_s"] > 0
        assert out["input_nodes_per_batch"] > 8 and out["feature_bytes_per_batch"] > 0
    summary = tmp_path / "s.json"
    rc = main(["train", str(d), "--sampler", "labor", "--fanouts", "3,2", "--epochs", "1",
               "--batch-size", "8", "--hidden", "8", "--summary", str(summary), "--quiet"])  # fmt: skip
    assert rc == 0 and "test_acc" in json.loads(summary.read_text())
    assert json.loads(summary.read_text())["config"]["sampler"] == "labor"
    rc = main(["train", str(d), "--sampler", "labor", "--locality-scale", "2", "--quiet"])
    assert rc == 2 and "--locality-scale" in capsys.readouterr().err
    rc = main(["train", str(d), "--sampler", "labor", "--prune-threshold", "--quiet"])
    assert rc == 2 and "--prune-threshold" in capsys.readouterr().err
