"""Arrays that disagree with each other are refused at the public boundary, not handed to a numba
kernel that reads or writes past them (each case segfaulted before its check; the call runs in
a forked child so that an unchecked one fails the test instead of killing pytest)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gnnio.errors import UsageError
from gnnio.graph import CSRGraph
from tests.helpers import in_forked_child


def _refused(fn, exc, match: str) -> None:
    """``fn()`` raises ``exc`` matching ``match``; checked in a forked child (a crash: None)."""
    import re

    def child() -> bool:
        try:
            fn()
        except exc as e:
            return re.search(match, str(e)) is not None
        return False

    got = in_forked_child(child, timeout=120)
    assert got is True, f"expected {exc.__name__}({match!r}); the child answered {got}"


_BAD_CSR = {  # (indptr, indices, the message)
    "ends past indices": ([0, 2, 4_000_000], [1, 0], "must run from 0 to len"),
    "index out of range": ([0, 1, 2], [1, 10**9], "node id 1000000000 is out of range"),
    "decreasing": ([0, 5_000_000, 2], [0, 1], "decreases at position 2"),
}


@pytest.mark.parametrize("case", list(_BAD_CSR))
def test_a_csr_graph_of_inconsistent_arrays_is_refused_before_a_sampler_runs(case):
    """CSRGraph(indptr, indices) checks its arrays (a sampler's kernel read past them and
    segfaulted); the same arrays as CPU tensors too, and a duck-typed graph at the sampler,
    ``las_sets`` and ``propagate``."""
    from gnnio.preprocess.graph_scores import propagate
    from gnnio.sampling import UniformSampler
    from gnnio.sampling.locality import las_sets

    ip, ix, match = _BAD_CSR[case]
    ip, ix = np.array(ip, dtype=np.int64), np.array(ix, dtype=np.int32)

    def sample() -> None:
        UniformSampler(CSRGraph(ip, ix), [-1, -1]).sample(torch.tensor([0, 1]))

    _refused(sample, ValueError, "graph.(indptr|indices): " + match)
    with pytest.raises(ValueError, match=match):
        CSRGraph(torch.from_numpy(ip), torch.from_numpy(ix))

    class Duck:  # (anything with indptr/indices: the sampler checks it, as las_sets and
        indptr, indices = ip, ix  # propagate do: their kernels read and add at every index)
        num_nodes = ip.shape[0] - 1

    _refused(lambda: UniformSampler(Duck(), [2]), ValueError, match)
    _refused(lambda: las_sets(Duck(), [0], 2), ValueError, match)
    _refused(lambda: propagate(Duck(), np.ones(Duck.num_nodes)), ValueError, match)


_MISSHAPEN_CSR = {  # (indptr, indices, the message): refused before any kernel is reached
    "2-D indptr": (np.array([[0, 1], [1, 2]]), np.array([1, 0]), r"indptr: need a 1-D integer"),
    "2-D indices": (np.array([0, 1, 2]), np.array([[1], [0]]), r"indices: need a 1-D integer"),
    "float indices": (np.array([0, 1, 2]), np.array([1.0, 0.0]), r"indices: need a 1-D integer"),
    "float indptr": (np.array([0.0, 1.0, 2.0]), np.array([1, 0]), r"indptr: need a 1-D integer"),
    "empty indptr": (np.array([], dtype=np.int64), np.array([], dtype=np.int32), "an empty array"),
    "starts past 0": (np.array([1, 2, 2]), np.array([1, 0]), r"indptr: must run .* got 1 \.\. 2"),
    "negative id": (np.array([0, 1, 2]), np.array([1, -1]), r"indices: node id -1 is out of range"),
}


@pytest.mark.parametrize("case", list(_MISSHAPEN_CSR))
def test_misshapen_csr_arrays_are_one_line(case):
    """Arrays of another shape or dtype, an ``indptr`` that is empty or does not start at 0, a
    negative id: each a ValueError naming the array (a kernel read ``indptr[-1]`` of an empty
    one, or ``x[-1]`` for a negative id)."""
    ip, ix, match = _MISSHAPEN_CSR[case]
    with pytest.raises(ValueError, match=("" if match.startswith("an") else "graph.") + match):
        CSRGraph(ip, ix)


def test_a_memory_mapped_csr_leaves_no_pages_after_its_check(tmp_path):
    """A read-only map's pages are dropped chunk by chunk (issue 26): 32 MiB of ``indices``
    checked leaves (nearly) none of its pages in this process."""
    from gnnio.utils.rss import rss_bytes

    n, m = 1 << 16, 1 << 23
    np.save(tmp_path / "ip.npy", np.linspace(0, m, n + 1).astype(np.int64))
    np.save(tmp_path / "ix.npy", np.random.default_rng(0).integers(0, n, m, dtype=np.int32))
    ip, ix = (np.load(tmp_path / f"{k}.npy", mmap_mode="r") for k in ("ip", "ix"))
    base = rss_bytes()
    assert CSRGraph(ip, ix).num_edges == m
    assert rss_bytes() - base < (8 << 20)
    assert int(ix[: 1 << 22].sum()) > 0 and rss_bytes() - base > (12 << 20)  # (read: resident)


def test_a_good_csr_graph_passes_and_a_loaded_one_is_not_rescanned(tmp_path, monkeypatch):
    """Valid arrays pass the check; load's and from_edges' graphs skip it (checked already)."""
    import gnnio.graph.csr as csr
    from gnnio.graph import load
    from tests.helpers import write_tiny_dataset

    ds = write_tiny_dataset(tmp_path / "d")
    called = []
    real = csr.check_csr
    monkeypatch.setattr(csr, "check_csr", lambda *a, **k: called.append(1) or real(*a, **k))
    g = CSRGraph(np.array([0, 1, 2], dtype=np.int64), np.array([1, 0], dtype=np.int32))
    assert g.num_edges == 2 and called == [1]
    CSRGraph.from_edges(np.array([0]), np.array([1]), 2)
    assert load(ds).graph.num_nodes == 12 and called == [1]


def test_a_csr_graphs_arrays_cannot_be_reassigned_past_its_check():
    """A built graph's arrays cannot be swapped for unchecked ones (a sampler's kernel read an
    index past ``indptr``'s nodes: a segfault); ``dataclasses.replace`` builds a checked graph."""
    import dataclasses

    g = CSRGraph(np.array([0, 1, 2], dtype=np.int64), np.array([1, 0], dtype=np.int32))
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.indices = np.array([1, 10**8], dtype=np.int32)
    with pytest.raises(ValueError, match="out of range"):
        dataclasses.replace(g, indices=np.array([1, 10**8], dtype=np.int32))
    assert g.indices.tolist() == [1, 0]
    assert CSRGraph._trusted(g.indptr, g.indices).num_edges == 2


@pytest.mark.parametrize("mode", ["r", "c", "r+"])
def test_a_memory_mapped_csr_is_checked_chunk_by_chunk(tmp_path, monkeypatch, mode):
    """Memory-mapped arrays are checked in chunks (the pages dropped after each; a copy-on-write
    map read through a read-only map of its file): a decrease or a bad id in a later chunk is
    found at its position. (That no pages stay: test_scores_bounded's RSS test.)"""
    import gnnio.graph._csr_check as cc

    monkeypatch.setattr(cc, "_CHUNK", 4)
    ip = np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10], dtype=np.int64)
    np.save(tmp_path / "ip.npy", ip)
    np.save(tmp_path / "ix.npy", np.arange(10, dtype=np.int32))
    g = CSRGraph(*(np.load(tmp_path / f"{k}.npy", mmap_mode=mode) for k in ("ip", "ix")))
    assert g.num_edges == 10
    bad = ip.copy()
    bad[6] = 4  # (a decrease at 6: in the second chunk)
    np.save(tmp_path / "bad.npy", bad)
    np.save(tmp_path / "ix2.npy", np.array([0] * 9 + [10], dtype=np.int32))
    with pytest.raises(ValueError, match="graph.indptr: decreases at position 6"):
        CSRGraph(np.load(tmp_path / "bad.npy", mmap_mode=mode), np.load(tmp_path / "ix.npy"))
    with pytest.raises(ValueError, match="node id 10 is out of range"):
        CSRGraph(np.load(tmp_path / "ip.npy"), np.load(tmp_path / "ix2.npy", mmap_mode=mode)[:])


@pytest.mark.parametrize("chunk", [4, 1 << 10])
def test_a_copy_on_write_maps_written_pages_are_checked(tmp_path, monkeypatch, chunk):
    """A copy-on-write map (``np.load(mmap_mode="c")``, gnnio.load's own mode) is checked through
    a read-only map of its file, so that its pages can be dropped; a page this process wrote
    holds other bytes than the file, and those are what the kernels read: an id out of range
    or a decrease written there was let through (the file was checked). With 1024-item chunks
    only the written chunk is read from the array (16 KiB of indptr: two of four chunks)."""
    import gnnio.graph._csr_check as cc

    monkeypatch.setattr(cc, "_CHUNK", chunk)
    n = 2048
    np.save(tmp_path / "ip.npy", np.arange(n + 1, dtype=np.int64))
    np.save(tmp_path / "ix.npy", np.arange(n, dtype=np.int32)[::-1].copy())

    def maps():
        return [np.load(tmp_path / f"{k}.npy", mmap_mode="c") for k in ("ip", "ix")]

    ip, ix = maps()
    assert CSRGraph(ip, ix).num_edges == n  # (a clean map: read through the file)
    ip, ix = maps()
    ix[1500] = 10**9  # a private write: the file still holds 547
    with pytest.raises(ValueError, match="node id 1000000000 is out of range"):
        CSRGraph(ip, ix)
    ip, ix = maps()
    ip[1300] = 5
    with pytest.raises(ValueError, match="graph.indptr: decreases at position 1300"):
        CSRGraph(ip, ix)
    assert ip[1300] == 5 and np.load(tmp_path / "ip.npy")[1300] == 1300  # (the write kept)


def test_relabel_csr_refuses_inconsistent_arrays():
    """relabel_csr checks indices' range and indptr's order (its kernels wrote past ``out``)."""
    from gnnio.preprocess.reorder import relabel_csr

    for ip, ix, match in _BAD_CSR.values():
        if ip[-1] != len(ix):  # (refused before: "ends at ... but indices has")
            continue
        ip, ix = np.array(ip, dtype=np.int64), np.array(ix, dtype=np.int32)
        _refused(lambda ip=ip, ix=ix: relabel_csr(ip, ix, np.array([1, 0])), UsageError, match)


_BLOCK_CASES = dict(
    [("src", r"block.edge_index\[0\]: source 100000000 is out of range \[0, 3\)"),
     ("dst", r"block.edge_index\[1\]: destination 7 is out of range \[0, 2\)"),
     ("ptr", "block.ptr: need num_dst"),
     ("ptr_order", "block.ptr: decreases"),
     ("weight", r"block.edge_weight: need shape \(2,\)"),
     ("nd>ns", "block: num_dst = 200000 exceeds num_src = 3")],
)  # fmt: skip


@pytest.mark.parametrize("spmm", ["", "torch"])
@pytest.mark.parametrize("case", list(_BLOCK_CASES))
def test_a_block_whose_ids_or_sizes_disagree_is_refused_before_the_numba_spmm(
    monkeypatch, case, spmm
):
    """A layer on the numba path refuses a block with a source id >= num_src, a destination id
    >= num_dst, a ``ptr`` that does not fit its edges, an edge weight of another length or more
    destinations than sources (the SpMM read, and its transpose wrote, past its arrays; GAT's
    logits read past the sources' terms: segfaults); on the CPU's torch path too (its
    ``segment_reduce(unsafe=True)`` trusts ``ptr``)."""
    from gnnio.sampling.base import Block
    from gnnio.train.models import build_model

    monkeypatch.setenv("GNNIO_SPMM", spmm)
    ei = {"src": [[0, 10**8], [0, 1]], "dst": [[0, 1], [0, 7]]}.get(case, [[0, 1], [0, 1]])
    ptr = {"ptr": [0, 1, 10**7], "ptr_order": [0, 2, 1, 2]}.get(case)
    nd = {"ptr_order": 3, "nd>ns": 200_000}.get(case, 2)
    w = torch.ones(5) if case == "weight" else None
    block = Block(torch.tensor(ei), 3, nd, w, None if ptr is None else torch.tensor(ptr))

    def run() -> None:  # (GAT: reads num_dst rows of the sources' attention terms)
        name = "gat" if case == "nd>ns" else "sage"
        layer = build_model(name, 4, 4, 2, num_layers=1, heads=2).layers[0]
        layer(torch.randn(3, 4, requires_grad=True), block).sum().backward()

    _refused(run, ValueError, _BLOCK_CASES[case])


def test_to_pyg_data_refuses_a_graph_the_batch_was_not_sampled_from():
    """``to_pyg_data(mb, graph=...)`` with a smaller graph than the batch's raises ValueError (the
    edge-position kernel read ``indptr`` past its end: a segfault)."""
    from gnnio.pyg import to_pyg_data
    from gnnio.sampling import UniformSampler

    n = 200_000
    src = np.arange(n)
    big = CSRGraph.from_edges(src, (src + 1) % n, n)
    small = CSRGraph.from_edges(np.array([0]), np.array([1]), 2)
    mb = UniformSampler(big, [2]).sample(torch.tensor([n - 1, n // 2]))
    _refused(lambda: to_pyg_data(mb, graph=small), ValueError, "not in this graph's")
    assert to_pyg_data(mb, graph=big).e_id.shape[0] == mb.blocks[0].num_edges


def test_propagate_refuses_an_out_buffer_of_another_shape():
    """``graph_scores.propagate(..., out=)`` refuses an ``out`` that is not float64 ``[N]`` (the
    kernel added into ``out[u]`` for every node ``u``: a heap corruption, the process aborted)."""
    from gnnio.preprocess.graph_scores import propagate

    n = 1 << 16
    src = np.arange(n)
    g = CSRGraph.from_edges(src, (src * 7 + 1) % n, n)
    for out in (np.empty(1), np.empty(n, dtype=np.float32)):
        _refused(lambda out=out: propagate(g, np.ones(n), out=out), ValueError, "out must be")
    out = np.full(n, 5.0)
    assert propagate(g, np.ones(n), out=out) is out and out.sum() == n
