"""The models' options the exactness tests of test_models.py run at their defaults: GAT's
attention dropout, the row feature norm, and the input decoding of full-neighbour inference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import gnnio.train.models as models
from gnnio.graph.csr import CSRGraph
from gnnio.graph.feature_dtype import FeatureCodec
from gnnio.sampling.base import Block
from gnnio.train.models import GATLayer, build_model


def _gat_block(weighted: bool):
    """A block in CSR order with self-loop edges and a destination without in-edges."""
    rng = np.random.default_rng(7)
    nd, ns, e = 12, 30, 60
    dst = np.sort(rng.integers(0, nd - 1, e))
    src = rng.integers(0, ns, e)
    src[::7] = dst[::7]
    w = torch.from_numpy(rng.uniform(0.1, 3.0, e).astype(np.float32)) if weighted else None
    ptr = torch._convert_indices_from_coo_to_csr(torch.from_numpy(dst), nd)
    return Block(torch.from_numpy(np.stack([src, dst])), ns, nd, w, ptr=ptr)


@pytest.mark.parametrize("weighted", [False, True])
def test_gat_attention_dropout_masks_edges_then_loops_in_training_only(weighted, monkeypatch):
    """With ``attn_dropout > 0`` the attention is dropped in training only, one mask entry per
    edge and head in the block's CSR order and then one per loop: PyG's ``GATConv`` on the same
    edge list (the edges, then the loops) with the same mask gives the same output. The mask is
    a fixed tensor here (``models.dropout`` patched), so the order is what is checked."""
    block = _gat_block(weighted)
    ns, nd, e, heads = block.num_src, block.num_dst, block.num_edges, 2
    mask = (torch.rand(e + nd, heads, generator=torch.Generator().manual_seed(1)) > 0.5) * 2.0
    calls = []

    def fixed_dropout(a, p, training):
        calls.append((tuple(a.shape), p, training))
        return a * mask if training and p > 0 else a

    monkeypatch.setattr(models, "dropout", fixed_dropout)
    torch.manual_seed(0)
    layer = GATLayer(6, 8, heads, concat=True, attn_dropout=0.5)
    x = torch.randn(ns, 6)
    ei, w = block.edge_index, block.edge_weight
    keep = (ei[0] != ei[1]).float()
    if w is None:
        ww, loop_w = keep, torch.ones(nd)
    else:
        ww = w * keep
        n = torch.zeros(nd).index_add_(0, ei[1], ww)
        loop_w = n / torch.zeros(nd).index_add_(0, ei[1], keep).clamp_min(1)
        loop_w = loop_w.clamp_min(1e-30)  # (node nd - 1: no in-edges)
    loops = torch.arange(nd)
    ref_ei = torch.cat([ei, torch.stack([loops, loops])], dim=1)
    for training in (True, False):
        layer.train(training)
        calls.clear()
        got = layer(x, block)
        assert calls == ([((e + nd, heads), 0.5, True)] if training else [])
        want = layer.conv((x, x[:nd]), ref_ei, edge_attr=torch.cat([ww, loop_w]), size=(ns, nd))
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    layer.eval()
    plain = GATLayer(6, 8, heads, concat=True, attn_dropout=0.0).eval()
    plain.load_state_dict(layer.state_dict())
    torch.testing.assert_close(layer(x, block), plain(x, block))  # eval: no attention dropout


def test_row_feature_norm_divides_by_the_sum_of_absolute_values():
    """``feature_norm="row"``: each row over its L1 norm (negative entries count by their
    magnitude; a row summing to 0 with nonzero entries is still scaled)."""
    model = build_model("sage", 3, 4, 2, num_layers=1, feature_norm="row")
    x = torch.tensor([[1.0, -1.0, 2.0], [-3.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    want = torch.tensor([[0.25, -0.25, 0.5], [-0.75, 0.0, 0.25], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(model.normalize_input(x), want)


def _ring(n: int) -> CSRGraph:
    src = np.arange(n)
    return CSRGraph.from_edges(np.concatenate([src, src]),
                               np.concatenate([(src + 1) % n, (src + 3) % n]), n)  # fmt: skip


@pytest.mark.parametrize("feature_norm", ["none", "row"])
def test_inference_decodes_and_normalises_the_stored_rows(feature_norm):
    """Full-neighbour inference reads layer 0's rows as the stored (int8) rows and decodes and
    normalises them as a training batch's rows are: the same logits as from the float32 rows."""
    rng = np.random.default_rng(0)
    n, f = 20, 5
    q = rng.integers(-128, 128, (n, f), dtype=np.int8)
    scale = rng.uniform(0.01, 0.1, f).astype(np.float32)
    zero = rng.uniform(-5, 5, f).astype(np.float32)
    codec = FeatureCodec("int8", scale, zero)
    decoded = (q.astype(np.float32) - zero) * scale
    torch.manual_seed(0)
    model = build_model("sage", f, 8, 3, num_layers=2, feature_norm=feature_norm)
    plain = build_model("sage", f, 8, 3, num_layers=2, feature_norm=feature_norm)
    plain.load_state_dict(model.state_dict())
    model.set_feature_codec(codec)
    g = _ring(n)
    got = model.inference(g, q, batch_size=6, progress=False)
    want = plain.inference(g, decoded, batch_size=6, progress=False)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
