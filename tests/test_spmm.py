"""The block SpMM (gnnio.train.spmm): both implementations against a NumPy reference and against
torch.sparse.mm, forward and backward, with and without the sampler's CSR pointer."""

from __future__ import annotations

import os
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gnnio.sampling.base import Block, dst_ptr
from gnnio.train import spmm
from gnnio.train.models import aggregate
from tests.helpers import in_forked_child, op_names


def _random_block(rng, nd, ns, e, weighted, sorted_dst=True, with_ptr=True):
    dst = rng.integers(0, nd, e)
    if sorted_dst:
        dst = np.sort(dst, kind="stable")
    src = rng.integers(0, ns, e)
    ei = torch.from_numpy(np.stack([src, dst]).astype(np.int64))
    w = torch.from_numpy(rng.uniform(0.1, 3.0, e).astype(np.float32)) if weighted else None
    ptr = dst_ptr(ei, nd) if (with_ptr and sorted_dst) else None
    return Block(ei, ns, nd, w, ptr)


def _dense(block, reduce):
    """A as a dense float64 matrix, from the edge list (duplicates summed)."""
    a = np.zeros((block.num_dst, block.num_src))
    src, dst = block.edge_index.numpy()
    w = np.ones(len(src)) if block.edge_weight is None else block.edge_weight.double().numpy()
    np.add.at(a, (dst, src), w)
    if reduce == "mean":
        s = np.zeros(block.num_dst)
        np.add.at(s, dst, w)
        a = a / np.maximum(s, 1e-30)[:, None]
    return a


@settings(max_examples=60, deadline=None)
@given(
    nd=st.integers(1, 40),
    extra=st.integers(0, 40),
    e=st.integers(0, 300),
    weighted=st.booleans(),
    reduce=st.sampled_from(["mean", "sum"]),
    layout=st.sampled_from(["ptr", "sorted", "unsorted"]),
    impl=st.sampled_from(["numba", "torch"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_forward_and_backward_match_dense_reference(
    nd, extra, e, weighted, reduce, layout, impl, seed
):
    with mock.patch.dict(os.environ, {"GNNIO_SPMM": "torch" if impl == "torch" else ""}):
        _check_against_dense(nd, extra, e, weighted, reduce, layout, impl, seed)


def _check_against_dense(nd, extra, e, weighted, reduce, layout, impl, seed):
    assert spmm.spmm_impl("cpu") == impl
    rng = np.random.default_rng(seed)
    ns = nd + extra
    block = _random_block(
        rng, nd, ns, e, weighted, sorted_dst=layout != "unsorted", with_ptr=layout == "ptr"
    )
    x = torch.from_numpy(rng.standard_normal((ns + 3, 5)).astype(np.float32)).requires_grad_()
    out = aggregate(x, block, reduce)
    a = _dense(block, reduce)
    ref = a @ x.detach().double().numpy()[:ns]
    np.testing.assert_allclose(out.detach().numpy(), ref, rtol=1e-5, atol=1e-5)
    g = rng.standard_normal(out.shape)
    out.backward(torch.from_numpy(g.astype(np.float32)))
    gref = np.zeros((ns + 3, 5))
    gref[:ns] = a.T @ g
    np.testing.assert_allclose(x.grad.numpy(), gref, rtol=1e-5, atol=1e-5)


def test_gradcheck_float64_both_impls(monkeypatch):
    rng = np.random.default_rng(3)
    for impl in ("", "torch"):
        monkeypatch.setenv("GNNIO_SPMM", impl)
        for reduce in ("mean", "sum"):
            block = _random_block(rng, 7, 11, 40, weighted=True)
            x = torch.randn(11, 3, dtype=torch.float64, requires_grad=True)
            assert torch.autograd.gradcheck(lambda t, b=block, r=reduce: aggregate(t, b, r), (x,))


def _sequential_csr_product(ptr, col, val, x):
    """out[i] = (((0 + v0 * x[c0]) + v1 * x[c1]) + ...) in edge order, each product and each sum
    rounded to float32 on its own (no fused multiply-add): the numba kernel's stated order."""
    out = np.zeros((ptr.shape[0] - 1, x.shape[1]), np.float32)
    for i in range(ptr.shape[0] - 1):
        acc = np.zeros(x.shape[1], np.float32)
        for e in range(ptr[i], ptr[i + 1]):
            acc = acc + np.float32(val[e]) * x[col[e]]
        out[i] = acc
    return out


def test_numba_forward_is_the_sequential_edge_order_sum_and_close_to_torch_sparse_mm(monkeypatch):
    """The numba kernel accumulates each row in CSR edge order, a multiply then an add per edge:
    bit-identical to that sum on every CPU. ``torch.sparse.mm`` (MKL) sums in the same order but
    fuses the multiply-add where the CPU has FMA and MKL uses it (Intel AVX2/AVX-512; not on the
    earlier development VMs, where the two were bit-identical), so against it only the last bits
    may differ."""
    rng = np.random.default_rng(0)
    block = _random_block(rng, 500, 2000, 6000, weighted=False)
    x = torch.from_numpy(rng.standard_normal((2000, 64)).astype(np.float32))
    monkeypatch.setenv("GNNIO_SPMM", "")
    fast = aggregate(x, block, "mean")
    dst = block.edge_index[1]
    cnt = torch.zeros(500).index_add_(0, dst, torch.ones(dst.shape[0]))
    w = 1.0 / cnt.clamp_min(1e-30)[dst]
    seq = _sequential_csr_product(block.ptr.numpy(), block.edge_index[0].numpy(), w.numpy(),
                                  x.numpy())  # fmt: skip
    assert np.array_equal(fast.numpy(), seq)
    adj = torch.sparse_csr_tensor(block.ptr, block.edge_index[0], w, (500, 2000),
                                  check_invariants=False)  # fmt: skip
    ref = torch.sparse.mm(adj, x)
    torch.testing.assert_close(fast, ref, rtol=1e-6, atol=1e-6)


def test_the_backward_builds_no_transpose_for_an_input_without_grad(monkeypatch):
    """Layer 0 reads the features, which need no gradient: no A^T is built for it."""
    built = []
    real = spmm.BlockCSR.t

    def spy(self):
        built.append(self.shape)
        return real(self)

    monkeypatch.setattr(spmm.BlockCSR, "t", spy)
    rng = np.random.default_rng(1)
    block = _random_block(rng, 10, 30, 80, weighted=False)
    w = torch.randn(4, 4, requires_grad=True)
    x = torch.randn(30, 4)
    (aggregate(x, block, "mean") @ w).sum().backward()
    assert built == []
    aggregate(x.requires_grad_(), block, "mean").sum().backward()
    assert built == [(10, 30)]


def test_sampler_ptr_matches_its_edges(tiny_graph):
    from gnnio.sampling import UniformSampler

    s = UniformSampler(tiny_graph, [4, 3], seed=0)
    b = s.sample(torch.arange(0, tiny_graph.num_nodes, 7))
    for blk in b.blocks:
        dst = blk.edge_index[1]
        assert blk.ptr is not None and blk.ptr.shape == (blk.num_dst + 1,)
        assert bool((dst[1:] >= dst[:-1]).all())
        assert torch.equal(blk.ptr[1:] - blk.ptr[:-1], torch.bincount(dst, minlength=blk.num_dst))


@pytest.fixture
def tiny_graph():
    from gnnio.graph.csr import CSRGraph

    rng = np.random.default_rng(5)
    n = 200
    deg = rng.integers(0, 12, n)
    indptr = np.concatenate([[0], np.cumsum(deg)]).astype(np.int64)
    indices = rng.integers(0, n, int(indptr[-1])).astype(np.int64)
    return CSRGraph(indptr, indices)


def test_threaded_product_equals_one_thread(monkeypatch):
    """Row ranges on several threads give the one-thread result bit for bit."""
    rng = np.random.default_rng(2)
    block = _random_block(rng, 3000, 5000, 40000, weighted=True)
    x = torch.from_numpy(rng.standard_normal((5000, 96)).astype(np.float32))
    monkeypatch.setenv("GNNIO_SPMM", "")
    monkeypatch.setattr(spmm, "_SERIAL_WORK", 0)
    prev = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = aggregate(x, block, "mean")
        torch.set_num_threads(3)
        three = aggregate(x, block, "mean")
    finally:
        torch.set_num_threads(prev)
    assert torch.equal(one, three)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("layout", ["ptr", "unsorted"])
def test_torch_path_builds_the_numba_paths_matrix_and_transpose_exactly(
    monkeypatch, weighted, layout
):
    """The GPU's (torch) construction -- values from the pointer's differences and the block's
    destinations, the transpose from one stable sort -- gives the numba path's arrays bit for bit
    (the values too: 1 / deg as one division), forward and transposed, with the sampler's pointer
    and without it (edges out of order). Fails when the values or the transpose's rows are taken
    from anything but each edge's own destination."""
    rng = np.random.default_rng(7 + weighted)
    block = _random_block(rng, 60, 150, 900, weighted, sorted_dst=layout == "ptr")
    if weighted:  # a row whose weights are all zero: its values 0 (not 0 / 0) on both paths
        block.edge_weight[block.edge_index[1] == 3] = 0
    cpu = torch.device("cpu")
    monkeypatch.setenv("GNNIO_SPMM", "")
    ref = spmm.block_csr(block, "mean", torch.float32, cpu)
    monkeypatch.setenv("GNNIO_SPMM", "torch")
    got = spmm.block_csr(block, "mean", torch.float32, cpu)
    assert (ref.impl, got.impl) == ("numba", "torch")
    for a, b in ((ref, got), (ref.t(), got.t())):
        assert torch.equal(a.ptr, b.ptr) and torch.equal(a.col, b.col), a.shape
        assert torch.equal(a.val, b.val), (a.val - b.val).abs().max()


def test_the_torch_paths_weighted_mean_sums_rows_without_atomics_or_syncs(monkeypatch):
    """On a GPU ``index_add_`` / ``scatter_add_`` accumulate with atomics in no fixed order (the
    weighted mean's row sums then change from run to run); the torch path sums each row with
    ``segment_reduce`` instead, reads nothing back to the host, and its values equal the numba
    path's (the test above). Fails when the row sums go back to an atomic scatter."""
    from gnnio.utils.syncs import OpCounter

    rng = np.random.default_rng(3)
    block = _random_block(rng, 80, 200, 1200, weighted=True)
    monkeypatch.setenv("GNNIO_SPMM", "torch")
    with op_names() as seen, OpCounter() as count:
        adj = spmm.block_csr(block, "mean", torch.float32, torch.device("cpu"))
    assert "aten::segment_reduce" in seen.names or "aten.segment_reduce" in seen.names, seen.names
    assert not {n for n in seen.names if "index_add" in n or "scatter" in n}, seen.names
    assert count.syncs == 0, count.sync_ops
    deg = (block.ptr[1:] - block.ptr[:-1]).numpy()
    rows = np.repeat(np.arange(80), deg)
    sums = np.zeros(80, np.float32)
    np.add.at(sums, rows, block.edge_weight.numpy())
    np.testing.assert_allclose(adj.val.numpy(), block.edge_weight.numpy() / sums[rows], rtol=1e-6)


def _csr_and_product(seed, nd, ns, e, f, rows_with_edges):
    """A random ``[nd, ns]`` CSR of ``e`` entries in rows below ``rows_with_edges``, an ``x``
    and ``A @ x`` by the serial kernel: ``(ptr, col, val, x, want)``."""
    rng = np.random.default_rng(seed)
    dst = np.sort(rng.integers(0, rows_with_edges, e))
    ptr = np.searchsorted(dst, np.arange(nd + 1)).astype(np.int64)
    col = rng.integers(0, ns, e).astype(np.int64)
    val = rng.uniform(0.1, 2.0, e).astype(np.float32)
    x = rng.standard_normal((ns, f)).astype(np.float32)
    want = np.zeros((nd, f), np.float32)
    spmm._spmm(ptr, col, val, x, want, 0, nd)
    return ptr, col, val, x, want


def test_a_forked_child_gets_a_pool_of_its_own(monkeypatch):
    """The product's threads do not survive a fork; the child makes new ones (it would wait
    forever on the parent's executor). Numba's kernel on NumPy arrays only: no OpenMP region in
    the child (libgomp's threads do not survive a fork either)."""
    ptr, col, val, x, want = _csr_and_product(3, 300, 500, 4000, 16, rows_with_edges=300)
    monkeypatch.setattr(spmm, "_SERIAL_WORK", 0)
    prev = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        spmm._spmm_threads(ptr, col, val, x, np.empty_like(want))  # the parent's pool exists now
    finally:
        torch.set_num_threads(prev)
    assert spmm._POOL.made

    def child() -> bool:
        torch.set_num_threads(2)
        out = np.empty_like(want)
        spmm._spmm_threads(ptr, col, val, x, out)
        return np.array_equal(out, want)

    assert in_forked_child(child) is True, "the forked child's product hung or differed"


@pytest.mark.parametrize("threads", [2, 3])
def test_threaded_product_writes_the_rows_after_the_last_edge(monkeypatch, threads):
    """The row ranges split the edges evenly, so trailing rows without edges fall after the last
    edge's cut; the last range still runs to the last row and writes its zeros (the output is
    ``empty``: left unwritten, a row would keep whatever the memory held -- NaN here)."""
    nd, f = 40, 4
    # the last 10 rows have no edges
    ptr, col, val, x, want = _csr_and_product(5, nd, 50, 300, f, rows_with_edges=nd - 10)
    monkeypatch.setattr(spmm, "_SERIAL_WORK", 0)
    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = np.full((nd, f), np.nan, np.float32)
        spmm._spmm_threads(ptr, col, val, x, out)
    finally:
        torch.set_num_threads(prev)
    assert np.array_equal(out, want)
    assert not out[-10:].any()


@pytest.mark.parametrize("impl", ["numba", "torch"])
@pytest.mark.parametrize("weighted", [False, True])
def test_self_loop_of_any_weight_joins_each_rows_mean(monkeypatch, impl, weighted):
    """``block_csr(self_loop=c)``: ``A_ij = w_j / (sum_k w_k + c)`` and ``self_val[i] = c /
    (sum_k w_k + c)`` (a row without edges: all on the loop), for a ``c`` other than GCN's 1;
    ``self_loop`` is refused with ``reduce="sum"`` or below 0."""
    monkeypatch.setenv("GNNIO_SPMM", "" if impl == "numba" else "torch")
    rng = np.random.default_rng(11)
    block = _random_block(rng, 20, 45, 90, weighted)
    c = 2.5
    adj = spmm.block_csr(block, "mean", torch.float64, torch.device("cpu"), self_loop=c)
    assert adj.impl == impl
    src, dst = block.edge_index.numpy()
    w = np.ones(len(src)) if block.edge_weight is None else block.edge_weight.double().numpy()
    s = np.zeros(block.num_dst)
    np.add.at(s, dst, w)
    np.testing.assert_allclose(adj.val.numpy(), w / (s[dst] + c), rtol=1e-6)
    np.testing.assert_allclose(adj.self_val.numpy(), c / (s + c), rtol=1e-6)
    for reduce, loop in (("sum", 1.0), ("mean", -1.0)):
        with pytest.raises(ValueError, match="self_loop"):
            spmm.block_csr(block, reduce, torch.float32, torch.device("cpu"), self_loop=loop)
