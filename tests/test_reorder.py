"""Reordering: Algorithm 2 relabel round-trips, whole-dataset reorder, sampling equivalence, CLI."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gnnio.cli import reorder as cli_reorder
from gnnio.errors import DatasetError, UsageError
from gnnio.graph import CSRGraph, DatasetWriter, load
from gnnio.preprocess import reorder
from gnnio.sampling import UniformSampler
from tests.helpers import write_tiny_dataset


@st.composite
def graph_and_perm(draw):
    n = draw(st.integers(1, 40))
    m = draw(st.integers(0, 200))
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    dedup = draw(st.booleans())
    g = CSRGraph.from_edges(rng.integers(0, n, m), rng.integers(0, n, m), n, dedup=dedup)
    return g, rng.permutation(n)


def edge_multiset(src, dst):
    return sorted(zip(np.asarray(src).tolist(), np.asarray(dst).tolist()))


@settings(max_examples=60, deadline=None)
@given(graph_and_perm())
def test_relabel_round_trip(gp):
    g, new2old = gp
    outs = {
        impl: reorder.relabel_csr(g.indptr, g.indices, new2old, impl=impl) for impl in reorder.IMPLS
    }
    ip2, ix2 = outs["numba"]
    for impl in ("numpy", "reference"):  # all implementations agree exactly
        np.testing.assert_array_equal(outs[impl][0], ip2)
        np.testing.assert_array_equal(outs[impl][1], ix2)
    n = g.num_nodes
    assert ip2.dtype == np.int64 and ip2[0] == 0 and ip2[-1] == g.num_edges
    assert (np.diff(ip2) >= 0).all() and ix2.dtype == g.indices.dtype
    # mapping the new edges back through new2old gives the original edge multiset
    h = CSRGraph(ip2, ix2)
    s2, d2 = h.edges()
    s, d = g.edges()
    assert edge_multiset(new2old[s2], new2old[d2]) == edge_multiset(s, d)
    # new row i is old row new2old[i] (same length, same order, ids mapped)
    old2new = reorder.invert_permutation(new2old)
    for i in range(n):
        o = new2old[i]
        np.testing.assert_array_equal(
            ix2[ip2[i] : ip2[i + 1]], old2new[g.indices[g.indptr[o] : g.indptr[o + 1]]]
        )
    # relabelling back with the inverse permutation restores the original CSR exactly
    ip3, ix3 = reorder.relabel_csr(ip2, ix2, old2new)
    np.testing.assert_array_equal(ip3, g.indptr)
    np.testing.assert_array_equal(ix3, g.indices)


def test_order_by_score_matches_paper_example():
    # Data Tiering §3.2: scores [0.1, 0.4, 0.2, 0.3] sort to [0.4, 0.3, 0.2, 0.1] and the mapping
    # (old -> new, the paper's srt_idx used as a lookup) is [3, 0, 2, 1].
    new2old = reorder.order_by_score(np.array([0.1, 0.4, 0.2, 0.3]))
    np.testing.assert_array_equal(new2old, [1, 3, 2, 0])
    np.testing.assert_array_equal(reorder.invert_permutation(new2old), [3, 0, 2, 1])
    # ties keep ascending id order
    np.testing.assert_array_equal(
        reorder.order_by_score(np.array([1.0, 2.0, 1.0, 2.0])), [1, 3, 0, 2]
    )
    with pytest.raises(UsageError, match="non-finite"):
        reorder.order_by_score(np.array([1.0, np.nan]))


def test_order_by_score_breaks_many_ties_by_ascending_id():
    # past the small sizes where any sort happens to be stable: 3 distinct scores over 5000 nodes
    s = np.random.default_rng(0).integers(0, 3, 5000).astype(np.float64)
    want = np.lexsort((np.arange(s.size), -s))  # by descending score, then ascending id
    np.testing.assert_array_equal(reorder.order_by_score(s), want)


def test_bad_permutations_are_rejected():
    g = CSRGraph.from_edges(np.array([0, 1]), np.array([1, 2]), 3)
    with pytest.raises(UsageError, match="not a permutation"):
        reorder.relabel_csr(g.indptr, g.indices, np.array([0, 0, 1]))
    with pytest.raises(UsageError, match="out of range"):
        reorder.relabel_csr(g.indptr, g.indices, np.array([0, 1, 3]))
    with pytest.raises(UsageError, match="length"):
        reorder.relabel_csr(g.indptr, g.indices, np.array([0, 1]))
    with pytest.raises(UsageError, match="impl"):
        reorder.relabel_csr(g.indptr, g.indices, np.array([0, 1, 2]), impl="gpu")


def test_relabel_numba_balances_skewed_rows():
    # one huge row first (what reordering by degree produces) plus many small rows
    rng = np.random.default_rng(1)
    n = 5000
    src = np.concatenate([rng.integers(0, n, 20000), rng.integers(0, n, 5000)])
    dst = np.concatenate([np.zeros(20000, dtype=np.int64), rng.integers(0, n, 5000)])
    g = CSRGraph.from_edges(src, dst, n, dedup=False)
    perm = reorder.order_by_score(g.in_degrees().astype(float))
    a = reorder.relabel_csr(g.indptr, g.indices, perm, impl="numba")
    b = reorder.relabel_csr(g.indptr, g.indices, perm, impl="reference")
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


def test_reorder_dataset_moves_node_data_with_the_nodes(tmp_path):
    src = write_tiny_dataset(tmp_path / "a", num_nodes=30, num_edges=120, feat_dim=5)
    ds = load(src)
    rng = np.random.default_rng(2)
    new2old = rng.permutation(30)
    out = reorder.reorder_dataset(ds, new2old, tmp_path / "b", progress=False, reordered_by="test")
    r = load(out, verify=True)
    np.testing.assert_array_equal(r.features, np.asarray(ds.features)[new2old])
    np.testing.assert_array_equal(r.labels, np.asarray(ds.labels)[new2old])
    for key in ("train_idx", "valid_idx", "test_idx"):
        old = getattr(ds, key)
        new = getattr(r, key)
        assert (np.diff(new) > 0).all()
        assert set(new2old[new].tolist()) == set(old.tolist())
        # a node's label follows it into its split
        np.testing.assert_array_equal(np.sort(r.labels[new]), np.sort(ds.labels[old]))
    np.testing.assert_array_equal(r.extra["new2old"], new2old)
    np.testing.assert_array_equal(r.extra["old2new"][new2old], np.arange(30))
    assert r.extra["new2old"].dtype == np.int64 and r.extra["old2new"].dtype == np.int64
    assert r.meta["reordered_by"] == "test" and r.meta["num_classes"] == ds.meta["num_classes"]
    s2, d2 = r.graph.edges()
    s, d = ds.graph.edges()
    assert edge_multiset(new2old[s2], new2old[d2]) == edge_multiset(s, d)
    # reordering again composes the id maps back to the original ids
    second = rng.permutation(30)
    out2 = reorder.reorder_dataset(r, second, tmp_path / "c", progress=False)
    r2 = load(out2)
    np.testing.assert_array_equal(r2.extra["new2old"], new2old[second])
    np.testing.assert_array_equal(r2.features, np.asarray(ds.features)[r2.extra["new2old"]])


def test_reorder_dataset_keeps_per_node_extras_and_drops_others(tmp_path):
    rng = np.random.default_rng(3)
    n = 10
    g = CSRGraph.from_edges(rng.integers(0, n, 30), rng.integers(0, n, 30), n)
    with DatasetWriter(tmp_path / "a", name="x") as w:
        w.save_array("indptr", g.indptr)
        w.save_array("indices", g.indices)
        w.save_array("features", rng.standard_normal((n, 3)).astype(np.float32))
        w.save_array("part", np.arange(n, dtype=np.int64) % 3)
        w.save_array("boundary", np.array([4], dtype=np.int64))
    ds = load(tmp_path / "a")
    perm = rng.permutation(n)
    with pytest.warns(UserWarning, match="boundary"):
        reorder.reorder_dataset(ds, perm, tmp_path / "b", progress=False)
    r = load(tmp_path / "b")
    np.testing.assert_array_equal(r.extra["part"], (np.arange(n) % 3)[perm])
    assert "boundary" not in r.extra and r.labels is None and r.train_idx is None


def test_sampling_the_reordered_graph_gives_the_same_neighbourhoods(tmp_path):
    # Full-neighbourhood sampling (fanout -1) is deterministic, so the sampled edge set of the
    # reordered graph around old2new[seeds], mapped back through new2old, must equal the original's.
    src = write_tiny_dataset(tmp_path / "a", num_nodes=60, num_edges=240)
    ds = load(src)
    r = load(reorder.reorder_path(src, "degree", out=tmp_path / "b", progress=False)["out"])
    new2old, old2new = r.extra["new2old"], r.extra["old2new"]
    seeds_old = np.array([3, 17, 42, 5], dtype=np.int64)

    def global_edges(mb):
        nodes = mb.input_nodes.numpy()
        out = set()
        for b in mb.blocks:
            s, d = b.edge_index.numpy()
            out |= set(zip(nodes[s].tolist(), nodes[d].tolist()))
        return out

    a = UniformSampler(ds.graph, (-1, -1), seed=0).sample(seeds_old)
    b = UniformSampler(r.graph, (-1, -1), seed=0).sample(old2new[seeds_old])
    assert set(new2old[b.input_nodes.numpy()].tolist()) == set(a.input_nodes.tolist())
    assert {(int(new2old[u]), int(new2old[v])) for u, v in global_edges(b)} == global_edges(a)
    # and the hottest node (highest paper out-degree) now has id 0, degrees non-increasing
    assert (np.diff(r.graph.out_degrees()) <= 0).all()


def test_reorder_keeps_nonfinite_features_the_source_accepted(tmp_path):
    feats = np.ones((3, 2), np.float32)
    feats[1, 0] = np.nan  # accepted at prepare time with --allow-nonfinite
    with DatasetWriter(tmp_path / "d", name="d", allow_nonfinite=True) as w:
        w.save_array("indptr", np.array([0, 0, 1, 1], np.int64))
        w.save_array("indices", np.array([0], np.int32))
        w.save_array("features", feats)
    ds = load(tmp_path / "d")
    out = reorder.reorder_dataset(ds, np.array([1, 0, 2]), tmp_path / "r", progress=False)
    r = load(out)
    assert r.meta["nonfinite_features"] == 1 and np.isnan(r.features[0, 0])


def test_reorder_in_place(tmp_path):
    src = write_tiny_dataset(tmp_path / "a", num_nodes=25, num_edges=100)
    before = load(src)
    feats = np.array(before.features)
    res = reorder.reorder_in_place(src, "wrpr", progress=False)
    after = load(src, verify=True)
    assert res["out"] == str(src) and after.meta["reordered_by"] == "wrpr"
    np.testing.assert_array_equal(after.features, feats[after.extra["new2old"]])


def run_cli(argv):
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    cli_reorder.register(sub)
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_reorder(tmp_path, capsys):
    src = write_tiny_dataset(tmp_path / "a", num_nodes=30, num_edges=100)
    rc = run_cli(
        [
            "reorder",
            str(src),
            "--by",
            "rpr",
            "--out",
            str(tmp_path / "b"),
            "--json",
            "--quiet",
            "--iterations",
            "7",
        ]
    )
    assert rc == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["by"] == "rpr" and summary["num_nodes"] == 30
    assert load(tmp_path / "b").meta["reordered_by"] == "rpr"
    with pytest.raises(DatasetError, match="already exists"):
        run_cli(["reorder", str(src), "--by", "degree", "--out", str(tmp_path / "b"), "--quiet"])
    # --out DIR itself is an existing directory too: no silent in-place rewrite
    with pytest.raises(DatasetError, match="already exists"):
        run_cli(["reorder", str(src), "--by", "degree", "--out", str(src), "--quiet"])
    assert "reordered_by" not in load(src).meta
    with pytest.raises(UsageError, match="iterations"):
        run_cli(
            [
                "reorder",
                str(src),
                "--by",
                "degree",
                "--out",
                str(tmp_path / "c"),
                "--iterations",
                "3",
                "--quiet",
            ]
        )


def test_bench_reorder_runs_every_impl():
    from gnnio.bench import reorder as bench

    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    args = p.parse_args(["--num-nodes", "2000", "--avg-degree", "8", "--passes", "1"])
    res = bench.run(args)
    assert set(res["results"]) == set(reorder.IMPLS)
    assert all(r["edges_per_s"] > 0 for r in res["results"].values())
    assert res["num_edges"] > 0 and set(res["speedup_vs_reference"]) == {"numba", "numpy"}
