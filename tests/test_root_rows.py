"""A layer's aggregation and root rows with one backward (gnnio.train.spmm.block_matmul_root):
the same values and gradients as the plain slice ``x[:D]`` beside ``block_matmul``, bit for bit,
in SAGE, GCN and GIN; and no full-size zero gradient or full-size add in the backward (the
reason it exists: measured ~10 ms of a 135 ms GraphSAGE step on the 2^21 graph)."""

from __future__ import annotations

import os
from unittest import mock

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from gnnio.train import spmm
from gnnio.train.models import GCNLayer, GINLayer, SAGELayer, aggregate
from tests.test_spmm import _random_block


def _sage_ref(layer, x, block):
    """SAGELayer as it was: the aggregation, then ``torch.addmm`` with the sliced root rows."""
    reduce = "mean" if block.edge_weight is None else layer.edge_weight_norm
    agg = aggregate(x, block, reduce)
    return torch.addmm(layer.conv.lin_l(agg), x[: block.num_dst], layer.conv.lin_r.weight.t())


def _gcn_ref(layer, x, block):
    """GCNLayer with ``lin`` first (PyG's order), the loop's rows sliced."""
    h = layer.conv.lin(x[: block.num_src])
    adj = spmm.block_csr(block, "mean", x.dtype, h.device, self_loop=1.0)
    out = spmm.block_matmul(h, adj) + adj.self_val[:, None] * h[: block.num_dst]
    return out + layer.conv.bias


def _gcn_after_ref(layer, x, block):
    """GCNLayer with ``lin`` after the product (where that costs less), the loop's rows sliced."""
    adj = spmm.block_csr(block, "mean", x.dtype, x.device, self_loop=1.0)
    agg = spmm.block_matmul(x, adj) + adj.self_val[:, None] * x[: block.num_dst]
    return layer.conv.lin(agg) + layer.conv.bias


def _gcn(first: bool):
    """A GCNLayer that takes ``lin`` first (``first``) or after the product, whatever the block."""
    layer = GCNLayer(12, 8)
    layer.transforms_first = lambda block: first
    return layer


def _gin_ref(layer, x, block):
    agg = aggregate(x, block, "sum")
    return layer.conv.nn(agg + (1 + layer.conv.eps) * x[: block.num_dst])


LAYERS = {
    "sage": (lambda: SAGELayer(12, 8), _sage_ref),
    "gcn": (lambda: _gcn(True), _gcn_ref),
    "gcn_after": (lambda: _gcn(False), _gcn_after_ref),
    "gin": (lambda: GINLayer(12, 8, 16), _gin_ref),
}


def _grads(layer, fn, x, block, g):
    layer.zero_grad(set_to_none=True)
    xx = x.detach().clone().requires_grad_(True)
    out = fn(layer, xx, block) if fn is not None else layer(xx, block)
    (out * g).sum().backward()
    return out.detach(), xx.grad, [p.grad.clone() for p in layer.parameters()]


@pytest.mark.parametrize("impl", ["numba", "torch"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_layers_equal_the_sliced_root_bit_for_bit(name, weighted, impl):
    """Forward, the input's gradient and every parameter's, against the layer written with the
    plain slice; several blocks, rows without in-edges, x longer than the block's sources."""
    make, ref = LAYERS[name]
    with mock.patch.dict(os.environ, {"GNNIO_SPMM": "torch" if impl == "torch" else ""}):
        for seed in range(4):
            rng = np.random.default_rng(seed)
            nd, ns = int(rng.integers(1, 30)), int(rng.integers(30, 90))
            block = _random_block(rng, nd, ns, int(rng.integers(0, 400)), weighted)
            torch.manual_seed(seed)
            layer = make()
            x = torch.randn(ns + 3, 12)
            g = torch.randn(nd, 8)
            got, want = _grads(layer, None, x, block, g), _grads(layer, ref, x, block, g)
            assert torch.equal(got[0], want[0]), (name, seed)
            assert torch.equal(got[1], want[1]), (name, seed)
            for a, b in zip(got[2], want[2], strict=True):
                assert torch.equal(a, b), (name, seed)


def test_either_output_alone_gets_its_gradient():
    """A loss of the aggregation alone, or of the root rows alone (the other output unused)."""
    rng = np.random.default_rng(3)
    block = _random_block(rng, 7, 20, 60, False)
    x = torch.randn(20, 5, dtype=torch.float64)
    for pick in (0, 1):
        adj64 = spmm.block_csr(block, "mean", torch.float64, torch.device("cpu"))
        xx = x.clone().requires_grad_(True)
        out = spmm.block_matmul_root(xx, adj64)[pick]
        out.square().sum().backward()
        if pick == 1:  # the aggregation unused: no transpose built, no product of zeros
            assert adj64._t is None
        yy = x.clone().requires_grad_(True)
        want = spmm.block_matmul(yy, adj64) if pick == 0 else yy[:7]
        want.square().sum().backward()
        assert torch.equal(xx.grad, yy.grad), pick
    xx = x.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda t: spmm.block_matmul_root(t, adj64), (xx,))


def test_the_backward_allocates_no_full_size_zero_gradient_and_adds_no_full_size_tensors():
    """The backward of a layer >= 1 (its input needs a gradient): no ``slice_backward`` (a zero
    tensor as large as the input, the root rows copied in) and no add of two input-sized
    gradients. Fails when the layers slice their root rows in autograd again."""
    rng = np.random.default_rng(0)
    nd, ns, f = 16, 96, 12
    block = _random_block(rng, nd, ns, 300, False)
    for name, (make, _) in LAYERS.items():
        layer = make()
        x = torch.randn(ns, f, requires_grad=True)
        out = layer(x, block)
        with _FullAdds((ns, f)) as spy:
            F.relu(out).sum().backward()
        assert x.grad is not None and x.grad.shape == (ns, f)
        assert "aten.slice_backward" not in spy.names, name
        assert "aten.copy_" not in spy.names, name  # (``gx[:d] += g`` copies gx[:d] onto itself)
        assert not spy.adds, (name, spy.adds)


class _FullAdds(TorchDispatchMode):
    """The ATen ops run inside (``names``), and the adds of two tensors of ``shape``."""

    def __init__(self, shape):
        super().__init__()
        self.shape, self.names, self.adds = tuple(shape), set(), []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        self.names.add(name)
        two = [a for a in args[:2] if isinstance(a, torch.Tensor)]
        if name in ("aten.add", "aten.add_") and len(two) == 2:
            if all(tuple(a.shape) == self.shape for a in two):
                self.adds.append(str(func))
        return func(*args, **(kwargs or {}))


def test_without_a_gradient_no_custom_backward_is_recorded(monkeypatch):
    """Layer 0 (the features need no gradient), and any input under ``no_grad``: the plain
    product and a view of the rows, not the two-output function (its call costs host time)."""
    rng = np.random.default_rng(1)
    block = _random_block(rng, 5, 20, 40, False)
    adj = spmm.block_csr(block, "sum", torch.float32, torch.device("cpu"))
    calls = []
    real = spmm._BlockMatmulRoot.forward
    monkeypatch.setattr(spmm._BlockMatmulRoot, "forward",
                        staticmethod(lambda ctx, *a: calls.append(1) or real(ctx, *a)))  # fmt: skip
    x = torch.randn(20, 4)
    agg, xd = spmm.block_matmul_root(x, adj)
    assert agg.grad_fn is None and xd.grad_fn is None
    assert xd.data_ptr() == x.data_ptr() and xd.shape == (5, 4)
    with torch.no_grad():
        agg2, xd2 = spmm.block_matmul_root(x.clone().requires_grad_(True), adj)
    assert torch.equal(agg2, agg) and torch.equal(xd2, xd)
    assert not calls
    spmm.block_matmul_root(x.clone().requires_grad_(True), adj)
    assert calls  # (the spy sees the function where it is used)


@pytest.mark.parametrize("impl", ["numba", "torch"])
@pytest.mark.parametrize("name", ["sage", "gcn", "gin"])
def test_layers_under_autocast_equal_the_sliced_root(name, impl, monkeypatch):
    """Under ``torch.autocast`` (bfloat16 on the CPU here; float16 on a GPU alike) ``lin_l``'s
    result is in the lower precision while the root rows and ``lin_r``'s weight are not: SAGE's
    in-place ``addmm_`` (not an autocast op) must not meet them, or it raises a dtype mismatch
    where ``torch.addmm`` (an autocast op) cast them. Same values and gradients as before.
    The torch (GPU) path's CSR product stays in float32 (``spmm.sparse_mm``): autocast's cast of
    it failed (no bfloat16 CSR product on the CPU; a float16 gradient against the float32 CSR
    in a GPU's backward)."""
    monkeypatch.setenv("GNNIO_SPMM", "" if impl == "numba" else "torch")
    make, ref = LAYERS[name]
    rng = np.random.default_rng(2)
    block = _random_block(rng, 9, 40, 150, False)
    torch.manual_seed(0)
    layer = make()
    x = torch.randn(40, 12)
    g = torch.randn(9, 8)

    def autocast(fn):
        def run(layer, x, block):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = layer(x, block) if fn is None else fn(layer, x, block)
            return out.float()

        return run

    got = _grads(layer, autocast(None), x, block, g)
    want = _grads(layer, autocast(ref), x, block, g)
    if name == "gcn":  # lin first: the root rows' gradient (bfloat16) is added into the
        # product's in float32 here, in bfloat16 after the cast in the slicing reference
        same = lambda a, b: torch.testing.assert_close(a, b, rtol=2e-2, atol=1e-2)  # noqa: E731
    else:
        same = lambda a, b: torch.equal(a, b) or pytest.fail("not bit for bit")  # noqa: E731
    same(got[0], want[0])
    same(got[1], want[1])
    for a, b in zip(got[2], want[2], strict=True):
        same(a, b)


@pytest.mark.parametrize("impl", ["numba", "torch"])
@pytest.mark.parametrize("weighted", [False, True])
def test_gat_runs_under_autocast(impl, weighted, monkeypatch):
    """GAT under ``torch.autocast``: the softmax comes out in float32 (``log w`` promotes it)
    while ``hs`` is in the lower precision; the weighted product runs in float32 (as the other
    layers' CSR product), on both paths. It raised before (a dtype mismatch in
    ``spmm.sparse_mm`` on the torch path, bfloat16 ``.numpy()`` on the numba one)."""
    from gnnio.train.models import GATLayer

    monkeypatch.setenv("GNNIO_SPMM", "" if impl == "numba" else "torch")
    rng = np.random.default_rng(2)
    block = _random_block(rng, 9, 40, 150, weighted)
    torch.manual_seed(0)
    layer = GATLayer(12, 8, 2, True, 0.0)
    x = torch.randn(40, 12, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x, block)
    ref = layer(x, block)
    torch.testing.assert_close(out.float(), ref, rtol=5e-2, atol=5e-2)
    out.float().sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
