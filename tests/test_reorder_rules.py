"""Reordering rules the mutation pass found unguarded: relabel_csr's argument checks, the bounded
relabel's memory behaviour (an input larger than the chunk is never mapped; a chunk of the run
path counts 24 bytes per row) and the edge source's empty-graph bounds."""

from __future__ import annotations

import numpy as np
import pytest

from gnnio.errors import UsageError
from gnnio.graph import CSRGraph
from gnnio.preprocess import reorder
from gnnio.preprocess import reorder_bounded as rb
from gnnio.preprocess.chunked import EdgeArrays


def small_graph() -> CSRGraph:
    return CSRGraph.from_edges(np.array([0, 1, 2]), np.array([1, 2, 0]), 3)


def mapped_relabel_input(tmp_path, n: int, m: int):
    """``(indptr, indices, perm, out)`` for the bounded relabel: ``n`` rows of ``m / n`` int32
    edges, ``indices`` a copy-on-write mapping of an .npy file, ``out`` a writable .npy mapping."""
    indptr = np.linspace(0, m, n + 1).astype(np.int64)
    np.save(tmp_path / "i.npy", (np.arange(m, dtype=np.int64) % n).astype(np.int32))
    ind = np.load(tmp_path / "i.npy", mmap_mode="c")
    perm = np.random.default_rng(0).permutation(n)
    out = np.lib.format.open_memmap(tmp_path / "o.npy", "w+", np.int32, (m,))
    return indptr, ind, perm, out


def spy_row_chunks(monkeypatch) -> list[tuple[int, int]]:
    """The ``(first, stop)`` row chunks the bounded relabel walks, as it walks them."""
    seen: list[tuple[int, int]] = []
    real = rb.row_chunks

    def spy(cost, limit):
        for a, b in real(cost, limit):
            seen.append((a, b))
            yield a, b

    monkeypatch.setattr(rb, "row_chunks", spy)
    return seen


@pytest.mark.parametrize("impl", reorder.IMPLS)
def test_relabel_csr_refuses_indptr_that_does_not_end_at_the_edge_count(impl):
    """An indptr whose last entry is not len(indices) is a UsageError, not a wrong or torn CSR."""
    g = small_graph()
    indptr = np.asarray(g.indptr).copy()
    indptr[-1] += 1  # claims 4 edges, indices holds 3
    with pytest.raises(UsageError, match="indptr: ends at 4 but indices has 3"):
        reorder.relabel_csr(indptr, g.indices, np.array([2, 0, 1]), impl=impl)


@pytest.mark.parametrize("impl", reorder.IMPLS)
@pytest.mark.parametrize(
    ("indptr", "indices", "what"),
    [([0, 2, 3, 4], [1, 3, 0, 2], "3"), ([0, 2, 3, 4], [1, -1, 0, 2], "-1"),
     ([0, 3, 2, 4], [1, 2, 0, 2], "decreas")],
)  # fmt: skip
def test_relabel_csr_refuses_an_id_out_of_range_or_a_decreasing_indptr(impl, indptr, indices, what):
    """The kernels read ``old2new`` at every neighbour id and move rows by ``indptr`` unchecked:
    a neighbour id outside ``[0, N)`` or an ``indptr`` that decreases is a one-line UsageError,
    not an out-of-bounds read."""
    g = (np.array(indptr, dtype=np.int64), np.array(indices, dtype=np.int32))
    with pytest.raises(UsageError, match=what):
        reorder.relabel_csr(*g, np.array([2, 0, 1]), impl=impl)


@pytest.mark.parametrize("impl", ["numba", "numpy"])
def test_relabel_csr_refuses_an_out_array_of_the_wrong_dtype(impl):
    """``out`` must have the index dtype of N (int32 here): an int64 buffer is refused."""
    g = small_graph()
    out = np.empty(g.num_edges, dtype=np.int64)
    with pytest.raises(UsageError, match="out: need shape"):
        reorder.relabel_csr(g.indptr, g.indices, np.array([2, 0, 1]), impl=impl, out=out)


def test_bounded_relabel_does_not_map_an_input_larger_than_the_chunk(tmp_path, monkeypatch):
    """When the mapped ``indices`` does not fit the chunk it is read with preadv, never mapped:
    with the final release made a no-op, none of its pages are resident afterwards."""
    from gnnio.utils.rss import rss_bytes

    n, m = 1 << 12, 1 << 21  # 8 MiB of int32 edges
    indptr, ind, perm, out = mapped_relabel_input(tmp_path, n, m)
    monkeypatch.setattr(rb, "release", lambda arr: None)
    # warm up the kernels (loading them costs resident memory) on a small input of the same types
    rb.relabel_csr_bounded(indptr[:65], ind[: m // 64], perm[perm < 64], out[: m // 64], 1 << 20)
    base = rss_bytes()
    got_ptr = rb.relabel_csr_bounded(indptr, ind, perm, out, 2 << 20)
    grown = rss_bytes() - base
    assert grown < (4 << 20), grown
    old2new = reorder.invert_permutation(perm)
    for i in (0, n // 2, n - 1):  # new row i is old row perm[i], ids mapped
        o = perm[i]
        row = out[got_ptr[i] : got_ptr[i + 1]]
        np.testing.assert_array_equal(row, old2new[ind[indptr[o] : indptr[o + 1]]])


def test_bounded_relabel_run_chunks_count_24_bytes_per_row(tmp_path, monkeypatch):
    """On the preadv path a chunk's output edges plus 24 bytes per row stay within the chunk
    (a one-row chunk excepted): many short rows do not pile into one chunk."""
    n = 20_000
    g = CSRGraph.from_edges(np.arange(n), (np.arange(n) + 1) % n, n)  # one edge per row
    np.save(tmp_path / "i.npy", np.asarray(g.indices))
    ind = np.load(tmp_path / "i.npy", mmap_mode="c")
    perm = np.random.default_rng(1).permutation(n)
    out = np.lib.format.open_memmap(tmp_path / "o.npy", "w+", ind.dtype, ind.shape)
    seen = spy_row_chunks(monkeypatch)
    chunk = 200_000  # below the input + MIN_CHUNK: the preadv path
    ptr = rb.relabel_csr_bounded(g.indptr, ind, perm, out, chunk)
    assert seen[0][0] == 0 and seen[-1][1] == n and len(seen) > 1
    for a, b in seen:
        held = (int(ptr[b]) - int(ptr[a])) * out.dtype.itemsize + 24 * (b - a)
        assert b - a == 1 or held <= chunk, (a, b, held)
    want_ptr, want_ind = reorder.relabel_csr(g.indptr, g.indices, perm)
    np.testing.assert_array_equal(ptr, want_ptr)
    np.testing.assert_array_equal(np.asarray(out), want_ind)


def test_edge_arrays_without_edges_bound_no_id():
    """``min_max`` of an edge list with no edges is ``(0, -1)``: no id, so N = 0 passes
    ``lo < 0 or hi >= N``."""
    e = np.empty(0, dtype=np.int64)
    assert EdgeArrays(e, e).min_max() == (0, -1)
    assert EdgeArrays(e, indptr=np.zeros(1, dtype=np.int64)).min_max() == (0, -1)


@pytest.mark.parametrize("impl", reorder.IMPLS)
def test_relabel_csr_refuses_a_float_permutation(impl):
    """A float ``new2old`` is refused, not truncated: [0.0, 1.5, 2.9] would pass as [0, 1, 2]."""
    g = small_graph()
    with pytest.raises(UsageError, match="new2old: need a 1-D integer array, got float64"):
        reorder.relabel_csr(g.indptr, g.indices, np.array([0.0, 1.5, 2.9]), impl=impl)


def test_reorder_dataset_refuses_a_float_permutation(tmp_path):
    """``reorder_dataset`` refuses a float ``new2old`` before writing anything."""
    from gnnio.graph import load
    from tests.helpers import write_tiny_dataset

    ds = load(write_tiny_dataset(tmp_path / "a", num_nodes=4, num_edges=6))
    with pytest.raises(UsageError, match="new2old: need a 1-D integer array"):
        reorder.reorder_dataset(ds, np.array([3.0, 0.5, 1.0, 2.0]), tmp_path / "b", progress=False)
    assert not (tmp_path / "b").exists()


def test_reorder_path_refuses_a_small_budget_before_the_score_pass(tmp_path, monkeypatch):
    """A budget the reorder cannot work in is refused before the (long) score pass starts."""
    from gnnio.preprocess import hotness
    from tests.helpers import write_tiny_dataset

    src = write_tiny_dataset(tmp_path / "a", num_nodes=50, num_edges=200)

    def no_score(*a, **k):
        raise AssertionError("the score pass ran")

    monkeypatch.setattr(hotness, "compute_score", no_score)
    budget = rb.fixed_bytes(50) + rb.MIN_CHUNK - 1  # enough for any score, not for the reorder
    with pytest.raises(UsageError, match="cannot reorder 50 nodes"):
        reorder.reorder_path(src, "degree", out=tmp_path / "b", progress=False,
                             memory_budget=budget)  # fmt: skip
    assert not (tmp_path / "b").exists()
