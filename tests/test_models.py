"""Models over sampled blocks: shapes, gradients, exactness against dense references, weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from gnnio.errors import UsageError
from gnnio.graph.csr import CSRGraph
from gnnio.sampling import UniformSampler
from gnnio.sampling.base import Block, MiniBatch
from gnnio.train.models import MODELS, build_model, full_neighbor_block
from tests.helpers import op_names


def directed_graph(n: int = 40, e: int = 160, seed: int = 0) -> CSRGraph:
    """A random *directed* graph (no symmetrisation), so a wrong message direction shows."""
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    keep = src != dst
    return CSRGraph.from_edges(src[keep], dst[keep], n)


def dense_in_adjacency(g: CSRGraph) -> torch.Tensor:
    """``A[v, u] = 1`` for each edge ``u -> v`` (row v aggregates from its in-neighbours)."""
    src, dst = g.edges()
    a = torch.zeros(g.num_nodes, g.num_nodes)
    a[torch.from_numpy(dst), torch.from_numpy(src)] = 1.0
    return a


def with_weights(mb: MiniBatch, fn) -> MiniBatch:
    blocks = [Block(b.edge_index, b.num_src, b.num_dst, fn(b)) for b in mb.blocks]
    return MiniBatch(mb.seeds, mb.input_nodes, blocks)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("weighted", [False, True])
def test_forward_shape_and_gradients(name, weighted):
    torch.manual_seed(0)
    g = directed_graph(120, 600)
    x_all = torch.randn(g.num_nodes, 12)
    seeds = torch.arange(0, 120, 7)
    mb = UniformSampler(g, [4, 3], seed=1).sample(seeds)
    if weighted:
        mb = with_weights(mb, lambda b: torch.rand(b.num_edges) + 0.1)
    model = build_model(name, 12, 16, 5, num_layers=2, dropout=0.3, heads=2)
    out = model(x_all[mb.input_nodes], mb.blocks)
    assert out.shape == (len(seeds), 5)
    assert torch.isfinite(out).all()
    torch.nn.functional.cross_entropy(out, torch.randint(0, 5, (len(seeds),))).backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None, pname
        assert torch.isfinite(p.grad).all(), pname
    # every layer's weights receive signal
    for i, layer in enumerate(model.layers):
        assert any(p.grad.abs().sum() > 0 for p in layer.parameters()), f"layer {i}"


@pytest.mark.parametrize("name", ["sage", "gin"])
def test_sparse_aggregation_equals_pyg_forward(name):
    """SAGE/GIN aggregate with a sparse product; PyG's own gather-scatter forward must agree."""
    torch.manual_seed(0)
    g = directed_graph(100, 500)
    mb = UniformSampler(g, [6], seed=0).sample(torch.arange(0, 100, 3))
    b = mb.blocks[0]
    x = torch.randn(b.num_src, 7)
    layer = build_model(name, 7, 9, 9, num_layers=1).layers[0]
    ours = layer(x, b)
    pyg = layer.conv((x, x[: b.num_dst]), b.edge_index, size=(b.num_src, b.num_dst))
    torch.testing.assert_close(ours, pyg, rtol=1e-5, atol=1e-5)
    # edges in any order give the same result
    perm = torch.randperm(b.num_edges)
    shuffled = Block(b.edge_index[:, perm], b.num_src, b.num_dst)
    torch.testing.assert_close(layer(x, shuffled), ours, rtol=1e-5, atol=1e-5)


def test_wrong_number_of_blocks_is_an_error():
    g = directed_graph()
    mb = UniformSampler(g, [3, 3], seed=0).sample(torch.arange(5))
    model = build_model("sage", 4, 8, 3, num_layers=3)
    with pytest.raises(ValueError, match="2 blocks for a 3-layer"):
        model(torch.randn(len(mb.input_nodes), 4), mb.blocks)


def _full_batch(g: CSRGraph, seeds: torch.Tensor, layers: int) -> MiniBatch:
    return UniformSampler(g, [-1] * layers, seed=0).sample(seeds)


def test_sage_blocks_equal_dense_reference():
    torch.manual_seed(0)
    g = directed_graph()
    a = dense_in_adjacency(g)
    deg = a.sum(1, keepdim=True)
    mean_op = a / deg.clamp_min(1)  # nodes without in-neighbours aggregate to 0, as in PyG
    x = torch.randn(g.num_nodes, 6)
    model = build_model("sage", 6, 8, 3, num_layers=2, dropout=0.5).eval()
    h = x
    for i, layer in enumerate(model.layers):
        conv = layer.conv
        h = conv.lin_l(mean_op @ h) + conv.lin_r(h)
        if i == 0:
            h = h.relu()
    seeds = torch.tensor([3, 0, 17, 39, 8])
    mb = _full_batch(g, seeds, 2)
    out = model(x[mb.input_nodes], mb.blocks)
    torch.testing.assert_close(out, h[seeds], rtol=1e-5, atol=1e-5)
    # and the reversed direction gives something else (the test can tell directions apart)
    mean_rev = a.t() / a.t().sum(1, keepdim=True).clamp_min(1)
    conv = model.layers[0].conv
    wrong = conv.lin_l(mean_rev @ x) + conv.lin_r(x)
    right = conv.lin_l(mean_op @ x) + conv.lin_r(x)
    assert not torch.allclose(wrong[seeds], right[seeds], atol=1e-3)


def test_gcn_blocks_equal_dense_reference():
    torch.manual_seed(0)
    g = directed_graph()
    a_hat = dense_in_adjacency(g) + torch.eye(g.num_nodes)
    prop = a_hat / a_hat.sum(1, keepdim=True)  # D~^-1 (A + I), row = destination
    x = torch.randn(g.num_nodes, 6)
    model = build_model("gcn", 6, 8, 3, num_layers=2).eval()
    h = x
    for i, layer in enumerate(model.layers):
        conv = layer.conv
        h = prop @ conv.lin(h) + conv.bias
        if i == 0:
            h = h.relu()
    seeds = torch.tensor([1, 2, 30, 12])
    mb = _full_batch(g, seeds, 2)
    out = model(x[mb.input_nodes], mb.blocks)
    torch.testing.assert_close(out, h[seeds], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("weighted", [False, True])
def test_gcn_layer_is_pyg_gcnconv_with_loops_bit_for_bit_and_scatter_free(weighted, monkeypatch):
    """The GCN layer computes what PyG's ``GCNConv(normalize=False)`` computes on the block with
    one appended self-loop per destination and the random-walk weights (the layer as it was),
    bit for bit on the CPU's numba path, gradients included, and on the torch (GPU) path runs no
    scatter or ``index_add`` (atomics on a GPU: results that change from run to run) and no op
    that reads back to the host. Fails when the loop's term, the weights' order or the bias
    changes, or when the sum goes back to a scatter."""
    from gnnio.train.models import GCNLayer
    from gnnio.utils.syncs import OpCounter

    torch.manual_seed(1)
    rng = np.random.default_rng(11)
    nd, ns, e = 120, 300, 1500
    dst = np.sort(rng.integers(0, nd, e))
    src = rng.integers(0, ns, e)
    w = torch.from_numpy(rng.uniform(0.1, 3.0, e).astype(np.float32)) if weighted else None
    ptr = torch.from_numpy(np.searchsorted(dst, np.arange(nd + 1)))
    block = Block(torch.from_numpy(np.stack([src, dst])), ns, nd, w, ptr=ptr)
    layer = GCNLayer(16, 8)
    layer.conv.bias.data.normal_()
    x = torch.randn(ns, 16, requires_grad=True)

    loops = torch.arange(nd)
    ei = torch.cat([block.edge_index, torch.stack([loops, loops])], dim=1)
    ww = torch.cat([torch.ones(e) if w is None else w, torch.ones(nd)])
    ww = ww / torch.zeros(nd).index_add_(0, ei[1], ww)[ei[1]]
    ref = layer.conv(x, ei, ww)[:nd]
    (gref,) = torch.autograd.grad(ref.square().sum(), x)
    assert not layer.transforms_first(block)  # (a sampled block: lin after the product)
    for first in (True, False):  # PyG's order bit for bit; lin after it within rounding
        monkeypatch.setattr(layer, "transforms_first", lambda b, first=first: first)
        monkeypatch.setenv("GNNIO_SPMM", "")
        out = layer(x, block)
        (gout,) = torch.autograd.grad(out.square().sum(), x)
        if first:
            assert torch.equal(out, ref) and torch.equal(gout, gref)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(gout, gref, rtol=1e-5, atol=1e-5)

        monkeypatch.setenv("GNNIO_SPMM", "torch")
        with op_names() as seen, OpCounter() as count:
            out = layer(x, block)
            (gout,) = torch.autograd.grad(out.square().sum(), x)
        assert not {n for n in seen.names if "index_add" in n or "scatter" in n}, seen.names
        assert count.syncs == 0, count.sync_ops
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(gout, gref, rtol=1e-5, atol=1e-5)


def test_gcn_takes_lin_where_it_costs_less():
    """GCNLayer.transforms_first: lin after the product on a sampled block (its GEMM on the
    destinations' rows, not all the sources'); first on a full graph's block whose output is
    narrower than its input (PyG's and DGL's order there); and the forward's GEMM has the rows
    the choice says. Fails when the choice is ignored or inverted."""
    from gnnio.train.models import GCNLayer

    def block_of(nd, ns, e):
        dst = torch.arange(e) % nd
        dst = dst.sort().values
        ptr = torch.searchsorted(dst, torch.arange(nd + 1))
        return Block(torch.stack([torch.arange(e) % ns, dst]), ns, nd, None, ptr=ptr)

    sampled, full = block_of(50, 300, 900), block_of(300, 300, 900)
    wide_to_narrow, narrow_to_wide = GCNLayer(64, 8), GCNLayer(8, 64)
    assert not wide_to_narrow.transforms_first(sampled)
    assert not narrow_to_wide.transforms_first(sampled)
    assert wide_to_narrow.transforms_first(full)
    assert not narrow_to_wide.transforms_first(full)

    class Rows(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if str(func.overloadpacket) in ("aten.mm", "aten.addmm"):
                self.rows = [a.shape[0] for a in args if isinstance(a, torch.Tensor) and
                             a.dim() == 2 and a.shape[1] == 64]  # fmt: skip
            return func(*args, **(kwargs or {}))

    for layer, block, rows in ((wide_to_narrow, sampled, 50), (wide_to_narrow, full, 300)):
        with torch.no_grad(), Rows() as seen:
            layer(torch.randn(300, 64), block)
        assert seen.rows == [rows], (seen.rows, rows)
        # gnnio bench step's floor counts lin's FLOPs on the same rows
        from gnnio.bench.step import batch_work

        net = torch.nn.Module()
        net.layers = torch.nn.ModuleList([layer])
        mb = MiniBatch(torch.arange(block.num_dst), torch.arange(300), [block])
        assert batch_work(net, mb, 0)[0] == 3 * 2.0 * rows * 64 * 8


@pytest.mark.parametrize("impl", ["numba", "torch"])
@pytest.mark.parametrize("weighted", [False, True])
def test_gat_over_csr_rows_equals_pyg_gatconv_with_gradients_and_no_scatter(impl, weighted,
                                                                            monkeypatch):  # fmt: skip
    """GATLayer's attention over the block's CSR rows (gnnio.train.gat_csr) gives PyG
    ``GATConv``'s output on the block with its self-loop edges at weight 0 and one loop per
    destination appended (the layer as it was), and the same gradients for the input and every
    parameter, with both kernels; the torch (GPU) path runs no scatter or ``index_add`` (atomics
    on a GPU) and reads nothing back to the host; 1 and 2 threads give the same bits."""
    from gnnio.train.models import GATLayer

    def _scatter_sum(v, index, n):
        return torch.zeros(n).index_add_(0, index, v)

    from gnnio.utils.syncs import OpCounter

    monkeypatch.setenv("GNNIO_SPMM", "" if impl == "numba" else "torch")
    rng = np.random.default_rng(4)
    nd, ns, e = 90, 260, 1400
    dst = np.sort(rng.integers(0, nd - 3, e))  # the last 3 destinations have no in-edges
    src = rng.integers(0, ns, e)
    src[::17] = dst[::17]  # self-loop edges
    w = torch.from_numpy(rng.uniform(0.1, 3.0, e).astype(np.float32)) if weighted else None
    ptr = torch._convert_indices_from_coo_to_csr(torch.from_numpy(dst), nd)
    block = Block(torch.from_numpy(np.stack([src, dst])), ns, nd, w, ptr=ptr)
    torch.manual_seed(2)
    for concat in (True, False):
        layer = GATLayer(12, 16 if concat else 4, 4, concat=concat, attn_dropout=0.0)
        layer.conv.bias.data.normal_()
        x = torch.randn(ns, 12, requires_grad=True)

        def reference(layer=layer, x=x):  # the pre-change layer: PyG's GATConv, loops appended
            ei = block.edge_index
            keep = (ei[0] != ei[1]).float()
            if w is None:
                ww, loop_w = keep, torch.ones(nd)
            else:
                ww = w.clamp_min(1e-30) * keep
                loop_w = _scatter_sum(ww, ei[1], nd) / _scatter_sum(keep, ei[1], nd).clamp_min(1)
                loop_w = loop_w.clamp_min(1e-30)
            loops = torch.arange(nd)
            ei = torch.cat([ei, torch.stack([loops, loops])], dim=1)
            return layer.conv((x, x[:nd]), ei, edge_attr=torch.cat([ww, loop_w]), size=(ns, nd))

        params = [x, *layer.parameters()]
        want = reference()
        gwant = torch.autograd.grad(want.square().sum(), params)

        with op_names() as seen, OpCounter() as count:
            got = layer(x, block)
            ggot = torch.autograd.grad(got.square().sum(), params)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        for a, b in zip(ggot, gwant):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        assert count.syncs == 0, count.sync_ops
        if impl == "torch":  # (index_add: the CPU's row gathers' backward, see test_gat_take)
            assert not {n for n in seen.names if "scatter" in n}, seen.names
        assert "aten.copy_" not in seen.names  # (``dx[:nd] +=`` copies dx[:nd] onto itself)
        with torch.no_grad():
            torch.set_num_threads(1)
            try:
                one = layer(x, block)
            finally:
                torch.set_num_threads(2)
            assert torch.equal(one, layer(x, block))


def test_gat_take_gathers_rows_with_a_deterministic_backward_on_each_device():
    """gat_csr's row gathers: on the CPU ``index_select`` (backward ``index_add_``, serial),
    elsewhere ``t[idx]`` (on a GPU its backward sorts the indices, while ``index_add_`` -- the
    backward of ``index_select`` there -- adds with atomics). Checked on the meta device."""
    from gnnio.train.gat_csr import _take

    for device, want, never in (("cpu", "aten.index_select", "aten.index_put_"),
                                ("meta", "aten.index", "aten.index_add")):  # fmt: skip
        t = torch.randn(6, 2, device=device, requires_grad=True)
        idx = torch.tensor([0, 5, 5, 1], device=device)
        with op_names() as seen:
            torch.autograd.grad(_take(t, idx).sum(), t)
        assert want in seen.names and never not in seen.names, seen.names


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 30), cols=st.integers(1, 40), e=st.integers(0, 300),
       seed=st.integers(0, 2**31 - 1))  # fmt: skip
def test_gat_transpose_counting_sort_equals_torch_stable_sort(rows, cols, e, seed):
    """GAT's transposed product orders the edges by source: on the CPU's numba path by a
    counting sort, elsewhere by ``torch.sort(stable=True)``. Both give the same pointer, rows
    and order, bit for bit (rows and sources without edges included)."""
    from gnnio.train.gat_csr import HAVE_NUMBA, _Rows

    if not HAVE_NUMBA:
        pytest.skip("needs numba")
    rng = np.random.default_rng(seed)
    dst = torch.from_numpy(np.sort(rng.integers(0, rows, e)))
    src = torch.from_numpy(rng.integers(0, cols, e))
    ptr = torch._convert_indices_from_coo_to_csr(dst, rows)
    got = _Rows(ptr, src, dst, (rows, cols), "numba").t()
    want = _Rows(ptr, src, dst, (rows, cols), "torch").t()
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b), (a, b)


@pytest.mark.parametrize("weighted", [False, True])
def test_gat_softmax_in_numba_equals_the_torch_path(weighted):
    """The CPU's fused attention (``gat_csr._EdgeSoftmax``) gives the torch path's values bit
    for bit, and its gradients to float rounding, with rows without edges, zero-weight
    (self-loop) edges and sources nobody reads; 1 and 2 threads give the same bits."""
    from gnnio.train.gat_csr import HAVE_NUMBA, _EdgeSoftmax, _Rows, _softmax_torch

    if not HAVE_NUMBA:
        pytest.skip("needs numba")
    rng = np.random.default_rng(7)
    nd, ns, e, h = 300, 900, 60000, 4  # (enough work for _by_rows to use two threads)
    dst = torch.from_numpy(np.sort(rng.integers(0, nd - 5, e)))  # 5 rows without edges
    src = torch.from_numpy(rng.integers(0, ns - 7, e))  # 7 sources without edges
    ptr = torch._convert_indices_from_coo_to_csr(dst, nd)
    w = torch.from_numpy(rng.uniform(0.1, 3, e).astype(np.float32)) if weighted else torch.ones(e)
    w[::11] = 0  # self-loop edges: no attention
    loop_w = torch.from_numpy(rng.uniform(0.1, 3, nd).astype(np.float32))
    a = (torch.randn(ns, 2 * h) * 3).requires_grad_()
    ga, gl = torch.randn(e, h), torch.randn(nd, h)

    def run(fused, threads=2):
        a_src, a_dst = a[:, :h], a[:nd, h:]
        rows = _Rows(ptr, src, dst, (nd, ns), "numba")
        old = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            if fused:
                out = _EdgeSoftmax.apply(a_src, a_dst, torch.log(w), torch.log(loop_w), rows, 0.2)
            else:
                out = _softmax_torch(a_src, a_dst, w, loop_w, rows, 0.2)
            (grad,) = torch.autograd.grad(out, [a], [ga, gl])
        finally:
            torch.set_num_threads(old)
        return out[0].detach(), out[1].detach(), grad

    got, want, one = run(True), run(False), run(True, threads=1)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert (got[0][::11] == 0).all()
    torch.testing.assert_close(got[2], want[2], rtol=1e-4, atol=1e-5)  # (~200 edges a row)
    assert all(torch.equal(x, y) for x, y in zip(got, one, strict=True))


@pytest.mark.parametrize("impl", ["numba", "torch"])
def test_gat_gradients_repeat_bit_for_bit_on_the_cpu(impl, monkeypatch):
    """Two threads, the same step several times: the same gradients, bit for bit. The row
    gathers' backward was ``index_put_(accumulate=True)``, whose CPU kernel adds with several
    threads in no fixed order (the input's and ``att_src``'s gradients changed from run to run)."""
    from gnnio.train.models import GATLayer

    monkeypatch.setenv("GNNIO_SPMM", "" if impl == "numba" else "torch")
    rng = np.random.default_rng(1)
    nd, ns, e = 4000, 6000, 40000
    dst = np.sort(rng.integers(0, nd, e))
    src = rng.integers(0, ns, e)
    ptr = torch._convert_indices_from_coo_to_csr(torch.from_numpy(dst), nd)
    block = Block(torch.from_numpy(np.stack([src, dst])), ns, nd, None, ptr=ptr)
    torch.manual_seed(0)
    layer = GATLayer(8, 16, 4, concat=True, attn_dropout=0.0)
    x = torch.randn(ns, 8, requires_grad=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        runs = []
        for _ in range(4):
            out = layer(x, block)
            runs.append(torch.autograd.grad(out.square().sum(), [x, *layer.parameters()]))
    finally:
        torch.set_num_threads(threads)
    for r in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], r))


@pytest.mark.parametrize("name", MODELS)
def test_inference_equals_full_fanout_blocks(name):
    torch.manual_seed(0)
    g = directed_graph(50, 220, seed=3)
    x = np.random.default_rng(0).normal(size=(g.num_nodes, 5)).astype(np.float32)
    model = build_model(name, 5, 8, 4, num_layers=3, heads=2).eval()
    full = model.inference(g, x, batch_size=7, progress=False)
    assert full.shape == (g.num_nodes, 4)
    seeds = torch.arange(g.num_nodes)
    mb = _full_batch(g, seeds, 3)
    out = model(torch.from_numpy(x)[mb.input_nodes], mb.blocks)
    torch.testing.assert_close(out, full, rtol=1e-4, atol=1e-5)


def test_inference_restores_training_mode_and_accepts_tensor_features():
    g = directed_graph()
    model = build_model("sage", 3, 4, 2, num_layers=2)
    model.train()
    x = torch.randn(g.num_nodes, 3)
    a = model.inference(g, x, batch_size=16, progress=False)
    b = model.inference(g, x.numpy(), batch_size=5, progress=False)
    assert model.training
    torch.testing.assert_close(a, b)


@pytest.mark.parametrize("name", ["sage", "gat"])
def test_constant_edge_weights_change_nothing(name):
    """SAGE (self-normalised mean) and GAT (softmax) are invariant to a constant weight."""
    torch.manual_seed(0)
    g = directed_graph(80, 400)
    mb = UniformSampler(g, [5, 5], seed=0).sample(torch.arange(10))
    x = torch.randn(len(mb.input_nodes), 6)
    model = build_model(name, 6, 8, 3, num_layers=2, heads=2).eval()
    plain = model(x, mb.blocks)
    weighted = model(x, with_weights(mb, lambda b: torch.full((b.num_edges,), 2.5)).blocks)
    torch.testing.assert_close(plain, weighted, rtol=1e-5, atol=1e-6)


def test_sage_weighted_mean_and_sum_forms():
    torch.manual_seed(0)
    # node 0 aggregates from 1 and 2 with weights 1 and 3
    block = Block(torch.tensor([[1, 2], [0, 0]]), num_src=3, num_dst=1)
    x = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    w = torch.tensor([1.0, 3.0])
    for norm, expect in (
        ("mean", torch.tensor([[0.25, 0.75]])),
        ("sum", torch.tensor([[1.0, 3.0]])),
    ):
        m = build_model("sage", 2, 2, 2, num_layers=1, edge_weight_norm=norm).eval()
        conv = m.layers[0].conv
        out = m(x, [Block(block.edge_index, 3, 1, w)])
        torch.testing.assert_close(out, conv.lin_l(expect) + conv.lin_r(x[:1]))


def test_gin_weighted_sum_with_unit_weights_equals_plain():
    torch.manual_seed(0)
    g = directed_graph(60, 300)
    mb = UniformSampler(g, [4, 4], seed=0).sample(torch.arange(8))
    x = torch.randn(len(mb.input_nodes), 5)
    model = build_model("gin", 5, 8, 3, num_layers=2).eval()
    ones = with_weights(mb, lambda b: torch.ones(b.num_edges))
    torch.testing.assert_close(model(x, mb.blocks), model(x, ones.blocks))


def test_row_feature_norm():
    model = build_model("sage", 3, 4, 2, num_layers=1, feature_norm="row")
    x = torch.tensor([[1.0, 1.0, 2.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(
        model.normalize_input(x), torch.tensor([[0.25, 0.25, 0.5], [0, 0, 0]])
    )


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"name": "gnn"}, "unknown model"),
        ({"name": "gat", "hidden": 10, "heads": 4}, "divisible"),
        ({"num_layers": 0}, "num_layers"),
        ({"dropout": 1.0}, "dropout"),
        ({"feature_norm": "l2"}, "feature_norm"),
    ],
)
def test_build_model_errors(kwargs, match):
    args = {"name": "sage", "in_dim": 4, "hidden": 8, "out_dim": 2, "num_layers": 2}
    args.update(kwargs)
    with pytest.raises(UsageError, match=match):
        build_model(**args)


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 30),
    e=st.integers(0, 120),
    seed=st.integers(0, 1000),
    data=st.data(),
)
def test_full_neighbor_block_is_exact(n, e, seed, data):
    rng = np.random.default_rng(seed)
    g = CSRGraph.from_edges(rng.integers(0, n, e), rng.integers(0, n, e), n)
    start = data.draw(st.integers(0, n - 1))
    end = data.draw(st.integers(start + 1, n))
    block, src_nodes = full_neighbor_block(g, start, end)
    assert np.array_equal(src_nodes[: end - start], np.arange(start, end))
    assert len(np.unique(src_nodes)) == len(src_nodes) == block.num_src
    assert block.num_dst == end - start
    s, d = block.edge_index.numpy()
    got = sorted(zip(src_nodes[s].tolist(), (d + start).tolist()))
    gs, gd = g.edges()
    want = sorted((int(u), int(v)) for u, v in zip(gs, gd) if start <= v < end)
    assert got == want


@pytest.mark.parametrize("weighted", [False, True])
def test_gat_layer_equals_pyg_self_loop_handling_without_a_mask(weighted):
    """GATLayer keeps a block's self-loop edges at weight 0 and appends the loops itself (no
    data-dependent mask, so no host sync on a GPU); PyG's GATConv(add_self_loops=True) removes the
    self-loop edges and appends loops with the mean weight of the other in-edges. The two agree on
    a block with self-loop edges, repeated edges and a destination without in-edges."""
    import torch.nn.functional as F
    from torch_geometric.utils import softmax

    from gnnio.train.models import GATLayer, _WeightedGATConv
    from gnnio.utils.syncs import OpCounter

    class PyGSelfLoops(_WeightedGATConv):  # the pre-change layer: PyG's own loops, clamped log w
        def edge_update(self, alpha_j, alpha_i, edge_attr, index, ptr, dim_size):
            if edge_attr is None:
                return super().edge_update(alpha_j, alpha_i, edge_attr, index, ptr, dim_size)
            alpha = F.leaky_relu(alpha_j + alpha_i, self.negative_slope)
            alpha = alpha + torch.log(edge_attr.clamp_min(1e-30)).view(-1, 1)
            return softmax(alpha, index, ptr, dim_size)

    torch.manual_seed(0)
    src = torch.tensor([0, 1, 2, 3, 3, 1, 4, 5, 2, 2, 6])
    # self loops 0->0, 1->1, 2->2; node 4 has no in-edges
    dst = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3])
    ns, nd = 7, 5
    w = torch.rand(src.numel()) + 0.1 if weighted else None
    ptr = torch._convert_indices_from_coo_to_csr(dst, nd)  # as the samplers give it
    block = Block(torch.stack([src, dst]), ns, nd, w, ptr=ptr)
    x = torch.randn(ns, 6)
    for concat in (True, False):
        layer = GATLayer(6, 8, 2, concat=concat, attn_dropout=0.0).eval()
        ref = PyGSelfLoops(6, layer.conv.out_channels, heads=2, concat=concat, add_self_loops=True)
        ref.load_state_dict(layer.conv.state_dict())
        with OpCounter() as c:
            got = layer(x, block)
        want = ref.eval()((x, x[:nd]), block.edge_index, edge_attr=w, size=(ns, nd))
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        assert c.syncs == 0, dict(c.sync_ops)
        # without the pointer (LADIES' blocks): sorted once, the same result
        torch.testing.assert_close(layer(x, Block(block.edge_index, ns, nd, w)), got)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", ["gat", "gcn", "sage"])
@pytest.mark.parametrize("weighted", [False, True])
def test_models_on_cuda_equal_cpu_and_repeat_bit_for_bit(name, weighted):
    """On CUDA the block layers (CSR products, segment sums, GAT's per-head products) give the
    CPU's forward and gradients to float rounding, and two runs give the same bits (no atomics:
    issue 24's run-to-run rule)."""
    torch.manual_seed(0)
    g = directed_graph(400, 4000, seed=5)
    mb = UniformSampler(g, [6, 4], seed=0).sample(torch.arange(0, 400, 7))
    if weighted:
        mb = with_weights(mb, lambda b: torch.rand(b.num_edges) + 0.1)
    model = build_model(name, 16, 32, 5, num_layers=2, dropout=0.0)
    x = torch.randn(len(mb.input_nodes), 16)

    def run(device):
        m = model.to(device)
        blocks = [Block(b.edge_index.to(device), b.num_src, b.num_dst,
                        None if b.edge_weight is None else b.edge_weight.to(device),
                        ptr=None if b.ptr is None else b.ptr.to(device)) for b in mb.blocks]  # fmt: skip
        out = m(x.to(device), blocks)
        grads = torch.autograd.grad(out.square().sum(), list(m.parameters()))
        return [t.detach().cpu() for t in (out, *grads)]

    cpu = run("cpu")
    first, second = run("cuda"), run("cuda")
    for a, b, c in zip(cpu, first, second):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
        assert torch.equal(b, c)


@pytest.mark.parametrize("impl", ["numba", "torch"])
@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("weighted", [False, True])
def test_a_block_without_edges_trains(name, weighted, impl, monkeypatch):
    """Seeds without in-edges (every block empty): the layers' row sums and products take empty
    segments (each row its self term only, GAT's attention all on the loop) and the backward
    runs."""
    monkeypatch.setenv("GNNIO_SPMM", "" if impl == "numba" else "torch")
    torch.manual_seed(0)
    empty = torch.zeros((2, 0), dtype=torch.int64)
    w = torch.zeros(0) if weighted else None
    blocks = [Block(empty, 5, 5, w, ptr=torch.zeros(6, dtype=torch.int64)) for _ in range(2)]
    model = build_model(name, 8, 16, 3, num_layers=2, dropout=0.0)
    x = torch.randn(5, 8, requires_grad=True)
    out = model(x, blocks)
    assert out.shape == (5, 3) and torch.isfinite(out).all()
    (g,) = torch.autograd.grad(out.sum(), x)
    assert torch.isfinite(g).all()
