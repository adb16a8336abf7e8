"""LABOR-i (``LaborSampler(importance_sampling=i)``, :mod:`gnnio.sampling._labor_importance`):
the estimator stays unbiased, each destination's estimator has neighbour sampling's variance
(``sum_t 1/p_t = d^2/k``, the paper's target) and keeps ``sum_t p_t`` neighbours in expectation,
a hop reaches fewer distinct nodes than LABOR-0's, ``i = 0`` is LABOR-0 bit for bit, batches do
not depend on the thread count; the options' refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gnnio.cli.main import main
from gnnio.graph.csr import CSRGraph
from gnnio.sampling import LaborSampler
from gnnio.sampling import _labor_importance as LI

from .helpers import write_tiny_dataset


def power_law_graph(n: int = 400, m: int = 4000, seed: int = 0) -> CSRGraph:
    """In-neighbours drawn from a heavy-tailed popularity (a few hubs many rows share)."""
    rng = np.random.default_rng(seed)
    src = np.minimum((rng.pareto(1.1, m) * 8).astype(np.int64), n - 1)
    src = rng.permutation(n)[src]
    return CSRGraph.from_edges(src, rng.integers(0, n, m), n)


def _estimates(g: CSRGraph, seeds: np.ndarray, k: int, imp: int, trials: int, x: np.ndarray):
    """Per seed and trial: the ``ht_mean`` estimate of the neighbour mean of ``x`` and the kept
    count (one hop, fanout ``k``)."""
    s = LaborSampler(g, [k], seed=3, importance_sampling=imp, design="poisson", weights="ht_mean")
    est = np.zeros((trials, seeds.size))
    cnt = np.zeros((trials, seeds.size))
    for e in range(trials):
        mb = s.sample(seeds, epoch_seed=e)
        blk = mb.blocks[0]
        src, dst = blk.edge_index.numpy()
        vals = blk.edge_weight.numpy().astype(np.float64) * x[mb.input_nodes.numpy()[src]]
        np.add.at(est[e], dst, vals)
        np.add.at(cnt[e], dst, 1.0)
    return est, cnt


def _z(samples: np.ndarray, want: np.ndarray) -> np.ndarray:
    se = samples.std(axis=0, ddof=1) / np.sqrt(samples.shape[0])
    return (samples.mean(axis=0) - want) / np.maximum(se, 1e-12)


def _seeds_with_degree_over(g: CSRGraph, k: int, count: int) -> np.ndarray:
    deg = np.diff(np.asarray(g.indptr))
    return np.flatnonzero(deg > k)[:count].astype(np.int64)


@pytest.mark.parametrize("imp", [1, 2])
def test_ht_estimate_of_the_neighbour_mean_is_unbiased(imp):
    g = power_law_graph(seed=2)
    k = 4
    deg = np.diff(np.asarray(g.indptr))
    seeds = np.flatnonzero(deg > 0)[:80].astype(np.int64)  # (rows taken whole among them)
    x = np.random.default_rng(1).normal(size=g.num_nodes) + 3.0  # (a non-zero mean: bias shows)
    ip, ix = np.asarray(g.indptr), np.asarray(g.indices)
    exact = np.array([x[ix[ip[v] : ip[v + 1]]].mean() for v in seeds])
    est, _ = _estimates(g, seeds, k, imp, 3000, x)
    sampled = deg[seeds] > k
    np.testing.assert_allclose(
        est[:, ~sampled], np.broadcast_to(exact[~sampled], est[:, ~sampled].shape), rtol=1e-5
    )
    z = _z(est[:, sampled], exact[sampled])
    # ~75 seeds: |z| > 4.5 has odds ~5e-4 overall; the pooled z catches a bias shared by the seeds
    assert np.abs(z).max() < 4.5, z
    assert abs(z.sum() / np.sqrt(z.size)) < 4.5, z
    # the importances are not uniform here (else this would only re-test LABOR-0), and some
    # neighbours are saturated (c_s pi_t >= 1)
    cmap = np.full(g.num_nodes, -1, dtype=np.int64)
    pos, p, _keep, _c, _s = LI.hop_probabilities(ip, ix, seeds, k, imp, np.uint64(5), cmap)
    rows = np.repeat(np.arange(seeds.size), np.diff(pos))
    assert (p[sampled[rows]] == 1.0).any() and p.min() < 0.3 * p[sampled[rows]].max()


def test_one_fixed_point_step_by_hand():
    # row 0: neighbours 10..13; row 1: 10 and 14..20; k = 2. LABOR-0: c = k/d = (1/2, 1/4) (it
    # meets the variance target d/c = d^2/k). The step: pi_10 = max(1/2, 1/4), pi_11..13 = 1/2,
    # pi_14..20 = 1/4 (relative: 1, 1, 1/2); row 0 solves 4/c = 16/2: c = 1/2; row 1 solves
    # (1 + 7 * 2)/c = 64/2: c = 15/32, so p = 15/32 for node 10 there, 15/64 for the rest
    src = np.array([10, 11, 12, 13, 10, 14, 15, 16, 17, 18, 19, 20])
    dst = np.array([0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1])
    g = CSRGraph.from_edges(src, dst, 21)
    cmap = np.full(21, -1, dtype=np.int64)
    ip, ix = np.asarray(g.indptr), np.asarray(g.indices)
    pos, p, _keep, _c, steps = LI.hop_probabilities(
        ip, ix, np.array([0, 1]), 2, 1, np.uint64(1), cmap
    )
    assert steps == 1
    assert list(pos) == [0, 4, 12]
    np.testing.assert_allclose(p[:4], 0.5)
    want = np.where(ix[ip[1] : ip[2]] == 10, 15 / 32, 15 / 64)
    np.testing.assert_allclose(p[4:], want, rtol=1e-12)


def test_steps_stop_once_converged():
    # a large i is LABOR-* (iterated until a step gains under 1e-4 of the expected distinct
    # sources): it stops early, where 300 steps do, each row still at the variance target
    g = power_law_graph(seed=2)
    ip, ix = np.asarray(g.indptr), np.asarray(g.indices)
    rows = np.flatnonzero(np.diff(ip) > 0)[:80].astype(np.int64)
    cmap = np.full(g.num_nodes, -1, dtype=np.int64)
    pos, p_big, _k, _c, steps = LI.hop_probabilities(ip, ix, rows, 4, 5000, np.uint64(5), cmap)
    _pos, p_300, _k, _c, _s = LI.hop_probabilities(ip, ix, rows, 4, 300, np.uint64(5), cmap)
    _pos, p_1, _k, _c, _s = LI.hop_probabilities(ip, ix, rows, 4, 1, np.uint64(5), cmap)
    assert 1 < steps < 300
    assert np.array_equal(p_big, p_300) and not np.array_equal(p_big, p_1)
    d = np.diff(pos)
    inv = np.add.reduceat(1.0 / p_big, pos[:-1])
    np.testing.assert_allclose(inv[d > 4], d[d > 4] ** 2 / 4, rtol=1e-9)
    assert (p_big[np.repeat(d <= 4, d)] == 1.0).all()
    mb = LaborSampler(g, [4, 3], importance_sampling=10**12).sample(rows)
    assert all(1 < st < 300 for st in mb.meta["importance_steps"]), mb.meta


def test_unweighted_batches_report_their_steps_too():
    # weights="none" changes only Block.edge_weight: the same edges and meta["importance_steps"]
    g = power_law_graph(seed=4)
    seeds = np.arange(0, 300, 3, dtype=np.int64)
    a, b = (LaborSampler(g, [4, 3], seed=2, importance_sampling=3, weights=w).sample(seeds, 5)
            for w in ("ht", "none"))  # fmt: skip
    assert b.meta["importance_steps"] == a.meta["importance_steps"] != [0, 0]
    for x, y in zip(a.blocks, b.blocks, strict=True):
        assert torch.equal(x.edge_index, y.edge_index) and y.edge_weight is None


def test_a_fanout_of_zero_keeps_nothing():
    g = power_law_graph()
    seeds = np.arange(0, 400, 5, dtype=np.int64)
    for imp in (1, 3):
        mb = LaborSampler(g, [0, 3], importance_sampling=imp).sample(seeds)
        assert mb.blocks[1].edge_index.shape[1] == 0 and mb.meta["hop_nodes"][1] == seeds.size
        assert mb.blocks[0].edge_index.shape[1] > 0  # (the next hop samples the seeds' rows)


def test_solve_c_is_exact():
    rng = np.random.default_rng(0)
    saturated = 0
    for _ in range(200):
        d = int(rng.integers(2, 30))
        pi = rng.pareto(0.8, d) + 1e-3  # (heavy-tailed: several saturate)
        k = int(rng.integers(1, d))
        c = LI.solve_c(pi, np.arange(d), 0, d, k)
        target = d * d / k
        assert abs((1.0 / np.minimum(1.0, c * pi)).sum() - target) < 1e-9 * target
        saturated += c * pi.max() >= 1.0
    assert saturated > 50  # (the cases Newton's later steps are for)


@pytest.mark.parametrize("imp", [1, 2])
def test_each_seed_has_neighbour_samplings_variance(imp):
    # the paper's target: sum_t 1/p_t = d^2/k, so the HT mean's variance for unit-variance
    # neighbours, (1/d^2) sum_t (1/p_t - 1), is neighbour sampling's 1/k - 1/d; rows taken whole
    # keep every neighbour; and the kept count's mean over draws is sum_t p_t
    g = power_law_graph(seed=2)
    k = 4
    deg = np.diff(np.asarray(g.indptr))
    seeds = np.flatnonzero(deg > 0)[:80].astype(np.int64)
    ip, ix = np.asarray(g.indptr), np.asarray(g.indices)
    cmap = np.full(g.num_nodes, -1, dtype=np.int64)
    pos, p, _keep, _c, _s = LI.hop_probabilities(ip, ix, seeds, k, imp, np.uint64(5), cmap)
    assert (cmap == -1).all()
    d = deg[seeds].astype(np.float64)
    sampled = d > k
    var = (np.add.reduceat(1.0 / p, pos[:-1]) - d) / d**2
    np.testing.assert_allclose(var[sampled], 1 / k - 1 / d[sampled], rtol=1e-9)
    assert (p[np.repeat(~sampled, deg[seeds])] == 1.0).all()
    want = np.add.reduceat(p, pos[:-1])  # (every seed has a neighbour)
    assert (want[sampled] > k).any()  # (importances not uniform: more than k kept in some rows)
    _, cnt = _estimates(g, seeds, k, imp, 2000, np.zeros(g.num_nodes))
    z = _z(cnt, want)
    assert np.abs(z[sampled]).max() < 4.5, z
    assert (cnt[:, ~sampled] == d[~sampled]).all()  # taken whole


def _mean_hop_nodes(g, seeds, imp, trials=300, design="poisson"):
    s = LaborSampler(g, [5, 5], seed=7, importance_sampling=imp, design=design)
    got = np.array([s.sample(seeds, epoch_seed=e).meta["hop_nodes"] for e in range(trials)])
    return got.mean(axis=0), got.std(axis=0, ddof=1) / np.sqrt(trials)


def test_fewer_distinct_nodes_per_hop_than_labor0():
    g = power_law_graph(n=1500, m=20000, seed=4)
    seeds = np.random.default_rng(0).choice(g.num_nodes, 150, replace=False)
    m0, se0 = _mean_hop_nodes(g, seeds, 0)
    m1, se1 = _mean_hop_nodes(g, seeds, 1)
    m2, se2 = _mean_hop_nodes(g, seeds, 2)
    mf, sef = _mean_hop_nodes(g, seeds, 0, design="fixed")  # (LABOR-0's default design)
    for h in (1, 2):  # each hop, with a margin of many standard errors
        assert m1[h] < m0[h] - 6 * np.hypot(se0[h], se1[h]), (m0, m1)
        assert m1[h] < mf[h] - 6 * np.hypot(sef[h], se1[h]), (mf, m1)
        assert m2[h] < m1[h] + 3 * np.hypot(se1[h], se2[h]), (m1, m2)


def test_zero_iterations_are_labor0_bit_for_bit(monkeypatch):
    g = power_law_graph()
    seeds = np.arange(0, 400, 3, dtype=np.int64)
    for w in ("ht", "ht_mean"):
        ref = LaborSampler(g, [4, 3], seed=9, design="poisson", weights=w)
        assert LaborSampler(g, [4, 3], seed=9, importance_sampling=0, weights=w).design == "fixed"
        # LABOR-i's own path (probabilities per position, its part kernels, per-edge weights)
        # run with no fixed-point step is LABOR-0's Poisson design exactly
        orig = LI.hop_probabilities
        monkeypatch.setattr(LI, "hop_probabilities",
                            lambda ip, ix, nodes, fo, _i, rkey, cm, orig=orig: orig(
                                ip, ix, nodes, fo, 0, rkey, cm))  # fmt: skip
        zero = LaborSampler(g, [4, 3], seed=9, importance_sampling=1, weights=w)
        for e in range(4):
            a, b = ref.sample(seeds, epoch_seed=e), zero.sample(seeds, epoch_seed=e)
            assert torch.equal(a.input_nodes, b.input_nodes)
            for x, y in zip(a.blocks, b.blocks, strict=True):
                assert torch.equal(x.edge_index, y.edge_index)
                assert torch.equal(x.edge_weight, y.edge_weight)
        monkeypatch.undo()


def test_batches_depend_on_seed_not_on_threads():
    g = power_law_graph(n=6000, m=60000, seed=5)
    seeds = np.random.default_rng(1).choice(g.num_nodes, 2500, replace=False)  # (parts: >= 2048)
    runs = [LaborSampler(g, [3, 2], seed=11, num_threads=t, importance_sampling=2) for t in (1, 3)]
    for e in range(2):
        a, b = (s.sample(seeds, epoch_seed=e) for s in runs)
        assert torch.equal(a.input_nodes, b.input_nodes)
        for x, y in zip(a.blocks, b.blocks, strict=True):
            assert torch.equal(x.edge_index, y.edge_index)
            assert torch.equal(x.edge_weight, y.edge_weight)
    other = runs[0].sample(seeds, epoch_seed=1)
    assert not torch.equal(other.input_nodes, runs[0].sample(seeds, epoch_seed=0).input_nodes)
    for s in runs:
        s.close()


@pytest.mark.parametrize("kw", [{"importance_sampling": -1}, {"importance_sampling": True},
                                {"importance_sampling": 1.0},
                                {"importance_sampling": 1, "design": "fixed"}])  # fmt: skip
def test_bad_arguments_raise(kw):
    with pytest.raises(ValueError, match="importance_sampling"):
        LaborSampler(power_law_graph(), [3], **kw)


REFUSED = [
    ("train", "--sampler uniform --importance-sampling 1",
     "--importance-sampling: has no effect without --sampler labor"),
    ("train", "--sampler labor --importance-sampling -1", "--importance-sampling: must be"),
    ("bench sampling", "--sampler ladies --importance-sampling 0",
     "--importance-sampling: has no effect without --sampler labor"),
    ("bench sampling", "--sampler labor --importance-sampling -2", "--importance-sampling: must"),
]  # fmt: skip


@pytest.mark.parametrize("cmd,extra,words", REFUSED, ids=[f"{r[0]} {r[1]}" for r in REFUSED])
def test_cli_refuses_in_one_line(cmd, extra, words, tmp_path, capsys):
    d = write_tiny_dataset(tmp_path / "d")
    argv = [*cmd.split(), str(d), *extra.split(), "--quiet"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gnnio: error:") and words in err, err


def test_bench_importance_zero_is_todays_labor(tmp_path, capsys):
    import json

    d = write_tiny_dataset(tmp_path / "d", num_nodes=60, num_edges=400)
    common = ["bench", "sampling", str(d), "--sampler", "labor", "--fanouts", "3,2",
              "--batch-size", "8", "--batches", "3", "--passes", "1", "--device", "cpu", "--json",
              "--quiet"]  # fmt: skip
    out = []
    for extra in ([], ["--importance-sampling", "0"], ["--importance-sampling", "2"]):
        assert main(common + extra) == 0
        out.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    assert out[0]["checksum"] == out[1]["checksum"] != out[2]["checksum"]
    assert [o["importance_sampling"] for o in out] == [0, 0, 2]


def test_train_runs_labor_i_and_its_summary_says_where(monkeypatch, tmp_path):
    """``gnnio train --sampler labor --importance-sampling I`` end to end: the sampler gets ``I``;
    the summary has ``sampler_fallback``: None here, and why where a sampler fell back from the
    GPU (none does since LABOR-i has a GPU path; simulated)."""
    import gnnio.sampling
    from gnnio.train import TrainConfig, train

    built = []

    class Recorded(LaborSampler):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            built.append(self)

    class FellBack(LaborSampler):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.fallback = "simulated"

    d = write_tiny_dataset(tmp_path / "d", num_nodes=60, num_edges=400)
    cfg = TrainConfig(sampler="labor", importance_sampling=2, epochs=1, progress=False)
    monkeypatch.setattr(gnnio.sampling, "LaborSampler", Recorded)
    s = train(d, cfg)
    assert [b.importance_sampling for b in built] == [2] and s["sampler_fallback"] is None
    monkeypatch.setattr(gnnio.sampling, "LaborSampler", FellBack)
    assert train(d, cfg)["sampler_fallback"] == "simulated"
