"""The training math on the CPU (gnnio.train.spmm, gat_csr, dropout, models' layers) against
independent references: edge order, dtypes, weights, self-loop terms and gradients."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gnnio.sampling.base import Block, dst_ptr
from gnnio.train import spmm
from tests.test_spmm import _random_block

CPU = torch.device("cpu")


def _block(rng, nd, ns, e, weighted=True, sort=False, ptr=False):
    return _random_block(rng, nd, ns, e, weighted, sorted_dst=sort, with_ptr=ptr)


def _sorted_copy(block):
    """The block's edges stably sorted by destination (NumPy's stable sort), with its pointer."""
    order = torch.from_numpy(np.argsort(block.edge_index[1].numpy(), kind="stable"))
    ei = block.edge_index[:, order]
    w = None if block.edge_weight is None else block.edge_weight[order]
    return Block(ei, block.num_src, block.num_dst, w, dst_ptr(ei, block.num_dst))


@pytest.mark.parametrize("impl", ["numba", "torch"])
@pytest.mark.parametrize("reduce", ["mean", "sum"])
def test_an_unsorted_block_is_the_stably_sorted_block_bit_for_bit(monkeypatch, impl, reduce):
    """A weighted block without a pointer, its edges out of order, gives the matrix of the same
    edges stably sorted by destination (weights moved with their edges, each row's edge order
    kept): the same pointer, columns and values bit for bit, and the same product."""
    monkeypatch.setenv("GNNIO_SPMM", "" if impl == "numba" else "torch")
    rng = np.random.default_rng(21)
    block = _block(rng, 13, 30, 400)
    # many edges per row with distinct weights: a row's sum rounds differently in another order
    ref = spmm.block_csr(_sorted_copy(block), reduce, torch.float32, CPU)
    got = spmm.block_csr(block, reduce, torch.float32, CPU)
    assert got.impl == impl
    assert torch.equal(got.ptr, ref.ptr) and torch.equal(got.col, ref.col)
    assert torch.equal(got.val, ref.val)
    x = torch.randn(30, 4)
    assert torch.equal(got.matmul(x), ref.matmul(x))


@pytest.mark.parametrize("impl", ["numba", "torch"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_product_of_a_lower_precision_input_is_in_the_matrix_dtype(monkeypatch, impl, dtype):
    """``BlockCSR.matmul`` casts an input in another dtype (autocast's lower precision) to the
    matrix's: a float32 result equal to the product of the upcast input."""
    monkeypatch.setenv("GNNIO_SPMM", "" if impl == "numba" else "torch")
    rng = np.random.default_rng(2)
    adj = spmm.block_csr(_block(rng, 6, 9, 30, sort=True, ptr=True), "mean", torch.float32, CPU)
    x = torch.randn(9, 5).to(dtype)
    out = adj.matmul(x)
    assert out.dtype == torch.float32
    assert torch.equal(out, adj.matmul(x.float()))


def test_sage_without_weights_is_the_plain_mean_whatever_its_weight_norm():
    """``edge_weight_norm="sum"`` applies to weighted blocks only: on a block without weights
    SAGELayer is PyG's ``SAGEConv(aggr="mean")`` (the neighbour mean, not the sum)."""
    from gnnio.train.models import SAGELayer

    torch.manual_seed(0)
    rng = np.random.default_rng(4)
    block = _block(rng, 7, 15, 40, weighted=False, sort=True, ptr=True)
    layer = SAGELayer(3, 4, edge_weight_norm="sum")
    x = torch.randn(15, 3)
    want = layer.conv((x, x[:7]), block.edge_index, size=(15, 7))
    torch.testing.assert_close(layer(x, block), want, rtol=1e-5, atol=1e-6)


def test_gcn_keeps_lin_after_the_product_where_both_orders_cost_the_same():
    """``GCNLayer.transforms_first`` is true only where ``lin`` first costs strictly fewer FLOPs:
    a block with as many sources as destinations and ``in == out`` ties, and keeps the
    product first."""
    from gnnio.train.models import GCNLayer

    block = Block(torch.tensor([[0, 1, 2], [1, 2, 0]]), 3, 3)
    assert not GCNLayer(4, 4).transforms_first(block)
    assert GCNLayer(5, 4).transforms_first(block)  # narrower output: fewer FLOPs first


def _two_edges_per_row():
    """Rows of a tiny attention problem whose logits include exact zeros (integer terms)."""
    from gnnio.train.gat_csr import _Rows

    nd, ns = 4, 6
    dst = torch.tensor([0, 0, 1, 1, 2, 3, 3])
    src = torch.tensor([1, 4, 0, 5, 3, 2, 4])
    ptr = torch._convert_indices_from_coo_to_csr(dst, nd)
    rows = _Rows(ptr, src, dst, (nd, ns), "numba")
    # a_src[j] + a_dst[i] is exactly 0 for edges 4 -> 0 and 5 -> 1 and the loops of 2 and 3
    a_src = torch.tensor(
        [[1.0, 2], [2, -1], [-3, 1], [-1, 0], [-2, 1], [-1, 3]], dtype=torch.float64
    )
    a_dst = torch.tensor([[2.0, -1], [1, 1], [3, -1], [1, 0]], dtype=torch.float64)
    return rows, a_src, a_dst


def test_cpu_attention_gradient_at_a_zero_logit_is_the_leaky_relus():
    """At a logit of exactly 0 the CPU softmax's backward takes leaky ReLU's slope (torch's
    derivative there), as the torch path's autograd does, for edges and loops alike."""
    from gnnio.train.gat_csr import HAVE_NUMBA, _EdgeSoftmax, _softmax_torch

    if not HAVE_NUMBA:
        pytest.skip("needs numba")
    rows, a_src, a_dst = _two_edges_per_row()
    w = torch.tensor([1.0, 2, 0.5, 1, 3, 1, 2], dtype=torch.float64)
    loop_w = torch.tensor([1.0, 0.5, 2, 1], dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    ga = torch.randn(7, 2, generator=g, dtype=torch.float64)
    gl = torch.randn(4, 2, generator=g, dtype=torch.float64)
    grads = []
    for fused in (True, False):
        s, d = a_src.clone().requires_grad_(), a_dst.clone().requires_grad_()
        if fused:
            out = _EdgeSoftmax.apply(s, d, torch.log(w), torch.log(loop_w), rows, 0.2)
        else:
            out = _softmax_torch(s, d, w, loop_w, rows, 0.2)
        grads.append(torch.autograd.grad(out, [s, d], [ga, gl]))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_attention_dropout_draws_the_edges_then_the_loops():
    """GAT's attention dropout is ``F.dropout`` over ``[alpha of the edges in CSR order; alpha of
    the loops]`` (PyG's one edge list, loops appended): the product of those dropped values
    with the sources' rows, computed densely here from the same draws."""
    from gnnio.train.gat_csr import _attend, _softmax_torch

    rows, a_src, a_dst = _two_edges_per_row()
    w, loop_w = torch.ones(7, dtype=torch.float64), torch.ones(4, dtype=torch.float64)
    alpha, alpha_loop = _softmax_torch(a_src, a_dst, w, loop_w, rows, 0.2)
    hs = torch.randn(6, 2, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    torch.manual_seed(5)
    got = _attend(alpha, alpha_loop, hs, rows, lambda a: F.dropout(a, 0.5, training=True))
    torch.manual_seed(5)
    mask = F.dropout(torch.ones(11, 2, dtype=torch.float64), 0.5, training=True)
    assert 0 < int((mask == 0).sum()) < 22  # (the draw drops some values and keeps some)
    a_e, a_l = alpha * mask[:7], alpha_loop * mask[7:]
    want = torch.zeros(4, 2, 3, dtype=torch.float64)
    for e, (j, i) in enumerate(zip(rows.col.tolist(), rows.row.tolist())):
        want[i] += a_e[e, :, None] * hs[j]
    want += a_l[:, :, None] * hs[:4]
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def _small_graph(n=30, e=120, seed=0):
    from gnnio.graph.csr import CSRGraph

    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    keep = src != dst
    return CSRGraph.from_edges(src[keep], dst[keep], n)


def _full_forward(model, g, x):
    """The model's forward over full-neighbourhood blocks of every node, in eval mode."""
    from gnnio.sampling import UniformSampler

    mb = UniformSampler(g, [-1] * model.num_layers, seed=0).sample(torch.arange(g.num_nodes))
    model.eval()
    with torch.no_grad():
        return model(x[mb.input_nodes], mb.blocks)


def test_inference_normalises_the_features_as_the_forward_does():
    """``BlockGNN.inference`` feeds layer 0 the rows ``normalize_input`` gives (``feature_norm=
    "row"``: each row over its sum of absolute values), as the forward pass does."""
    from gnnio.train.models import build_model

    torch.manual_seed(0)
    g = _small_graph()
    x = torch.rand(g.num_nodes, 4) * 10  # (rows far from unit sums: the norm shows)
    model = build_model("sage", 4, 6, 3, num_layers=2, feature_norm="row")
    full = model.inference(g, x, batch_size=8, progress=False)
    torch.testing.assert_close(full, _full_forward(model, g, x), rtol=1e-5, atol=1e-6)


def test_inference_runs_without_attention_dropout_from_a_training_model():
    """``BlockGNN.inference`` is exact (eval mode) when called on a model in training mode: a
    GAT's attention dropout draws nothing, and the result is the eval-mode forward's."""
    from gnnio.train.models import build_model

    torch.manual_seed(0)
    g = _small_graph(seed=1)
    x = torch.randn(g.num_nodes, 4)
    model = build_model("gat", 4, 6, 3, num_layers=2, heads=2, attn_dropout=0.6).train()
    full = model.inference(g, x, batch_size=8, progress=False)
    assert model.training
    torch.testing.assert_close(full, _full_forward(model, g, x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("impl", ["numba", "torch"])
def test_gat_row_with_all_zero_weights_attends_as_without_weights(monkeypatch, impl):
    """A destination whose in-edges all weigh 0 gets equal (tiny) weights on its edges and its
    loop (their mean), so its attention is the unweighted softmax, not all on the loop."""
    from gnnio.train.models import GATLayer

    monkeypatch.setenv("GNNIO_SPMM", "" if impl == "numba" else "torch")
    torch.manual_seed(0)
    rng = np.random.default_rng(6)
    block = _block(rng, 5, 12, 30, sort=True, ptr=True)
    w = block.edge_weight.clone()
    w[block.edge_index[1] == 2] = 0
    assert int((block.edge_index[1] == 2).sum()) >= 2
    layer = GATLayer(3, 4, 2, concat=True, attn_dropout=0.0)
    x = torch.randn(12, 3)
    plain = layer(x, Block(block.edge_index, 12, 5, None, block.ptr))
    weighted = layer(x, Block(block.edge_index, 12, 5, w, block.ptr))
    torch.testing.assert_close(weighted[2], plain[2], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("impl", ["numba", "torch"])
@pytest.mark.parametrize("reduce", ["mean", "sum"])
def test_float32_weights_aggregate_in_the_inputs_float64(monkeypatch, impl, reduce):
    """The matrix's values are computed in the input's dtype: float32 edge weights with a
    float64 input give the float64 weighted mean or sum (row sums and divisions in float64),
    not float32-rounded values."""
    from gnnio.train.models import aggregate

    monkeypatch.setenv("GNNIO_SPMM", "" if impl == "numba" else "torch")
    rng = np.random.default_rng(8)
    block = _block(rng, 6, 10, 40, sort=True, ptr=True)
    x = torch.from_numpy(rng.standard_normal((10, 3)))
    src, dst = block.edge_index.numpy()
    w = block.edge_weight.double().numpy()
    a = np.zeros((6, 10))
    np.add.at(a, (dst, src), w)
    if reduce == "mean":
        a /= np.maximum(a.sum(1, keepdims=True), 1e-300)
    out = aggregate(x, block, reduce)
    assert out.dtype == torch.float64
    np.testing.assert_allclose(out.numpy(), a @ x.numpy(), rtol=1e-13, atol=1e-13)


def _tiny_blocks():
    """A sampled block (more sources than destinations; a self-loop edge, a destination without
    in-edges) and a square one (every node a destination), in CSR order with their pointers."""
    src = torch.tensor([1, 4, 0, 5, 6, 2, 3, 1, 6])
    dst = torch.tensor([0, 0, 1, 1, 1, 2, 2, 2, 3])  # (destination 4 has none; 2 -> 2 a loop)
    sampled = Block(torch.stack([src, dst]), 7, 5, None, dst_ptr(torch.stack([src, dst]), 5))
    s2, d2 = torch.tensor([1, 2, 0, 2, 0, 1, 3]), torch.tensor([0, 0, 1, 1, 2, 3, 3])
    square = Block(torch.stack([s2, d2]), 4, 4, None, dst_ptr(torch.stack([s2, d2]), 4))
    return sampled, square


@pytest.mark.parametrize("impl", ["numba", "torch"])
@pytest.mark.parametrize("name", ["sage", "gcn", "gat", "gin"])
@pytest.mark.parametrize("weighted", [False, True])
def test_layers_pass_gradcheck_in_float64(monkeypatch, impl, name, weighted):
    """Each layer's gradients for its input and every parameter equal finite differences in
    float64 (torch.autograd.gradcheck), on a sampled and a square block -- GCN with ``lin``
    after and before the product -- with a self-loop edge and a row without edges."""
    from torch.func import functional_call

    from gnnio.train.models import GATLayer, GCNLayer, GINLayer, SAGELayer

    monkeypatch.setenv("GNNIO_SPMM", "" if impl == "numba" else "torch")
    torch.manual_seed(0)
    make = {
        "sage": lambda: SAGELayer(3, 2, edge_weight_norm="sum"),
        "gcn": lambda: GCNLayer(3, 2),
        "gat": lambda: GATLayer(3, 4, 2, concat=True, attn_dropout=0.0),
        "gin": lambda: GINLayer(3, 2, 4),
    }
    for block in _tiny_blocks():
        if weighted:
            w = torch.linspace(0.3, 2.0, block.num_edges, dtype=torch.float64)
            block = Block(block.edge_index, block.num_src, block.num_dst, w, block.ptr)
        layer = make[name]().double()
        for p in layer.parameters():  # (PyG zeroes biases and GIN's eps: make them count)
            p.data.uniform_(-1, 1)
        if name == "gcn":
            assert layer.transforms_first(block) == (block.num_src == block.num_dst)
        names = [n for n, _ in layer.named_parameters()]
        params = [p.detach().clone().requires_grad_() for p in layer.parameters()]
        x = torch.randn(block.num_src, 3, dtype=torch.float64, requires_grad=True)

        def fn(x, *ps, layer=layer, block=block, names=names):
            return functional_call(layer, dict(zip(names, ps)), (x, block))

        assert torch.autograd.gradcheck(fn, (x, *params), fast_mode=True)


def test_row_feature_norm_divides_by_the_sum_of_absolute_values():
    """``feature_norm="row"`` divides each row by its L1 norm (absolute values: a row with
    negative entries too), keeping signs, and leaves an all-zero row at 0."""
    from gnnio.train.models import build_model

    model = build_model("sage", 3, 4, 2, num_layers=1, feature_norm="row")
    x = torch.tensor([[1.0, -3.0, 0.0], [-2.0, -2.0, 4.0], [0.0, 0.0, 0.0]])
    want = torch.tensor([[0.25, -0.75, 0.0], [-0.25, -0.25, 0.5], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(model.normalize_input(x), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dropout_of_an_input_without_gradient_scales_in_its_dtype(dtype):
    """The mask-free pass (an input needing no gradient, above the size threshold) gives
    ``F.dropout``'s values bit for bit in float64 too: the kept values scaled by ``1 / (1 - p)``
    rounded in the input's dtype (p = 0.15: 1 / 0.85 differs between float32 and float64)."""
    from gnnio.train.dropout import dropout

    x = torch.randn(70, 90, generator=torch.Generator().manual_seed(2)).to(dtype)
    outs = []
    for fn in (F.dropout, dropout):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(9)
            outs.append((fn(x, p=0.15, training=True), torch.default_generator.get_state()))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
