"""Hotness-score rules the mutation pass found unguarded: the registry's documented defaults
(Data Tiering's 5 wrpr iterations, 20 for rpr, L = len(fanouts)), the train-id and fanout checks,
the strict early-stop test, duplicate training ids, and the chunked degree pass's page drops."""

from __future__ import annotations

import numpy as np
import pytest

from gnnio.errors import UsageError
from gnnio.graph import CSRGraph, load
from gnnio.preprocess import hotness
from tests.helpers import write_tiny_dataset

# the hand graph of tests/test_hotness.py: edges 0->1, 0->2, 1->2, 2->0, 3->2
SRC = np.array([0, 0, 1, 2, 3])
DST = np.array([1, 2, 2, 0, 2])


def hand_graph() -> CSRGraph:
    return CSRGraph.from_edges(SRC, DST, 4)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return load(write_tiny_dataset(tmp_path_factory.mktemp("d") / "d", 40, 160, seed=5))


def dense(ds) -> np.ndarray:
    """``A[u, v]`` = 1 for each edge ``u -> v`` (the graph is deduplicated)."""
    n = ds.graph.num_nodes
    s, t = ds.graph.edges()
    a = np.zeros((n, n))
    a[np.asarray(s), np.asarray(t)] = 1.0
    return a


def dense_rpr(a: np.ndarray, r: np.ndarray, iterations: int, d: float) -> np.ndarray:
    indeg = a.sum(axis=0)
    for _ in range(iterations):
        r = (1 - d) / a.shape[0] + d * (a @ np.where(indeg > 0, r / np.maximum(indeg, 1), 0.0))
    return r


def test_registry_runs_rpr_20_and_wrpr_5_iterations(tiny):
    """``compute_score`` runs rpr for 20 updates and wrpr for Data Tiering's 5, damping 0.85."""
    a, n = dense(tiny), tiny.num_nodes
    want = dense_rpr(a, np.full(n, 1.0 / n), 20, 0.85)
    got = hotness.compute_score("rpr", tiny, progress=False)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    train = np.asarray(tiny.train_idx)
    r0 = np.full(n, 1.0 / n)
    r0[train] *= n / train.size
    want_w = dense_rpr(a, r0, 5, 0.85)
    got_w = hotness.compute_score("wrpr", tiny, progress=False)
    np.testing.assert_allclose(got_w, want_w, rtol=1e-12)


def test_registry_sj_uses_one_layer_per_fanout(tiny):
    """``sj`` runs L = len(fanouts) hops of ``h <- h + A h`` from the training indicator."""
    a, train = dense(tiny), np.asarray(tiny.train_idx)
    h = np.zeros(tiny.num_nodes)
    h[train] = 1.0
    for _ in range(3):
        h = h + a @ h
    got = hotness.compute_score("sj", tiny, fanouts=(9, 4, 2), progress=False)
    np.testing.assert_allclose(got, h / train.size, rtol=1e-12)


def test_registry_sj_fanout_weights_edges_by_the_fanouts(tiny):
    """``sj_fanout`` weights each hop's edges by ``min(1, k_l / indeg(v))`` of its own fanout."""
    a, train = dense(tiny), np.asarray(tiny.train_idx)
    indeg = a.sum(axis=0)
    e = np.zeros(tiny.num_nodes)
    e[train] = 1.0
    total = e.copy()
    for k in (2, 1):
        e = a @ (e * np.where(indeg > 0, np.minimum(1.0, k / np.maximum(indeg, 1)), 0.0))
        total += e
    got = hotness.compute_score("sj_fanout", tiny, fanouts=(2, 1), progress=False)
    np.testing.assert_allclose(got, total / train.size, rtol=1e-12)


def test_registry_presample_defaults_to_one_epoch_seed_one(tiny):
    """``presample`` through the registry is one epoch of the order and sampler seeded with 1."""
    got = hotness.compute_score("presample", tiny, fanouts=(3, 2), batch_size=4, progress=False)
    want = hotness.presample_counts(
        tiny.graph, tiny.train_idx, fanouts=(3, 2), batch_size=4, epochs=1, seed=1, progress=False
    )
    np.testing.assert_array_equal(got, want)
    other = hotness.presample_counts(
        tiny.graph, tiny.train_idx, fanouts=(3, 2), batch_size=4, epochs=1, seed=2, progress=False
    )
    assert not np.array_equal(want, other)  # the seed matters on this graph


def test_presample_budget_counts_the_per_node_arrays_and_the_whole_csr(tiny):
    """presample's fixed bytes are its 32 bytes per node plus every byte of indptr and indices."""
    g = tiny.graph
    csr = g.indptr.nbytes + g.indices.nbytes
    assert hotness.score_fixed_bytes("presample", g) == 32 * (g.num_nodes + 1) + csr


@pytest.mark.parametrize(
    "score",
    [
        lambda g, t: hotness.weighted_reverse_pagerank(g, t, progress=False),
        lambda g, t: hotness.sj_estimate(g, t, progress=False),
        lambda g, t: hotness.sj_estimate(g, t, fanouts=(2,), progress=False),
        lambda g, t: hotness.presample_counts(g, t, fanouts=(2,), progress=False),
    ],
    ids=["wrpr", "sj", "sj_fanout", "presample"],
)
@pytest.mark.parametrize(
    "train, match",
    [
        (np.array([0, 4]), "node id 4 out of range"),  # N itself is one past the last node
        (np.array([-1, 2]), "node id -1 out of range"),  # would wrap to node 3
        (np.array([2.0]), "integer"),  # would be truncated to an id
        (np.array([2.7]), "integer"),
    ],
)
def test_training_ids_outside_the_graph_or_not_integers_are_refused(score, train, match):
    """Every score over training nodes refuses id N, negative ids and float ids with a UsageError."""
    with pytest.raises(UsageError, match=match):
        score(hand_graph(), train)


def test_sj_counts_a_repeated_training_node_once():
    """Both sj forms divide by the distinct training nodes: [2, 2] is the train set {2}."""
    g = hand_graph()
    for kw in ({"num_layers": 2}, {"fanouts": (1, 1)}):
        once = hotness.sj_estimate(g, np.array([2]), progress=False, **kw)
        twice = hotness.sj_estimate(g, np.array([2, 2]), progress=False, **kw)
        np.testing.assert_array_equal(twice, once)


def test_sj_fanout_zero_takes_no_neighbour_and_minus_two_is_refused():
    """Fanout 0 samples nothing (only the seeds count), -1 is all; below -1 is a UsageError."""
    g = hand_graph()
    got = hotness.sj_estimate(g, np.array([1, 2]), fanouts=(0, 5), progress=False)
    np.testing.assert_array_equal(got, [0.0, 0.5, 0.5, 0.0])  # e_0 / N_t, e_1 = e_2 = 0
    with pytest.raises(UsageError, match="fanouts"):
        hotness.sj_estimate(g, np.array([2]), fanouts=(2, -2), progress=False)


def test_reverse_pagerank_tol_is_a_strict_bound():
    """An update whose L1 change equals ``tol`` does not stop the iteration (``< tol``)."""
    g = hand_graph()
    r1 = hotness.reverse_pagerank(g, iterations=1, damping=0.5)
    first = float(np.abs(r1 - np.full(4, 0.25)).sum())  # the first update's L1 change
    assert first > 0
    got = hotness.reverse_pagerank(g, iterations=2, damping=0.5, tol=first)
    np.testing.assert_array_equal(got, hotness.reverse_pagerank(g, iterations=2, damping=0.5))
    # just above it, the first update stops it
    stop = hotness.reverse_pagerank(g, iterations=2, damping=0.5, tol=np.nextafter(first, 1))
    np.testing.assert_array_equal(stop, r1)


def test_chunked_out_degree_drops_the_pages_it_read(tmp_path):
    """The chunked degree count leaves the pages of a mapped ``indices`` unmapped."""
    from gnnio.utils.rss import rss_bytes

    n, m = 1 << 12, 1 << 22  # 16 MiB of int32 edges
    np.save(tmp_path / "indptr.npy", np.linspace(0, m, n + 1).astype(np.int64))
    np.save(tmp_path / "indices.npy", (np.arange(m, dtype=np.int32) % n))
    g = CSRGraph(*(np.load(tmp_path / f"{k}.npy", mmap_mode="c") for k in ("indptr", "indices")))
    # warm up the kernel (loading it costs tens of MiB in a fresh process) on the same types
    small = CSRGraph(np.array([0, 4], np.int64), np.zeros(4, np.int32))
    hotness.out_degree(small, False, chunk_bytes=2 << 20)
    base = rss_bytes()
    got = hotness.out_degree(g, False, chunk_bytes=2 << 20)
    grown = rss_bytes() - base
    np.testing.assert_array_equal(got, np.full(n, m // n))
    assert grown < (8 << 20), grown


def test_a_dataset_without_a_train_split_is_named_in_the_refusal(tmp_path):
    """A score over training nodes on a dataset with no train split names the dataset."""
    from gnnio.errors import DatasetError
    from gnnio.graph import DatasetWriter

    g = hand_graph()
    with DatasetWriter(tmp_path / "nosplit", name="x") as w:
        w.save_array("indptr", g.indptr)
        w.save_array("indices", g.indices)
        w.save_array("features", np.zeros((4, 2), np.float32))
    ds = load(tmp_path / "nosplit")
    for name in hotness.TRAIN_SCORES:
        with pytest.raises(DatasetError, match="nosplit: has no train split"):
            hotness.compute_score(name, ds, fanouts=(2,), progress=False)


def test_a_budgeted_score_leaves_no_page_of_the_csr_mapped(tmp_path):
    """Within a memory budget, the pages of indptr a score read (in_degree reads it whole) are
    dropped before compute_score returns."""
    from types import SimpleNamespace

    from gnnio.preprocess.budget import MIN_CHUNK
    from gnnio.utils.rss import rss_by_kind

    n = 1 << 21  # 16 MiB of indptr
    np.save(tmp_path / "indptr.npy", np.concatenate([np.zeros(n, np.int64), [1]]))
    np.save(tmp_path / "indices.npy", np.zeros(1, np.int32))
    g = CSRGraph(*(np.load(tmp_path / f"{k}.npy", mmap_mode="c") for k in ("indptr", "indices")))
    if "file" not in rss_by_kind():
        pytest.skip("no per-kind RSS on this system")
    budget = hotness.score_fixed_bytes("in_degree", g) + MIN_CHUNK
    base = rss_by_kind()["file"]
    got = hotness.compute_score("in_degree", SimpleNamespace(graph=g), memory_budget=budget)
    grown = rss_by_kind()["file"] - base
    assert got[-1] == 1 and got.sum() == 1
    assert grown < (8 << 20), grown
