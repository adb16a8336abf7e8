"""The DC-SBM synthetic model (``gnnio prepare synthetic --model dcsbm``): determinism, CSR
invariants, heavy-tailed degrees, mixing, power-law community sizes, no isolated nodes, classes
that follow communities, the CLI and one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gnnio
from gnnio.errors import UsageError
from gnnio.importers._dcsbm import community_sizes
from gnnio.importers.synthetic import (
    DCSBM,
    generate_dcsbm_graph,
    generate_features,
    generate_graph,
    prepare_synthetic,
)


def dst_of(indptr: np.ndarray) -> np.ndarray:
    return np.repeat(np.arange(indptr.size - 1), np.diff(indptr))


def check_csr(indptr, indices, n, pairs=None):
    assert indptr.dtype == np.int64 and indptr.shape == (n + 1,) and indptr[0] == 0
    assert np.all(np.diff(indptr) >= 0) and indptr[-1] == indices.size
    assert indices.dtype == np.int32
    assert indices.size == 0 or (indices.min() >= 0 and indices.max() < n)
    dst = dst_of(indptr)
    assert not np.any(dst == indices), "self-loop"
    keys = dst * n + indices.astype(np.int64)
    assert np.all(np.diff(keys) > 0), "lists must be sorted and without duplicates"
    np.testing.assert_array_equal(np.sort(indices.astype(np.int64) * n + dst), keys)  # symmetric
    if pairs is not None:
        assert indices.size == 2 * pairs


@pytest.fixture(scope="module")
def graph():
    """2^15 nodes, 16 edges per node, 64 communities, 16 classes, default mixing 0.1."""
    return generate_dcsbm_graph(1 << 15, avg_degree=16, num_classes=16, seed=0)


# --------------------------------------------------------------------------- determinism


def test_same_seed_same_graph_different_seed_different():
    m = DCSBM(communities=8)
    a = generate_dcsbm_graph(3000, 8, 4, seed=1, model=m)
    b = generate_dcsbm_graph(3000, 8, 4, seed=1, model=m)
    c = generate_dcsbm_graph(3000, 8, 4, seed=2, model=m)
    for x, y in zip(a[:4], b[:4]):
        np.testing.assert_array_equal(x, y)
    assert a[4] == b[4]
    assert not np.array_equal(a[1], c[1]) and not np.array_equal(a[3], c[3])


def test_prepare_is_byte_identical_and_graph_independent_of_features(tmp_path):
    kw = dict(num_nodes=1000, avg_degree=8, num_classes=4, model=DCSBM(8), progress=False)
    d1 = prepare_synthetic(tmp_path / "a", seed=3, feat_dim=8, **kw)
    d2 = prepare_synthetic(tmp_path / "b", seed=3, feat_dim=8, **kw)
    d3 = prepare_synthetic(tmp_path / "c", seed=3, feat_dim=4, split=(0.5, 0.2, 0.2), **kw)
    m1, m2, m3 = (json.loads((d / "meta.json").read_text())["arrays"] for d in (d1, d2, d3))
    assert {k: v["sha256"] for k, v in m1.items()} == {k: v["sha256"] for k, v in m2.items()}
    for key in ("indptr", "indices", "labels", "communities"):
        assert m1[key]["sha256"] == m3[key]["sha256"], key


# --------------------------------------------------------------------------- graph invariants


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(4, 800),
    avg=st.sampled_from([1.0, 2.0, 5.0, 16.0]),
    k=st.integers(1, 40),
    c=st.integers(2, 8),
    mu=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**32),
)
def test_csr_valid_for_any_arguments(n, avg, k, c, mu, seed):
    k, c, avg = min(k, n // 2), min(c, n), min(avg, n - 1)
    mu = 0.0 if k == 1 else mu
    indptr, indices, labels, comm, info = generate_dcsbm_graph(
        n, avg, c, seed, DCSBM(communities=k, mixing=mu)
    )
    check_csr(indptr, indices, n)
    assert indices.size <= 2 * round(n * avg / 2)
    if avg <= n / 64:  # sparse enough for sampling to reach the target exactly
        assert indices.size == 2 * round(n * avg / 2)
    assert labels.shape == (n,) and labels.min() >= 0 and labels.max() < c
    assert comm.shape == (n,) and np.bincount(comm, minlength=k).tolist() == info["community_sizes"]
    if avg >= 2:
        assert np.diff(indptr).min() >= 1, "isolated node"


def test_exact_edge_count_and_csr_at_scale(graph):
    indptr, indices, _, _, info = graph
    check_csr(indptr, indices, 1 << 15, pairs=(1 << 15) * 8)
    assert info["pairs"] == info["target_pairs"] == (1 << 15) * 8


def test_no_isolated_nodes_even_when_sparse():
    for seed in range(3):
        for avg in (2.0, 3.0, 16.0):
            indptr = generate_dcsbm_graph(5000, avg, 4, seed, DCSBM(communities=32))[0]
            assert np.diff(indptr).min() >= 1, (seed, avg)
    # below 2 edges per node there are fewer pairs than nodes: only those get a backbone pair
    indptr = generate_dcsbm_graph(5000, 1.0, 4, 0, DCSBM(communities=32))[0]
    assert 0 < np.count_nonzero(np.diff(indptr) == 0) < 5000 // 2


# --------------------------------------------------------------------------- degrees, sizes, mixing


def test_degrees_are_heavy_tailed(graph):
    indptr = graph[0]
    deg = np.sort(np.diff(indptr))[::-1]
    n = deg.size
    assert deg[: n // 100].sum() / deg.sum() > 0.08  # Erdos-Renyi at this density: ~2.5 %
    assert deg[0] > 20 * 16
    # the complementary CDF falls as a power law (slope -(exponent - 1) = -1.5, steeper at the cut)
    ks = np.unique(deg)
    ccdf = np.array([np.count_nonzero(deg >= v) / n for v in ks])
    sel = (ks >= 40) & (ks <= deg[0] / 3)
    slope = np.polyfit(np.log(ks[sel]), np.log(ccdf[sel]), 1)[0]
    assert -2.3 < slope < -1.2, slope
    # and the exponent moves it: a steeper power law has a lighter tail
    steep = np.sort(np.diff(generate_dcsbm_graph(n, 16, 16, 0, DCSBM(degree_exponent=3.5))[0]))
    assert steep[-(n // 100) :].sum() < deg[: n // 100].sum() * 0.8


def test_node_ids_carry_no_degree_or_community_order(graph):
    indptr, _, _, comm, _ = graph
    ids = np.arange(comm.size, dtype=float)
    assert abs(np.corrcoef(ids, np.diff(indptr))[0, 1]) < 0.05
    assert abs(np.corrcoef(ids, comm)[0, 1]) < 0.05


def test_community_sizes_follow_a_power_law(graph):
    n, k = 1 << 15, 64
    sizes = community_sizes(n, k, exponent=2.0, ratio=30.0)
    assert sizes.sum() == n and sizes.min() >= 2 and np.all(np.diff(sizes) <= 0)
    np.testing.assert_array_equal(np.bincount(graph[3], minlength=k), sizes)
    assert 20 < sizes[0] / sizes[-1] < 30  # the quantiles' span of the ratio-30 power law
    # Kolmogorov-Smirnov distance to the power law with density ~ s^-2 on [s_min, 30 s_min]
    s_min = sizes[-1]
    x = np.sort(sizes / s_min)
    cdf = (1 - 1 / x) / (1 - 1 / 30)
    ks = np.max(np.abs(cdf - (np.arange(k) + 0.5) / k))
    assert ks < 0.1, ks
    # a uniform size distribution over the same span is far from it
    u = np.linspace(1, 30, k)
    assert np.max(np.abs((1 - 1 / u) / (1 - 1 / 30) - (np.arange(k) + 0.5) / k)) > 0.3
    # tiny graphs: at least 2 nodes per community, sizes still sum to N
    for n, k in ((10, 5), (11, 5), (200, 64)):
        s = community_sizes(n, k, 2.0, 30.0)
        assert s.sum() == n and s.min() >= 2 and s.size == k


@pytest.mark.parametrize("mu", [0.0, 0.1, 0.3, 0.6])
def test_realized_mixing_is_mu(mu):
    n = 1 << 14
    indptr, indices, _, comm, info = generate_dcsbm_graph(
        n, 12, 8, 0, DCSBM(communities=32, mixing=mu)
    )
    dst = dst_of(indptr)
    cross = comm[dst] != comm[indices]
    assert abs(cross.mean() - mu) < 1e-3 and abs(info["mixing_measured"] - mu) < 1e-3
    deg = np.diff(indptr)
    node_mix = np.bincount(dst, weights=cross, minlength=n) / deg
    assert abs(node_mix.mean() - mu) < 0.02, node_mix.mean()
    # every community sends about mu of its edge ends outside (the x_r x_s external weights)
    ends = np.bincount(comm[dst], minlength=32)
    out = np.bincount(comm[dst], weights=cross, minlength=32)
    assert np.max(np.abs(out / ends - mu)) < 0.03 + 0.05 * mu


def test_classes_follow_communities_and_are_learnable(graph):
    indptr, indices, labels, comm, info = graph
    c = 16
    # a community's majority class covers about class_purity + (1 - purity) / C of its nodes
    hits = sum(np.bincount(labels[comm == r]).max() for r in range(64))
    assert abs(hits / labels.size - (0.8 + 0.2 / c)) < 0.02
    dst = dst_of(indptr)
    same = np.mean(labels[dst] == labels[indices])
    assert same > 0.5 and abs(same - info["homophily_measured"]) < 1e-9
    counts = np.bincount(labels, minlength=c)
    assert counts.min() > 0.5 * labels.size / c  # largest-first dealing keeps classes balanced
    # features alone are weak; one hop of neighbour means adds a lot (as for R-MAT)
    n = labels.size
    x = generate_features(labels, feat_dim=32, seed=0)
    agg = np.zeros_like(x)
    np.add.at(agg, dst, x[indices])
    agg = (agg + x) / (np.diff(indptr) + 1)[:, None]
    perm = np.random.default_rng(0).permutation(n)
    tr, te = perm[: n // 2], perm[n // 2 :]

    def acc(z):
        cent = np.stack([z[tr][labels[tr] == k].mean(0) for k in range(c)])
        return np.mean(((z[te][:, None] - cent[None]) ** 2).sum(-1).argmin(1) == labels[te])

    acc_x, acc_agg = acc(x), acc(agg)
    assert acc_x > 1 / c + 0.1 and acc_agg > acc_x + 0.15, (acc_x, acc_agg)


def test_fewer_communities_than_classes():
    labels, comm = generate_dcsbm_graph(4000, 8, 8, 0, DCSBM(communities=2, class_purity=1))[2:4]
    assert np.unique(labels).size == 8
    for r in range(2):  # each community holds 4 of the 8 classes, no class in both
        assert np.unique(labels[comm == r]).size == 4
    assert not set(labels[comm == 0]) & set(labels[comm == 1])


# --------------------------------------------------------------------------- dataset and CLI


def test_cli_checks_command_on_small_graph(tmp_path, capsys):
    from gnnio.cli.main import main

    out = tmp_path / "d"
    argv = ["prepare", "synthetic", "--model", "dcsbm", "--communities", "64", "--num-nodes"]
    argv += ["4096", "--avg-degree", "16", "--feat-dim", "64", "--num-classes", "16"]
    argv += ["--seed", "0", "--out", str(out)]
    assert main(argv) == 0
    assert "wrote" in capsys.readouterr().out
    ds = gnnio.load(out, verify=True)
    assert (ds.num_nodes, ds.num_edges, ds.feat_dim, ds.num_classes) == (4096, 65536, 64, 16)
    src = ds.meta["source"]
    assert src["model"] == "dcsbm" and src["communities"] == 64 and src["mixing"] == 0.1
    assert "homophily" not in src and "rmat" not in src
    assert abs(ds.meta["generator"]["mixing_measured"] - 0.1) < 1e-3
    g = generate_dcsbm_graph(4096, 16, 16, 0)
    np.testing.assert_array_equal(ds.graph.indices, g[1])
    np.testing.assert_array_equal(ds.extra["communities"], g[3])
    assert ds.train_idx.size == 410


def test_rmat_stays_the_default(tmp_path):
    kw = dict(num_nodes=300, avg_degree=4, feat_dim=4, num_classes=2, progress=False)
    ds = gnnio.load(prepare_synthetic(tmp_path / "r", **kw))
    assert ds.meta["source"]["model"] == "rmat" and "communities" not in ds.meta["arrays"]
    np.testing.assert_array_equal(ds.graph.indices, generate_graph(300, 4, 2, 0)[1])


@pytest.mark.parametrize(
    "kw, needle",
    [
        (dict(communities=51), "--communities"),
        (dict(communities=0), "--communities"),
        (dict(communities=2.5), "--communities"),
        (dict(mixing=1.5), "--mixing"),
        (dict(mixing=-0.1), "--mixing"),
        (dict(mixing=float("nan")), "--mixing"),
        (dict(communities=1, mixing=0.2), "--mixing"),
        (dict(degree_exponent=1.0), "--degree-exponent"),
        (dict(class_purity=2), "--class-purity"),
        (dict(size_ratio=0.5), "size_ratio"),
        (dict(size_exponent=float("inf")), "size_exponent"),
        (dict(model="sbm"), "--model"),
        (dict(model="dcsbm", num_nodes=1), "--num-nodes"),
    ],
)
def test_bad_arguments_give_one_line_usage_errors(tmp_path, kw, needle):
    args = dict(num_nodes=100, avg_degree=4, feat_dim=4, num_classes=2, progress=False)
    if "model" in kw:
        args.update(kw)
    else:
        args["model"] = DCSBM(**{"communities": 4, **kw})
    with pytest.raises(UsageError) as ei:
        prepare_synthetic(tmp_path / "x", **args)
    msg = str(ei.value)
    assert needle in msg and "\n" not in msg
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--communities", "8"], "--communities applies to --model dcsbm"),
        (["--model", "dcsbm", "--homophily", "0.5"], "--homophily applies to --model rmat"),
        (["--model", "dcsbm", "--communities", "200"], "--communities 200 is too many"),
        (["--model", "dcsbm", "--mixing", "2"], "--mixing must be in [0, 1]"),
    ],
)
def test_cli_errors_are_one_line(tmp_path, capsys, extra, needle):
    from gnnio.cli.main import main

    argv = ["prepare", "synthetic", "--num-nodes", "300", "--out", str(tmp_path / "y"), *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gnnio: error: ") and needle in err[0], err
    assert not (tmp_path / "y").exists()


def test_class_ids_carry_no_community_size_order():
    # the largest community's class is a random id per seed, not always class 0
    majority = set()
    for seed in range(6):
        _, _, labels, comms, _ = generate_dcsbm_graph(400, 8, 4, seed, DCSBM(communities=8))
        majority.add(int(np.bincount(labels[comms == 0], minlength=4).argmax()))
    assert len(majority) > 1
