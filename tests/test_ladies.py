"""LADIES and locality-aware LADIES: layer probabilities against a dense reference, realised inclusion
frequencies, unbiased aggregation (each with a biased variant the test rejects), s = 1 is LADIES,
Song & Jiang's Figure 2a worked example, block invariants, determinism."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gnnio.graph.csr import CSRGraph
from gnnio.sampling import _las_kernels
from gnnio.sampling.ladies import LadiesSampler, check_layer_sizes, layer_probabilities
from gnnio.sampling.ladies_locality import LocalityLadiesSampler
from gnnio.sampling.locality import las_sets

from .helpers import random_graph
from .test_labor import check_blocks, inclusion_z

# ---- helpers -------------------------------------------------------------------------------------


def dense_layer_probs(graph: CSRGraph, rows, K: int, scale=1.0, q=()) -> dict[int, float]:
    """LADIES by the book on a dense matrix: P = D~^-1 (A + I) restricted to ``rows``; weights
    ||P[rows, j]||^2 for candidates j (neighbours not in ``rows``), members of ``q`` times
    ``scale``; pi = min(1, c p) with sum pi = K, c by bisection."""
    n = graph.num_nodes
    indptr, indices = np.asarray(graph.indptr), np.asarray(graph.indices)
    A = np.zeros((n, n))
    for v in range(n):
        for u in indices[indptr[v] : indptr[v + 1]]:
            A[v, u] += 1.0
    P = (A + np.eye(n)) / (A.sum(1, keepdims=True) + 1.0)
    rows = np.asarray(rows)
    cand = [j for j in range(n) if A[rows, j].sum() > 0 and j not in set(rows.tolist())]
    p = np.array([(P[rows, j] ** 2).sum() * (scale if j in set(q) else 1.0) for j in cand])
    target = min(K, len(cand))
    lo, hi = 0.0, 1e12
    for _ in range(200):
        c = (lo + hi) / 2
        lo, hi = (c, hi) if np.minimum(1, c * p).sum() < target else (lo, c)
    return dict(zip(cand, np.minimum(1.0, hi * p).tolist()))


def hop1_counts(sampler, seeds, batches: int, n: int) -> np.ndarray:
    """How often each node was drawn as a new node of hop 1 over independent batches."""
    counts = np.zeros(n, dtype=np.int64)
    for b in range(batches):
        mb = sampler.sample(seeds, epoch_seed=b)
        hn = mb.meta["hop_nodes"]
        counts[mb.input_nodes.numpy()[hn[0] : hn[1]]] += 1
    return counts


def figure_2a_graph() -> CSRGraph:
    """Song & Jiang's Figure 2a as reconstructed in tests/test_hotness.py (undirected edges 0-1,
    1-2, 1-3, 2-3, 2-4, 2-5), with the self-loops their A carries (v_2 = v_1 A counts them)."""
    und = [(0, 1), (1, 2), (1, 3), (2, 3), (2, 4), (2, 5)]
    s = [a for a, b in und] + [b for a, b in und] + list(range(6))
    t = [b for a, b in und] + [a for a, b in und] + list(range(6))
    return CSRGraph.from_edges(np.array(s), np.array(t), 6)


# ---- layer probabilities -------------------------------------------------------------------------


@pytest.mark.parametrize("K,scale", [(3, 1.0), (8, 1.0), (5, 4.0), (40, 1.0)])
def test_layer_probabilities_match_dense_ladies(K, scale):
    g = random_graph(40, 160, seed=3)
    rows = np.array([0, 5, 9, 17])
    q = [1, 2, 3, 20, 30]
    cand, pi = layer_probabilities(g, rows, K, scale=scale, q_ids=q if scale != 1 else None)
    want = dense_layer_probs(g, rows, K, scale, q if scale != 1 else ())
    assert sorted(cand.tolist()) == sorted(want)
    np.testing.assert_allclose(pi, [want[j] for j in cand.tolist()], rtol=1e-6)
    assert pi.sum() == pytest.approx(min(K, len(cand)))


def test_eq8_on_a_layer_keeps_the_sum_and_the_ratios():
    """Eq. 8 (multiplier reading): members' probabilities scaled by s relative to the others,
    ratios inside each class kept, the sum K unchanged."""
    g = random_graph(200, 2000, seed=1)
    rows = np.arange(10)
    cand, q = layer_probabilities(g, rows, 8)
    members = cand[::3]
    _, q_new = layer_probabilities(g, rows, 8, scale=2.0, q_ids=members)
    inq = np.isin(cand, members)
    assert q_new.max() < 1  # (no capping here)
    assert q_new.sum() == pytest.approx(q.sum()) == pytest.approx(8)
    M = q.sum() / (2.0 * q[inq].sum() + q[~inq].sum())
    np.testing.assert_allclose(q_new[inq], 2.0 * q[inq] * M, rtol=1e-9)
    np.testing.assert_allclose(q_new[~inq], q[~inq] * M, rtol=1e-9)


# ---- realised frequencies and unbiased aggregation -----------------------------------------------

BATCHES = 1200


def test_inclusion_frequencies_match_pi_and_the_test_can_fail():
    """Each candidate enters hop 1 in a fraction pi_j of independent batches. The same z-test
    rejects the LADIES reference code's draw (K distinct nodes by np.random.choice(p,
    replace=False)) held against its weights' claim K p_j, on a layer with two heavy candidates."""
    rows, K = 6, 6
    src = np.concatenate([np.tile([100, 101], rows), 200 + np.arange(rows * 8)])
    dst = np.concatenate([np.repeat(np.arange(rows), 2), np.repeat(np.arange(rows), 8)])
    g = CSRGraph.from_edges(src, dst, 200 + rows * 8)
    seeds = np.arange(rows)
    cand, pi = layer_probabilities(g, seeds, K)
    assert pi.max() == pytest.approx(0.6) and pi.min() == pytest.approx(0.1)
    counts = hop1_counts(LadiesSampler(g, [K], seed=2), seeds, BATCHES, g.num_nodes)
    z = inclusion_z(counts[cand], BATCHES, pi)
    assert np.abs(z).max() < 5 and 0.6 < (z**2).mean() < 1.5, (np.abs(z).max(), (z**2).mean())
    assert counts.sum() == pytest.approx(BATCHES * K, rel=0.05)  # E[layer size] = K
    rng = np.random.default_rng(0)
    ref = np.zeros(len(cand), dtype=np.int64)
    for _ in range(8000):
        ref[rng.choice(len(cand), K, replace=False, p=pi / pi.sum())] += 1
    assert np.abs(inclusion_z(ref, 8000, pi)).max() > 5


@pytest.mark.parametrize("weights", ["ht", "ht_mean"])
def test_aggregation_is_unbiased(weights):
    """sum_j w_j x_j over a row's block edges averages to the exact neighbour sum (mean), which is
    known exactly here, so each batch's error against it is a paired difference with mean 0.

    Power: with K = 20 of 48 candidates (pi from 0.19 to 1) and 4,000 batches, the pooled
    relative error (all 8 rows' errors over their exact sum) has z = -18.8 (``ht``) and -20.3
    (``ht_mean``) when the candidates' weights are 5 % too small (rows keep weight 1), against
    -0.3 for the true weights; ``test_aggregation_test_sees_a_5_percent_bias`` checks that on
    these very draws, and the kernel's ``1 / pi`` made ``0.95 / pi`` fails this test. False-alarm
    rate of a correct sampler under another seed (normal approximation, 4,000 batches): the pooled
    |z| < 4.5 fails with probability 7e-6, the 8 per-row |z| < 5 with 5e-6, about 1e-5 together.
    Weights dropped (the biased variant) are rejected by the same test."""
    est, plain, exact = ladies_estimates(weights)
    for e, ok in ((est, True), (plain, False)):
        z_rows, z_pooled = paired_z(e, exact)
        assert (np.abs(z_rows).max() < 5 and abs(z_pooled) < 4.5) == ok, (z_rows, z_pooled)


@pytest.mark.parametrize("weights", ["ht", "ht_mean"])
def test_aggregation_test_sees_a_5_percent_bias(weights):
    """The same draws with every candidate's weight times 0.95 (what a 5 % slip in 1 / pi does)
    fail the pooled test of ``test_aggregation_is_unbiased``."""
    est, _, exact = ladies_estimates(weights, candidate_scale=0.95)
    _, z_pooled = paired_z(est, exact)
    assert z_pooled < -10, z_pooled


BATCHES_HT = 4000


def ladies_estimates(weights: str, candidate_scale: float = 1.0):
    """``(est, plain, exact)``: per batch and seed row, the weighted and the unweighted sum of a
    LADIES hop over a random feature ``x``, and the exact neighbour sum (mean for ``ht_mean``).
    ``candidate_scale`` multiplies the weights of edges from sampled candidates (not rows)."""
    g = random_graph(150, 1500, seed=7)
    seeds = np.arange(8)
    indptr, indices = np.asarray(g.indptr), np.asarray(g.indices)
    x = np.random.default_rng(1).standard_normal(g.num_nodes) + 2.0
    exact = np.array([x[indices[indptr[s] : indptr[s + 1]]].sum() for s in seeds])
    if weights == "ht_mean":
        exact = exact / np.diff(indptr)[seeds]
    sampler = LadiesSampler(g, [20], seed=3, weights=weights)
    est, plain = [], []
    for b in range(BATCHES_HT):
        mb = sampler.sample(seeds, epoch_seed=b)
        blk = mb.blocks[-1]
        src, dst = blk.edge_index.numpy()
        nodes = mb.input_nodes.numpy()[src]
        w = blk.edge_weight.double().numpy()
        w = np.where(np.isin(nodes, seeds), w, w * candidate_scale)
        est.append(np.bincount(dst, weights=w * x[nodes], minlength=8))
        plain.append(np.bincount(dst, weights=x[nodes], minlength=8))
    return np.array(est), np.array(plain), exact


def paired_z(est: np.ndarray, exact: np.ndarray) -> tuple[np.ndarray, float]:
    """z-scores of the mean error ``est - exact``: per row (rows without variance: 0 if exact,
    else inf) and pooled (the batches' summed error over the exact sum)."""
    d = est - exact
    se = d.std(0, ddof=1) / np.sqrt(len(d))
    mean = d.mean(0)
    with np.errstate(divide="ignore", invalid="ignore"):
        z_rows = np.where(se > 0, mean / se, np.where(np.abs(mean) < 1e-9, 0.0, np.inf))
    r = d.sum(1) / exact.sum()
    return z_rows, float(r.mean() / (r.std(ddof=1) / np.sqrt(len(r))))


# ---- locality-aware LADIES -----------------------------------------------------------------------


def test_scale_one_is_ladies():
    g = random_graph(400, 5000, seed=4)
    seeds = np.arange(30)
    a = LadiesSampler(g, [20, 15], seed=9).sample(seeds, epoch_seed=3)
    las = LocalityLadiesSampler(g, [20, 15], hot_ids=np.arange(0, 400, 3), scale=1.0, seed=9)
    b = las.sample(seeds, epoch_seed=3)
    assert torch.equal(a.input_nodes, b.input_nodes)
    for x, y in zip(a.blocks, b.blocks):
        assert torch.equal(x.edge_index, y.edge_index) and torch.equal(x.edge_weight, y.edge_weight)
    las.scale = 8.0  # ... and s != 1 changes the draws, toward B in the input layer
    hot = np.zeros(400, bool)
    hot[::3] = True
    frac = [
        np.mean(hot[las.sample(seeds, epoch_seed=e).input_nodes.numpy()[30:]]) for e in range(20)
    ]
    las.scale = 1.0
    frac1 = [
        np.mean(hot[las.sample(seeds, epoch_seed=e).input_nodes.numpy()[30:]]) for e in range(20)
    ]
    assert np.mean(frac) > np.mean(frac1) + 0.1


def test_figure_2a_worked_example():
    """§4: B = {1, 2, 3, 4} (GPU-1 holds 1, 3; GPU-2 holds 2, 4), v_1 = [0, 1, 1, 1, 1, 0],
    v_2 = v_1 A = [1, 3, 4, 3, 2, 1], |Q'_l| = 3 -> Q'_2 = {2, 1, 3}. A LADIES hop from row 1 in
    layer 2 (candidates 0, 2, 3 with equal LADIES weights, K = 1) at s = 2: Eq. 8 gives
    q = (1, 2, 2) / 5, and the sampler realises it."""
    g = figure_2a_graph()
    v1 = np.array([0, 1, 1, 1, 1, 0], dtype=np.float64)
    v2 = np.empty(6)
    _las_kernels.row_sums(np.asarray(g.indptr), np.asarray(g.indices), v1, v2)
    assert v2.tolist() == [1, 3, 4, 3, 2, 1]
    q = las_sets(g, [1, 2, 3, 4], 2, size=3)
    assert [x.tolist() for x in q] == [[1, 2, 3, 4], [1, 2, 3]]
    s = LocalityLadiesSampler(g, [1, 1], hot_ids=[1, 2, 3, 4], scale=2.0, q_size=3, seed=1)
    assert [x.tolist() for x in s.q_sets] == [[1, 2, 3, 4], [1, 2, 3]]
    assert s.layer_of_hop(0) == 2  # the seeds' hop is layer 2: it favours Q'_2
    cand, pi = layer_probabilities(g, [1], 1, scale=2.0, q_ids=s.q_sets[1])
    assert dict(zip(cand.tolist(), pi.tolist())) == pytest.approx({0: 0.2, 2: 0.4, 3: 0.4})
    counts = hop1_counts(s, np.array([1]), 3000, 6)
    z = inclusion_z(counts[[0, 2, 3]], 3000, np.array([0.2, 0.4, 0.4]))
    assert np.abs(z).max() < 5
    mb = s.sample([1], epoch_seed=5)
    w = dict(zip(mb.input_nodes.numpy()[mb.blocks[-1].edge_index[0].numpy()].tolist(),
                 mb.blocks[-1].edge_weight.numpy().tolist()))  # fmt: skip
    assert w[1] == 1.0 and all(
        w[j] == pytest.approx(1 / {0: 0.2, 2: 0.4, 3: 0.4}[j]) for j in w if j != 1
    )


# ---- invariants, determinism, errors -------------------------------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(5, 80),
    m=st.integers(0, 600),
    gseed=st.integers(0, 10_000),
    sizes=st.lists(st.integers(1, 30), min_size=1, max_size=3),
    nhot=st.integers(0, 20),
    s=st.sampled_from([1.0, 0.5, 4.0]),
)
def test_hypothesis_invariants(n, m, gseed, sizes, nhot, s):
    g = random_graph(n, m, gseed)
    rng = np.random.default_rng(gseed)
    seeds = rng.permutation(n)[: max(1, n // 4)]
    hot = rng.permutation(n)[:nhot]
    sampler = LocalityLadiesSampler(g, sizes, hot_ids=hot, scale=s, seed=gseed)
    indptr, indices = np.asarray(g.indptr), np.asarray(g.indices)
    mb = sampler.sample(seeds, epoch_seed=1)
    inp = mb.input_nodes.numpy()
    hn = mb.meta["hop_nodes"]

    def want(h, dst):  # every edge from a row to the layer's nodes is in the block
        layer = set(inp[: hn[h + 1]].tolist())
        return np.array(
            [sum(int(j) in layer for j in indices[indptr[v] : indptr[v + 1]]) for v in dst]
        )

    check_blocks(mb, g, seeds, want)
    for blk in mb.blocks:
        assert (blk.edge_weight.numpy() >= 1 - 1e-6).all()  # 1 / pi
    again = sampler.sample(seeds, epoch_seed=1)
    assert torch.equal(mb.input_nodes, again.input_nodes)


def test_errors_empty_and_no_weights():
    g = random_graph(50, 300, seed=0)
    with pytest.raises(ValueError, match="layer_sizes"):
        check_layer_sizes([])
    with pytest.raises(ValueError, match="layer_sizes"):
        LadiesSampler(g, [0])
    with pytest.raises(ValueError, match="weights"):
        LadiesSampler(g, [3], weights="bogus")
    with pytest.raises(ValueError, match="scale"):
        LocalityLadiesSampler(g, [3], hot_ids=[1], scale=0)
    s = LadiesSampler(g, [4, 4], weights="none")
    assert s.fanouts == [-1, -1] and s.num_layers == 2
    mb = s.sample([0, 1, 2], epoch_seed=0)
    assert all(b.edge_weight is None for b in mb.blocks) and mb.meta["sampler"] == "ladies"
    with pytest.raises(ValueError, match="more than once"):
        s.sample([1, 1])
    assert s.sample(torch.empty(0, dtype=torch.int64)).meta["hop_nodes"] == [0, 0, 0]
    a, b = s.sample([0, 1, 2]), s.sample([0, 1, 2])  # successive calls draw afresh
    assert len(a.input_nodes) != len(b.input_nodes) or not torch.equal(a.input_nodes, b.input_nodes)


def test_models_consume_ladies_batches():
    from gnnio.train.models import build_model

    g = random_graph(300, 3000, seed=8)
    x_all = torch.randn(300, 6)
    mb = LadiesSampler(g, [40, 40], seed=1).sample(np.arange(25), epoch_seed=0)
    for model in ("sage", "gcn"):
        out = build_model(model, 6, 8, 3, 2, dropout=0.0).eval()(x_all[mb.input_nodes], mb.blocks)
        assert out.shape == (25, 3) and torch.isfinite(out).all()


def test_cli_train_and_bench_sampling_with_ladies(tmp_path, capsys):
    import json

    from gnnio.cli.main import main

    from .helpers import write_tiny_dataset

    d = write_tiny_dataset(tmp_path / "tiny", num_nodes=80, num_edges=600)
    rc = main(["bench", "sampling", str(d), "--sampler", "ladies", "--layer-size", "16",
               "--fanouts", "3,2", "--batch-size", "8", "--batches", "3", "--passes", "1",
               "--json", "--no-progress"])  # fmt: skip
    assert rc == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["sampler"] == "ladies" and out["layer_size"] == 16 and out["edges_per_s"] > 0
    assert out["input_nodes_per_batch"] > 8
    summary = tmp_path / "s.json"
    base = ["train", str(d), "--sampler", "ladies", "--layer-size", "16", "--fanouts", "3,2",
            "--epochs", "1", "--batch-size", "8", "--hidden", "8", "--quiet"]  # fmt: skip
    assert main([*base, "--summary", str(summary)]) == 0
    assert "test_acc" in json.loads(summary.read_text())
    rc = main(
        [*base, "--locality-scale", "2", "--gpu-cache-fraction", "0.2", "--summary", str(summary)]
    )
    assert rc == 0
    assert json.loads(summary.read_text())["sampling"]["sampler"] == "LocalityLadiesSampler"
    assert main([*base[:-1], "--layer-size", "0", "--quiet"]) == 2
    assert "--layer-size" in capsys.readouterr().err


def test_bench_locality_with_ladies(tmp_path, capsys):
    import json

    from gnnio.cli.main import main

    from .helpers import write_tiny_dataset

    d = write_tiny_dataset(tmp_path / "tiny", num_nodes=400, num_edges=4000, feat_dim=8)
    argv = ["bench", "locality", str(d), "--sampler", "ladies", "--layer-size", "30",
            "--scales", "1,8", "--gpu-cache-fraction", "0.1", "--fanouts", "5,3", "--score", "degree"]  # fmt: skip
    assert main([*argv, "--batch-size", "8", "--json", "--no-progress"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["sampler"] == "ladies" and out["layer_size"] == 30 and out["thresholds"] == [0, 0]
    assert out["host_bytes"]["8"] < out["host_bytes"]["1"]  # Eq. 8 moves reads to B
    assert main([*argv, "--prune", "1,1"]) == 2 and "--prune" in capsys.readouterr().err


def test_layer_size_past_int64_takes_every_candidate(tmp_path, capsys):
    """A budget of at least the candidates takes them all, however large: ``--layer-size
    99999999999999999999`` was a numba overflow traceback (the budget went to the kernel as is)."""
    from gnnio.cli.main import main

    from .helpers import write_tiny_dataset

    g = random_graph(50, 300, seed=0)
    huge = 10**20
    cand, pi = layer_probabilities(g, [0, 1, 2], huge)
    assert len(cand) > 0 and (pi == 1.0).all()
    a = LadiesSampler(g, [huge, huge], seed=4).sample([0, 1, 2], epoch_seed=0)
    b = LadiesSampler(g, [50, 50], seed=4).sample([0, 1, 2], epoch_seed=0)
    assert torch.equal(a.input_nodes, b.input_nodes)
    d = write_tiny_dataset(tmp_path / "tiny", num_nodes=40, num_edges=200)
    rc = main(["bench", "sampling", str(d), "--sampler", "ladies", "--layer-size", str(huge),
               "--fanouts", "2", "--batch-size", "8", "--batches", "2", "--passes", "1",
               "--warmup", "0", "--no-progress"])  # fmt: skip
    assert rc == 0, capsys.readouterr().err


def test_layer_probabilities_rejects_repeated_rows():
    """Rows are a set, as the sampler's seeds: a repeated row counted its ``P_ij^2`` twice and
    returned another distribution (0.22 for 0.156 here), silently."""
    g = random_graph(50, 300, seed=0)
    with pytest.raises(ValueError, match="more than once"):
        layer_probabilities(g, [0, 0, 1], 3)


@pytest.mark.parametrize("scale", [-1.0, np.nan, np.inf, 0.0, 1e308])
def test_layer_probabilities_refuse_a_scale_past_the_samplers_range(scale):
    """``scale`` is Eq. 8's, checked as the samplers check it: -1 gave negative probabilities
    (summing to -16 for a budget of 5), nan and inf sums of 221 and 112, all silently."""
    g = random_graph(60, 600, seed=1)
    with pytest.raises(ValueError, match="scale: must be a number in"):
        layer_probabilities(g, [0, 1, 2], 5, scale=scale, q_ids=np.arange(0, 60, 2))
    cand, pi = layer_probabilities(g, [0, 1, 2], 5, scale=1e200, q_ids=np.arange(0, 60, 2))
    assert len(cand) > 5 and pi.sum() == pytest.approx(5.0) and (pi >= 0).all()
