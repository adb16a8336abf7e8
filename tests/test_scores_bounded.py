"""Hotness scores within a memory budget (issue 25, item 1): chunked passes over the
memory-mapped CSR give the same numbers, bit for bit, and a budget too small is refused with one
line before any work."""

from __future__ import annotations

import numpy as np
import pytest

from gnnio.errors import UsageError
from gnnio.graph.csr import CSRGraph
from gnnio.graph.dataset import load
from gnnio.importers.synthetic import prepare_synthetic
from gnnio.preprocess import graph_scores as gs
from gnnio.preprocess.budget import FAULT, MIN_CHUNK, edge_ranges, row_ranges
from gnnio.preprocess.hotness import compute_score, score_fixed_bytes
from tests.helpers import random_graph


@pytest.fixture(scope="module")
def mapped(tmp_path_factory):
    """A random graph whose CSR is memory-mapped from .npy files, as a dataset's is."""
    g = random_graph(2000, 30_000, seed=4)
    d = tmp_path_factory.mktemp("csr")
    np.save(d / "indptr.npy", np.asarray(g.indptr))
    np.save(d / "indices.npy", np.asarray(g.indices))
    return CSRGraph(
        np.load(d / "indptr.npy", mmap_mode="c"), np.load(d / "indices.npy", mmap_mode="c")
    )


#: about 100 edges per chunk: hundreds of chunks over the graph
TINY = 2 * FAULT + 400
TRAIN = np.arange(0, 2000, 7)


@pytest.mark.parametrize(
    "fn",
    [
        lambda g, c: gs.out_degree(g, False, chunk_bytes=c),
        lambda g, c: gs.in_degree(g, False, chunk_bytes=c),
        lambda g, c: gs.reverse_pagerank(g, 7, tol=1e-12, progress=False, chunk_bytes=c),
        lambda g, c: gs.weighted_reverse_pagerank(g, TRAIN, progress=False, chunk_bytes=c),
        lambda g, c: gs.sj_estimate(g, TRAIN, 3, progress=False, chunk_bytes=c),
        lambda g, c: gs.sj_estimate(g, TRAIN, fanouts=[5, 3], progress=False, chunk_bytes=c),
    ],
    ids=["degree", "in_degree", "rpr", "wrpr", "sj", "sj_fanout"],
)
def test_chunked_scores_are_bit_identical(mapped, fn):
    want = fn(mapped, None)
    got = fn(mapped, TINY)
    assert got.dtype == want.dtype == np.float64
    assert got.tobytes() == want.tobytes()


def test_propagate_in_chunks_sums_in_the_same_order(mapped):
    x = np.random.default_rng(0).random(mapped.num_nodes)  # sums that depend on their order
    want = gs.propagate(mapped, x)
    for chunk in (TINY, 2 * FAULT + 4 * 4000, 1 << 30):
        assert gs.propagate(mapped, x, chunk_bytes=chunk).tobytes() == want.tobytes()


def test_ranges_cover_every_row_and_edge_once():
    indptr = np.array([0, 3, 3, 40, 41, 45, 50])
    rows = list(row_ranges(indptr, 2 * FAULT + 4 * 5, 4))  # 5 edges per chunk
    assert rows[0][0] == 0 and rows[-1][1] == 6
    assert all(a < b and b == c for (a, b), (c, _) in zip(rows, rows[1:]))
    assert (2, 3) in rows  # the 37-edge row stands alone
    for a, b in rows:
        assert b - a == 1 or indptr[b] - indptr[a] <= 5
    assert list(edge_ranges(11, 2 * FAULT + 8 * 4, 8)) == [(0, 4), (4, 8), (8, 11)]


def test_chunks_drop_their_pages(tmp_path):
    """The chunked pass leaves the pages of ``indices`` unmapped; one pass keeps them resident."""
    from gnnio.utils.rss import rss_bytes

    n, m = 1 << 16, 1 << 23  # 32 MiB of int32 edges
    rng = np.random.default_rng(1)
    np.save(tmp_path / "indptr.npy", np.linspace(0, m, n + 1).astype(np.int64))
    np.save(tmp_path / "indices.npy", rng.integers(0, n, m, dtype=np.int32))
    g = CSRGraph(*(np.load(tmp_path / f"{k}.npy", mmap_mode="c") for k in ("indptr", "indices")))
    x = np.ones(n)
    base = rss_bytes()
    gs.propagate(g, x, chunk_bytes=4 << 20)
    bounded = rss_bytes() - base
    gs.propagate(g, x)
    whole = rss_bytes() - base
    assert bounded < (12 << 20) and whole > (24 << 20)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("data") / "g"
    prepare_synthetic(out, num_nodes=3000, avg_degree=8, feat_dim=8, num_classes=4, seed=3,
                      progress=False)  # fmt: skip
    return load(out)


@pytest.mark.parametrize("name", ["degree", "wrpr", "sj_fanout", "presample"])
def test_compute_score_within_a_budget(dataset, name):
    want = compute_score(name, dataset, fanouts=[4, 3], progress=False)
    need = score_fixed_bytes(name, dataset.graph) + MIN_CHUNK
    got = compute_score(name, dataset, fanouts=[4, 3], progress=False, memory_budget=need)
    assert got.tobytes() == want.tobytes()
    with pytest.raises(UsageError, match="--memory-budget") as e:
        compute_score(name, dataset, fanouts=[4, 3], progress=False, memory_budget=need - 1)
    assert "\n" not in str(e.value)


def test_presample_counts_the_whole_csr(dataset):
    g = dataset.graph
    csr = g.indptr.nbytes + g.indices.nbytes
    assert score_fixed_bytes("presample", g) >= csr
    assert score_fixed_bytes("wrpr", g) < csr + 80 * g.num_nodes
