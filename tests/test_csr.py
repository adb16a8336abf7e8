"""Property tests for the CSR utilities and the on-disk round-trip."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gnnio
from gnnio.graph import CSRGraph, DatasetWriter, edges_to_csr
from gnnio.graph.csr import index_dtype


@st.composite
def edge_lists(draw, max_nodes=30, max_edges=120):
    n = draw(st.integers(1, max_nodes))
    e = draw(st.integers(0, max_edges))
    src = np.array(draw(st.lists(st.integers(0, n - 1), min_size=e, max_size=e)), dtype=np.int64)
    dst = np.array(draw(st.lists(st.integers(0, n - 1), min_size=e, max_size=e)), dtype=np.int64)
    return n, src, dst


#: no deadline (Hypothesis' default: 200 ms per example): an example takes 0-4 ms, but one that a
#: loaded machine stalls past 250 ms fails the test (a DeadlineExceeded, or a FlakyFailure when
#: its replay is fast); what these tests check is the CSR, not its speed
CHECK = settings(deadline=None)


def edge_set(g: CSRGraph) -> set[tuple[int, int]]:
    s, d = g.edges()
    return set(zip(s.tolist(), d.tolist()))


def assert_valid_csr(g: CSRGraph):
    ip = np.asarray(g.indptr)
    assert ip.dtype == np.int64 and ip[0] == 0 and ip[-1] == g.num_edges
    assert np.all(np.diff(ip) >= 0)
    assert g.indices.dtype == np.int32
    if g.num_edges:
        assert g.indices.min() >= 0 and g.indices.max() < g.num_nodes


@CHECK
@given(edge_lists())
def test_edges_to_csr_roundtrip(data):
    n, src, dst = data
    g = CSRGraph.from_edges(src, dst, n)
    assert_valid_csr(g)
    assert edge_set(g) == set(zip(src.tolist(), dst.tolist()))
    assert g.num_edges == len(set(zip(src.tolist(), dst.tolist())))
    # rows list in-neighbours, sorted
    for v in range(n):
        row = g.indices[g.indptr[v] : g.indptr[v + 1]]
        assert np.all(np.diff(row) > 0)
        assert set(row.tolist()) == {int(s) for s, d in zip(src, dst) if d == v}


@CHECK
@given(edge_lists())
def test_degrees_reverse_symmetrize(data):
    n, src, dst = data
    g = CSRGraph.from_edges(src, dst, n)
    r = g.reverse()
    assert_valid_csr(r)
    assert edge_set(r) == {(d, s) for s, d in edge_set(g)}
    assert np.array_equal(r.in_degrees(), g.out_degrees())
    assert np.array_equal(r.reverse().indices, g.indices)
    sym = g.symmetrize()
    es = edge_set(sym)
    assert es == edge_set(g) | edge_set(r)
    assert all((d, s) in es for s, d in es)
    nsl = g.symmetrize(drop_self_loops=True)
    assert all(s != d for s, d in edge_set(nsl))


@CHECK
@given(edge_lists(), st.data())
def test_induced_subgraph(data, draw):
    n, src, dst = data
    g = CSRGraph.from_edges(src, dst, n)
    nodes = np.array(draw.draw(st.permutations(range(n))), dtype=np.int64)[
        : draw.draw(st.integers(0, n))
    ]
    sub, kept = g.induced_subgraph(nodes)
    assert_valid_csr(sub)
    pos = {int(v): i for i, v in enumerate(kept)}
    want = {(pos[s], pos[d]) for s, d in edge_set(g) if s in pos and d in pos}
    assert edge_set(sub) == want


def test_induced_subgraph_refuses_repeated_nodes():
    g = CSRGraph.from_edges(np.array([0, 1]), np.array([1, 2]), 3)
    with pytest.raises(ValueError, match="duplicates"):
        g.induced_subgraph(np.array([1, 0, 1]))


def test_index_dtype_switches_to_int64_at_2_pow_31_nodes():
    # the documented contract (csr module docstring), which validation holds datasets to
    assert index_dtype(2**31 - 1) == np.int32
    assert index_dtype(2**31) == np.int64


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(edge_lists(), st.sampled_from([np.float32, np.float16]))
def test_dataset_write_read_roundtrip(tmp_path_factory, data, dtype):
    n, src, dst = data
    indptr, indices = edges_to_csr(src, dst, n)
    feats = np.arange(n * 3, dtype=dtype).reshape(n, 3)
    out = tmp_path_factory.mktemp("rt") / "ds"
    with DatasetWriter(out, name="rt") as w:
        w.save_array("indptr", indptr)
        w.save_array("indices", indices)
        w.save_array("features", feats)
    ds = gnnio.load(out, verify=True)
    assert np.array_equal(ds.graph.indptr, indptr)
    assert np.array_equal(ds.graph.indices, indices)
    assert np.array_equal(ds.features, feats) and ds.features.dtype == dtype
    ip, ix = ds.graph.to_torch()
    assert ip.tolist() == indptr.tolist() and ix.tolist() == indices.tolist()


@pytest.mark.parametrize(
    "src, dst, msg",
    [([0, 5], [1, 2], r"src\[1\] = 5 "), ([0, 1], [-1, 2], r"dst\[0\] = -1 "),
     ([0, 1], [1, 4], r"dst\[1\] = 4 ")],
)  # fmt: skip
def test_edges_to_csr_refuses_an_id_outside_the_nodes(src, dst, msg):
    """An edge end outside ``[0, num_nodes)`` is refused, naming it (``src = N`` became an edge
    of the next destination row, silently)."""
    with pytest.raises(ValueError, match=msg + r"is not a node id in \[0, 4\)"):
        edges_to_csr(np.array(src), np.array(dst), 4)
    indptr, indices = edges_to_csr(np.array([3, 0]), np.array([0, 3]), 4)  # (the edges: fine)
    assert indptr.tolist() == [0, 1, 1, 1, 2] and indices.tolist() == [3, 0]


def test_edges_to_csr_refuses_src_and_dst_of_different_lengths():
    """``src`` and ``dst`` of different lengths are one ValueError; a ``dst`` of one id would
    otherwise broadcast against every ``src``, inventing edges silently."""
    with pytest.raises(ValueError, match=r"src and dst differ in length: \(3,\) vs \(1,\)"):
        edges_to_csr(np.array([0, 1, 2]), np.array([1]), 3)


def test_reverse_keeps_repeated_edges():
    """``reverse`` swaps every edge's ends and keeps a repeated edge repeated (a graph built with
    ``dedup=False``): the reversed CSR has as many edges, each once per copy."""
    g = CSRGraph.from_edges(np.array([0, 0, 2]), np.array([1, 1, 1]), 3, dedup=False)
    r = g.reverse()
    assert r.num_edges == g.num_edges == 3
    assert np.asarray(r.indptr).tolist() == [0, 2, 2, 3] and r.indices.tolist() == [1, 1, 1]


def test_to_torch_of_read_only_arrays_copies_them():
    """A read-only array (one the caller froze) is copied by ``to_torch``: writing the tensor
    leaves the graph's array as it was (a shared buffer would write through the freeze)."""
    ip, ix = np.array([0, 1, 2], dtype=np.int64), np.array([1, 0], dtype=np.int32)
    g = CSRGraph(ip, ix)
    ip.setflags(write=False)
    ix.setflags(write=False)
    tip, tix = g.to_torch()
    tip[1], tix[0] = 7, 7
    assert ip.tolist() == [0, 1, 2] and ix.tolist() == [1, 0]
    assert tip.tolist() == [0, 7, 2] and tix.tolist() == [7, 0]
