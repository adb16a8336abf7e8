"""The synthetic importer: determinism, graph invariants, skew, homophily, splits, learnability."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gnnio
from gnnio.errors import DatasetError, UsageError
from gnnio.importers.synthetic import (
    generate_features,
    generate_graph,
    prepare_synthetic,
)


def dst_of(indptr: np.ndarray) -> np.ndarray:
    return np.repeat(np.arange(indptr.size - 1), np.diff(indptr))


def edge_keys(indptr, indices) -> np.ndarray:
    n = indptr.size - 1
    return dst_of(indptr) * n + np.asarray(indices, dtype=np.int64)


@pytest.fixture(scope="module")
def mid_graph():
    """4096 nodes, 16 edges per node, 16 classes (default skew and homophily)."""
    return generate_graph(4096, avg_degree=16, num_classes=16, seed=3)


# --------------------------------------------------------------------------- determinism


def test_same_seed_same_arrays_different_seed_different():
    a = generate_graph(3000, avg_degree=8, num_classes=8, seed=1)
    b = generate_graph(3000, avg_degree=8, num_classes=8, seed=1)
    c = generate_graph(3000, avg_degree=8, num_classes=8, seed=2)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a[1], c[1]) or not np.array_equal(a[0], c[0])
    assert not np.array_equal(a[2], c[2])


def test_prepare_is_byte_identical_for_same_seed(tmp_path):
    kw = dict(num_nodes=700, avg_degree=6, feat_dim=8, num_classes=4, progress=False)
    d1 = prepare_synthetic(tmp_path / "a", seed=5, **kw)
    d2 = prepare_synthetic(tmp_path / "b", seed=5, **kw)
    d3 = prepare_synthetic(tmp_path / "c", seed=6, **kw)
    m1, m2, m3 = (json.loads((d / "meta.json").read_text())["arrays"] for d in (d1, d2, d3))
    assert {k: v["sha256"] for k, v in m1.items()} == {k: v["sha256"] for k, v in m2.items()}
    for key in ("indices", "features", "labels", "train_idx"):
        assert m1[key]["sha256"] != m3[key]["sha256"], key


def test_graph_does_not_depend_on_features_or_split(tmp_path):
    kw = dict(num_nodes=500, avg_degree=6, num_classes=4, seed=0, progress=False)
    d1 = gnnio.load(prepare_synthetic(tmp_path / "a", feat_dim=4, **kw))
    d2 = gnnio.load(prepare_synthetic(tmp_path / "b", feat_dim=12, split=(0.5, 0.2, 0.2), **kw))
    np.testing.assert_array_equal(d1.graph.indices, d2.graph.indices)
    np.testing.assert_array_equal(d1.labels, d2.labels)
    indptr, indices, labels = generate_graph(500, 6, 4, 0)
    np.testing.assert_array_equal(d1.graph.indptr, indptr)
    np.testing.assert_array_equal(d1.graph.indices, indices)
    np.testing.assert_array_equal(d1.labels, labels)


# --------------------------------------------------------------------------- dataset contents


def test_dataset_counts_dtypes_and_meta(tmp_path):
    n, f, c = 1000, 16, 4
    ds = gnnio.load(
        prepare_synthetic(
            tmp_path / "ds", num_nodes=n, avg_degree=16, feat_dim=f, num_classes=c, progress=False
        ),
        verify=True,
    )
    assert ds.num_nodes == n
    assert ds.num_edges == 2 * round(n * 16 / 2)
    assert ds.graph.indptr.dtype == np.int64 and ds.graph.indices.dtype == np.int32
    assert ds.features.dtype == np.float32 and ds.features.shape == (n, f)
    assert ds.labels.dtype == np.int64 and ds.labels.min() >= 0
    assert ds.num_classes == c
    assert np.bincount(ds.labels, minlength=c).tolist() == [n // c] * c  # balanced
    assert ds.meta["source"]["importer"] == "synthetic"
    assert ds.meta["source"]["seed"] == 0
    assert abs(ds.meta["generator"]["homophily_measured"] - 0.75) < 0.01
    assert np.isfinite(np.asarray(ds.features)).all()


def test_splits_default_sizes_disjoint_and_seeded(tmp_path):
    n = 2000
    ds = gnnio.load(prepare_synthetic(tmp_path / "a", num_nodes=n, feat_dim=4, progress=False))
    assert (ds.train_idx.size, ds.valid_idx.size, ds.test_idx.size) == (200, 100, 200)
    allidx = np.concatenate([ds.train_idx, ds.valid_idx, ds.test_idx])
    assert np.unique(allidx).size == allidx.size
    assert allidx.min() >= 0 and allidx.max() < n
    for idx in (ds.train_idx, ds.valid_idx, ds.test_idx):
        assert idx.dtype == np.int64 and np.all(np.diff(idx) > 0)
    other = gnnio.load(
        prepare_synthetic(
            tmp_path / "b", num_nodes=n, feat_dim=4, split=(0.6, 0.2, 0.2), progress=False
        )
    )
    sizes = (other.train_idx.size, other.valid_idx.size, other.test_idx.size)
    assert sizes == (1200, 400, 400)
    assert np.unique(np.concatenate([other.train_idx, other.valid_idx, other.test_idx])).size == n


def test_features_follow_centroids_and_noise():
    labels = np.arange(20000) % 8
    x = generate_features(labels, feat_dim=32, seed=0, feature_noise=0.5)
    assert x.dtype == np.float32 and x.shape == (20000, 32)
    means = np.stack([x[labels == k].mean(0) for k in range(8)])
    dist = np.linalg.norm(means[:, None] - means[None], axis=-1)[~np.eye(8, dtype=bool)]
    assert np.allclose(dist, 2.0, atol=0.1)  # orthogonal centroids at distance 2
    resid = x - means[labels]
    assert abs(resid.std() - 0.5) < 0.01
    out = np.zeros_like(x)
    generate_features(labels, feat_dim=32, seed=0, feature_noise=0.5, out=out)
    np.testing.assert_array_equal(out, x)


# --------------------------------------------------------------------------- graph invariants


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(2, 600),
    avg=st.sampled_from([1.0, 2.0, 5.0, 16.0]),
    c=st.integers(2, 8),
    seed=st.integers(0, 2**32),
    h=st.floats(0.0, 1.0),
)
def test_graph_invariants(n, avg, c, seed, h):
    c = min(c, n)
    avg = min(avg, n - 1)
    indptr, indices, labels = generate_graph(n, avg, c, seed, homophily=h)
    assert indptr.dtype == np.int64 and indptr.shape == (n + 1,) and indptr[0] == 0
    assert np.all(np.diff(indptr) >= 0) and indptr[-1] == indices.size
    assert indices.dtype == np.int32 and (indices.size == 0 or (indices.min() >= 0))
    assert indices.size == 0 or indices.max() < n
    assert labels.shape == (n,) and labels.min() >= 0 and labels.max() < c
    dst = dst_of(indptr)
    assert not np.any(dst == indices), "self-loop"
    keys = edge_keys(indptr, indices)
    assert np.all(np.diff(keys) > 0), "neighbour lists must be sorted and without duplicates"
    rev = np.sort(np.asarray(indices, dtype=np.int64) * n + dst)
    np.testing.assert_array_equal(rev, keys)  # symmetric
    assert indices.size <= 2 * round(n * avg / 2)
    if avg <= (n - 1) / 8:  # sparse enough for sampling to reach the target exactly
        assert indices.size == 2 * round(n * avg / 2)


def test_non_power_of_two_and_tiny_sizes():
    indptr, indices, labels = generate_graph(2, avg_degree=1, num_classes=2, seed=0)
    assert indptr.tolist() == [0, 1, 2] and indices.tolist() == [1, 0]
    assert sorted(labels.tolist()) == [0, 1]
    indptr, indices, _ = generate_graph(3001, avg_degree=10, num_classes=7, seed=0)
    assert indices.size == 2 * round(3001 * 10 / 2)


def test_few_isolated_nodes_and_power_law_skew(mid_graph):
    indptr, indices, _ = mid_graph
    n = indptr.size - 1
    deg = np.diff(indptr)
    assert np.count_nonzero(deg == 0) <= n // 1000  # only a node whose backbone pairs all collapse
    assert np.count_nonzero(deg <= 1) / n < 0.05  # the 2-pair backbone
    top = np.sort(deg)[::-1][: n // 100]
    assert top.sum() / indices.size > 0.10  # an Erdos-Renyi graph of this density gives ~2.5 %
    assert deg.max() > 20 * 16
    # plain noisy R-MAT (no backbone) leaves many nodes isolated: the backbone is what fixes it
    plain = np.diff(generate_graph(n, 16, 16, 3, backbone_degree=0)[0])
    assert np.count_nonzero(plain == 0) / n > 0.05


def test_node_ids_carry_no_degree_order(mid_graph):
    indptr = mid_graph[0]
    deg = np.diff(indptr).astype(float)
    ids = np.arange(deg.size, dtype=float)
    assert abs(np.corrcoef(ids, deg)[0, 1]) < 0.1


@pytest.mark.parametrize("h", [0.05, 0.4, 0.8])
def test_homophily_as_requested(h):
    indptr, indices, labels = generate_graph(
        4096, avg_degree=12, num_classes=8, seed=0, homophily=h
    )
    same = np.mean(labels[dst_of(indptr)] == labels[indices])
    assert abs(same - h) < 0.02, same


# --------------------------------------------------------------------------- learnability


def nearest_centroid_accuracy(x, labels, train, test, c):
    cent = np.stack([x[train][labels[train] == k].mean(0) for k in range(c)])
    d = ((x[test][:, None, :] - cent[None]) ** 2).sum(-1)
    return float(np.mean(d.argmin(1) == labels[test]))


def test_neighbours_add_information_beyond_features(mid_graph):
    """1-hop mean aggregation (self + neighbours) + nearest centroid clearly beats features alone,
    and features alone clearly beat chance."""
    indptr, indices, labels = mid_graph
    n, c = indptr.size - 1, 16
    x = generate_features(labels, feat_dim=64, seed=0)
    deg = np.diff(indptr)
    agg = np.zeros_like(x)
    np.add.at(agg, dst_of(indptr), x[indices])
    agg = (agg + x) / (deg + 1)[:, None]
    perm = np.random.default_rng(0).permutation(n)
    train, test = perm[: n // 2], perm[n // 2 :]
    acc_x = nearest_centroid_accuracy(x, labels, train, test, c)
    acc_agg = nearest_centroid_accuracy(agg, labels, train, test, c)
    assert acc_x > 1 / c + 0.1, acc_x
    assert acc_agg > acc_x + 0.2, (acc_x, acc_agg)


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "kw, needle",
    [
        (dict(num_nodes=1), "--num-nodes"),
        (dict(num_nodes=2**31), "--num-nodes"),
        (dict(num_nodes=10.5), "--num-nodes"),
        (dict(num_classes=1), "--num-classes"),
        (dict(num_nodes=10, num_classes=11), "--num-classes"),
        (dict(avg_degree=0), "--avg-degree"),
        (dict(num_nodes=10, avg_degree=10), "--avg-degree"),
        (dict(feat_dim=0), "--feat-dim"),
        (dict(seed=-1), "--seed"),
        (dict(homophily=1.5), "--homophily"),
        (dict(feature_noise=-1), "--feature-noise"),
        (dict(split=(0.6, 0.3, 0.2)), "--split"),
        (dict(split=(0.6, 0.3)), "--split"),
        (dict(backbone_degree=-1), "--backbone-degree"),
        (dict(rmat=(0.5, 0.5, 0.0, 0.0)), "rmat"),
        (dict(rmat_noise=0.5), "rmat_noise"),
    ],
)
def test_bad_arguments_give_one_line_usage_errors(tmp_path, kw, needle):
    args = dict(num_nodes=100, avg_degree=4, feat_dim=4, num_classes=2, progress=False)
    args.update(kw)
    with pytest.raises(UsageError) as ei:
        prepare_synthetic(tmp_path / "x", **args)
    msg = str(ei.value)
    assert needle in msg and "\n" not in msg
    assert not (tmp_path / "x").exists()


def test_existing_output_needs_overwrite(tmp_path):
    kw = dict(num_nodes=100, avg_degree=4, feat_dim=4, num_classes=2, progress=False)
    out = prepare_synthetic(tmp_path / "d", **kw)
    with pytest.raises(DatasetError, match="already exists"):
        prepare_synthetic(out, **kw)
    prepare_synthetic(out, overwrite=True, seed=1, **kw)
    assert gnnio.load(out).meta["source"]["seed"] == 1


def test_cli_prepare_synthetic(tmp_path, capsys):
    from gnnio.cli.main import main

    out = tmp_path / "cli"
    argv = ["prepare", "synthetic", "--num-nodes", "512", "--avg-degree", "8", "--feat-dim", "8"]
    argv += ["--num-classes", "4", "--seed", "0", "--out", str(out), "--quiet"]
    assert main(argv) == 0
    ds = gnnio.load(out)
    assert (ds.num_nodes, ds.num_edges, ds.feat_dim, ds.num_classes) == (512, 4096, 8, 4)
    np.testing.assert_array_equal(ds.graph.indices, generate_graph(512, 8, 4, 0)[1])
    assert main(["prepare", "synthetic", "--num-nodes", "1", "--out", str(tmp_path / "y")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [err[0]] and err[0].startswith("gnnio: error: --num-nodes")


def test_splits_at_tiny_sizes_take_the_rounding_excess_from_train():
    from gnnio.importers.synthetic import _splits

    # round(0.5 * 3) = 2 twice is one node too many: train gives it up, valid keeps its 2
    tr, va, te = _splits(3, (0.5, 0.5, 0.0), seed=0)
    assert (tr.size, va.size, te.size) == (1, 2, 0)
    assert np.union1d(tr, va).tolist() == [0, 1, 2]


@pytest.mark.parametrize("f,c", [(8, 3), (5, 5)])
def test_centroids_are_the_qr_basis_with_a_positive_diagonal(f, c):
    # the unique orthonormal basis of the draw, whatever sign convention LAPACK's QR uses:
    # centroid c . g[:, c] = sqrt(2) * R[c, c] > 0
    from gnnio.importers.synthetic import _centroids

    g = np.random.default_rng(4).standard_normal((f, c))
    cent = _centroids(np.random.default_rng(4), c, f)
    np.testing.assert_allclose(cent @ cent.T, 2 * np.eye(c), atol=1e-12)
    assert (np.einsum("cf,fc->c", cent, g) > 0).all()
