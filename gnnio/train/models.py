"""GNN models over sampled mini-batch blocks: GraphSAGE (mean), GCN, GAT, GIN.

Every model is a stack of PyG layers applied block by block (see :mod:`gnnio.sampling.base` for the
id spaces). For layer ``l`` with block ``b`` the layer reads the source rows ``x[:b.num_src]`` and
writes the destination rows; destination nodes are a prefix of the source nodes, so
``x_dst = x[:b.num_dst]`` and the output of layer ``l`` is the input of layer ``l + 1``::

    x = batch.x                                    # [S, F], rows = batch.input_nodes
    for layer, b in zip(model.layers, batch.blocks):
        x = layer(x[:b.num_src], b)                # [b.num_dst, hidden]
    # x: [len(batch.seeds), num_classes] logits

How each layer handles the bipartite block and per-edge weights ``b.edge_weight``:

* **SAGE** — PyG ``SAGEConv(aggr="mean")``'s weights and update,
  ``h_i = W_l · mean_{j in N(i)} x_j + W_r · x_i``, with the aggregation :func:`aggregate`'s product
  (one sparse ``[num_dst, num_src]`` by dense product, so no ``[E, in_dim]`` message buffer; equal
  to ``SAGEConv.forward((x_src, x_dst), edge_index, size=(num_src, num_dst))``, which the tests
  check). SAGEConv takes no edge weights; with weights two forms exist (``edge_weight_norm``):
  ``"mean"`` (default) ``sum_j w_j x_j / sum_j w_j``, the self-normalised (Hajek) form of Song &
  Jiang's Eq. 1 estimator — it needs only ``w_j = 1/q_j`` and no global degree, and equals the
  plain mean when all weights are equal; ``"sum"`` ``sum_j w_j x_j``, the exact Horvitz-Thompson
  form of Eq. 1, for samplers whose weights already hold ``1/(deg(i) q_j)``.
* **GCN** — ``GCNConv`` has no bipartite mode and its symmetric normalisation needs each source's
  *true* degree, which a sampled block does not carry. gnnio uses the random-walk ("GCN
  aggregator" of Hamilton et al.) normalisation ``h_i = W · (x_i + sum_j w_j x_j) / (1 + sum_j
  w_j)`` (``w = 1`` without weights), i.e. ``D~^-1 (A + I) X W`` with full neighbourhoods: a
  ``GCNConv(normalize=False)`` is run on the source set with one self-loop per destination node and
  these precomputed edge weights, and its output sliced to ``[:num_dst]`` -- computed as
  ``GCNConv``'s ``lin``, one CSR product of :mod:`gnnio.train.spmm` with the loop's term added
  (``block_csr(self_loop=1)``) and its ``bias``: the same sums in the same order as PyG's
  gather-scatter, without the ``[E, out]`` message buffer or a scatter's atomics on a GPU.
  Deviation from PyG: ``lin`` goes after the product where that costs fewer FLOPs
  (:meth:`GCNLayer.transforms_first`; DGL's ``GraphConv`` makes the same choice by width). In a
  sampled block it always does, since ``lin`` then runs on the ``num_dst`` rows instead of all
  ``num_src``. The same function, rounded in another order (equal to PyG's within 1e-5).
* **GAT** — ``GATConv`` on ``(x_src, x_dst)`` with ``size=(num_src, num_dst)``; PyG then adds
  self-loops only for ``i < min(size) = num_dst``, which are the right nodes because destination
  local ids equal source local ids (prefix rule). With weights the attention becomes
  ``softmax_j(e_ij + log w_j)`` = ``w_j exp(e_ij) / sum_k w_k exp(e_ik)`` (importance-weighted,
  self-normalised); a self-loop gets the mean weight of its node's in-edges. Computed over the
  block's CSR rows (:mod:`gnnio.train.gat_csr`: segment maxima and sums, one product per head,
  no atomic scatter, no ``[E, heads, C]`` message buffer on the CPU).
* **GIN** — PyG ``GINConv``'s MLP and learnable ``eps``: ``h_i = MLP((1 + eps) x_i + sum_j w_j
  x_j)``, the sum again :func:`aggregate`'s product; with ``w = 1/q_j`` the weighted sum is the unbiased
  (Horvitz-Thompson) estimate of the full neighbour sum.

Dropout is applied to the input of every layer (features included), ReLU between layers; on the
CPU by :func:`gnnio.train.dropout.dropout` (``F.dropout``'s result and random stream, faster).
:meth:`BlockGNN.inference` runs the same layers layer by layer over all nodes with all neighbours
(exact evaluation, no sampling).
"""

from __future__ import annotations

import math
from typing import cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import GATConv, GCNConv, GINConv, SAGEConv
from torch_geometric.utils import softmax

from ..errors import UsageError
from ..features.base import FeatureStore
from ..graph.csr import CSRGraph
from ..sampling.base import Block
from ..utils.progress import bar
from ..utils.pyg_templates import remove_at_exit
from .decode import FeatureDecoder
from .dropout import dropout
from .gat_csr import gat_attention
from .model_names import EDGE_WEIGHT_NORMS, FEATURE_NORMS, MODELS
from .spmm import block_csr, block_matmul, block_matmul_root, first_rows

remove_at_exit()  # PyG writes its layers' generated modules to /tmp and never deletes them

__all__ = [
    "MODELS",
    "BlockGNN",
    "GATLayer",
    "GCNLayer",
    "GINLayer",
    "SAGELayer",
    "aggregate",
    "build_model",
    "count_parameters",
    "full_neighbor_block",
]


def aggregate(x: torch.Tensor, block: Block, reduce: str) -> torch.Tensor:
    """Neighbour aggregation of a block as one sparse-dense product ``A @ x[:num_src]``.

    ``A`` is ``[num_dst, num_src]`` (row = destination) with, per edge ``j -> i`` of weight ``w_j``
    (1 without ``block.edge_weight``): ``reduce="sum"`` ``A_ij = w_j``; ``reduce="mean"``
    ``A_ij = w_j / sum_k w_k`` over the in-edges of ``i`` (the plain mean without weights).
    Destinations without in-edges get 0. Returns ``[num_dst, F]``; differentiable in ``x``.
    Built from the block's CSR row pointer where the sampler gave one, and computed by the
    kernels of :mod:`gnnio.train.spmm` (numba on the CPU, ``torch.sparse.mm`` on a GPU).
    """
    return block_matmul(x, block_csr(block, reduce, x.dtype, x.device))


class SAGELayer(nn.Module):
    """GraphSAGE-mean over one block (see module docstring for the weighted form).

    Parameters and update are PyG's ``SAGEConv(aggr="mean")`` (``lin_l``, ``lin_r``); the neighbour
    aggregation is :func:`aggregate`'s sparse-matrix product rather than PyG's gather-scatter, so no
    ``[E, in_dim]`` message tensor is materialised (it is the largest buffer of a batch with wide
    features). Tests check it equals ``SAGEConv.forward`` on the same block. SAGE, GCN and GIN
    take the product with their root rows ``x[:num_dst]``
    (:func:`~gnnio.train.spmm.block_matmul_root`: one backward for both).
    """

    def __init__(self, in_dim: int, out_dim: int, edge_weight_norm: str = "mean"):
        super().__init__()
        self.conv = SAGEConv(in_dim, out_dim, aggr="mean")
        self.edge_weight_norm = edge_weight_norm

    def forward(self, x: torch.Tensor, block: Block) -> torch.Tensor:
        reduce = "mean" if block.edge_weight is None else self.edge_weight_norm
        agg, xd = block_matmul_root(x, block_csr(block, reduce, x.dtype, x.device))
        root = self.conv.lin_r
        out = self.conv.lin_l(agg)
        if root.bias is None:  # lin_r(x) added in place into lin_l's result: the same product
            # as torch.addmm(lin_l(agg), ...) without its copy of lin_l(agg) into a new tensor
            if out.dtype == xd.dtype:
                return out.addmm_(xd, root.weight.t())
            # under torch.autocast lin_l's result is in the lower precision: addmm_ is no
            # autocast op (a dtype mismatch), torch.addmm casts its operands
            return torch.addmm(out, xd, root.weight.t())
        return out + root(xd)


class GCNLayer(nn.Module):
    """GCN with random-walk normalisation over one block (see module docstring)."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.conv = GCNConv(in_dim, out_dim, normalize=False, add_self_loops=False)

    def transforms_first(self, block: Block) -> bool:
        """Whether ``lin`` comes before the product on ``block``: where that costs fewer FLOPs,
        ``num_src * in * out + E * out`` against ``num_dst * in * out + E * in``."""
        i, o, e = self.conv.lin.in_channels, self.conv.lin.out_channels, block.num_edges
        return block.num_src * i * o + e * o < block.num_dst * i * o + e * i

    def forward(self, x: torch.Tensor, block: Block) -> torch.Tensor:
        # GCNConv(normalize=False)'s own steps -- lin, the weighted sum over the in-edges and one
        # self-loop per destination, bias -- with the sum as one CSR product (block_csr's
        # self_loop): in PyG's order (a row's edges, then its loop), no [E, out] message buffer,
        # and no scatter, whose atomics on a GPU change the last bits from run to run; lin
        # after the product where that is cheaper (module docstring)
        if self.transforms_first(block):
            h = self.conv.lin(first_rows(x, block.num_src))
            # (x's dtype: under autocast h is in the lower precision, the product is not)
            adj = block_csr(block, "mean", x.dtype, h.device, self_loop=1.0)
            agg, hd = block_matmul_root(h, adj)
            out = agg + cast(torch.Tensor, adj.self_val)[:, None] * hd  # self_loop: set
        else:
            adj = block_csr(block, "mean", x.dtype, x.device, self_loop=1.0)
            agg, xd = block_matmul_root(x, adj)
            out = self.conv.lin(agg + cast(torch.Tensor, adj.self_val)[:, None] * xd)
        return out if self.conv.bias is None else out + self.conv.bias


class _WeightedGATConv(GATConv):
    """GATConv whose ``edge_attr`` (when the layer has no ``edge_dim``) is a ``[E]`` weight vector
    multiplying the unnormalised attention: ``alpha_ij = softmax_j(leaky_relu(e_ij) + log w_j)``.
    A weight of 0 gives ``log 0 = -inf``: the edge gets no attention at all (how
    :class:`GATLayer` drops self-loop edges without a data-dependent mask). :class:`GATLayer`
    holds its parameters and computes the same over the block's CSR rows
    (:func:`gnnio.train.gat_csr.gat_attention`); called on an edge list it is the reference the
    tests compare with."""

    def edge_update(self, alpha_j, alpha_i, edge_attr, index, ptr, dim_size):
        if edge_attr is None or self.lin_edge is not None:
            return super().edge_update(alpha_j, alpha_i, edge_attr, index, ptr, dim_size)
        alpha = alpha_j if alpha_i is None else alpha_j + alpha_i
        alpha = F.leaky_relu(alpha, self.negative_slope)
        alpha = alpha + torch.log(edge_attr).view(-1, 1)
        alpha = softmax(alpha, index, ptr, dim_size)
        return dropout(alpha, p=self.dropout, training=self.training)


class GATLayer(nn.Module):
    """GAT over one block; ``heads`` attention heads, concatenated (inner) or averaged (last).

    PyG's ``GATConv(add_self_loops=True)`` removes the self-loop edges with a boolean mask (two
    host synchronisations per layer on a GPU: the kept edges' count is data-dependent) and then
    appends one loop per destination node, its weight the mean of the node's other in-edges. This
    layer gives the same attention without the mask: a self-loop edge of the block stays in place
    with weight 0 (``log 0 = -inf``, so ``exp`` gives it exactly no attention) and the loops are
    appended here, with PyG's ``fill_value="mean"`` computed over the kept edges. Results equal
    PyG's to float rounding (tested in tests/test_models.py, gradients included); with
    ``attn_dropout > 0`` the dropout draws one mask entry per edge and head (in the block's CSR
    order, then the loops), kept self-loop edges included, so its random stream differs from
    PyG's. Computed
    over the block's CSR rows without a scatter (:mod:`gnnio.train.gat_csr`)."""

    def __init__(self, in_dim: int, out_dim: int, heads: int, concat: bool, attn_dropout: float):
        super().__init__()
        per_head = out_dim // heads if concat else out_dim
        self.conv = _WeightedGATConv(
            in_dim, per_head, heads=heads, concat=concat, dropout=attn_dropout, add_self_loops=False
        )

    def forward(self, x: torch.Tensor, block: Block) -> torch.Tensor:
        ns, nd = block.num_src, block.num_dst
        conv = self.conv
        heads, c = conv.heads, conv.out_channels
        # GATConv's steps over the block's CSR rows (gnnio.train.gat_csr): no atomics, no
        # [E, heads, C] message buffer on the CPU; the destinations' features are the sources'
        # first rows (GATConv transforms x[:nd] again: the same rows, to float rounding)
        xs = first_rows(x, ns)
        hs = conv.lin(xs).view(ns, heads, c)
        # the attention terms (hs * att).sum(-1) as x @ (W^T att), sources' and destinations'
        # in one product: no [rows, heads, C] products (nor their backward); the same sums in
        # another order
        wt = conv.lin.weight.view(heads, c, -1)
        att = torch.cat([conv.att_src, conv.att_dst], 1).view(2 * heads, c, 1)
        a = xs @ (wt.repeat(2, 1, 1) * att).sum(1).t()
        a_src, a_dst = a[:, :heads], a[:nd, heads:]
        adj = block_csr(block, "sum", x.dtype, x.device)  # CSR order; val: the weights, or 1
        keep = (adj.col != adj.row).to(x.dtype)  # self-loop edges: weight 0 (PyG removes them)
        if block.edge_weight is None:
            w, loop_w = keep, x.new_ones(nd)
        else:
            w = adj.val.clamp_min(1e-30) * keep
            n = torch.segment_reduce(torch.stack([w, keep], 1), "sum", offsets=adj.ptr,
                                     unsafe=True)  # fmt: skip
            loop_w = n[:, 0] / n[:, 1].clamp_min(1)
            loop_w = loop_w.clamp_min(1e-30)  # PyG: the mean of no edges is 0, clamped as above
        p = conv.dropout
        drop = (lambda a: dropout(a, p=p, training=True)) if self.training and p > 0 else None
        out = gat_attention(hs, a_src, a_dst, adj, w, loop_w, conv.negative_slope, drop)
        out = out.reshape(nd, heads * c) if conv.concat else out.mean(dim=1)
        return out if conv.bias is None else out + conv.bias


class GINLayer(nn.Module):
    """GIN (learnable eps, 2-layer MLP) over one block: PyG ``GINConv``'s parameters and update,
    with the (weighted) neighbour sum as :func:`aggregate`'s product (no ``[E, in_dim]`` buffer)."""

    def __init__(self, in_dim: int, out_dim: int, hidden: int):
        super().__init__()
        mlp = nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, out_dim))
        self.conv = GINConv(mlp, train_eps=True)

    def forward(self, x: torch.Tensor, block: Block) -> torch.Tensor:
        agg, xd = block_matmul_root(x, block_csr(block, "sum", x.dtype, x.device))
        return self.conv.nn(agg + (1 + self.conv.eps) * xd)


class BlockGNN(nn.Module):
    """A stack of block layers (see module docstring).

    ``forward(x, blocks)``: ``x`` ``[S, in_dim]`` features of ``batch.input_nodes`` (local ids =
    row positions), ``blocks`` ordered input layer -> output layer, ``len(blocks) == num_layers``.
    Returns ``[blocks[-1].num_dst, out_dim]`` logits for the seeds.
    """

    def __init__(
        self,
        name: str,
        layers: list[nn.Module],
        dropout: float = 0.5,
        feature_norm: str = "none",
    ):
        super().__init__()
        self.name = name
        self.layers = nn.ModuleList(layers)
        self.dropout = float(dropout)
        self.feature_norm = feature_norm
        self.decode = FeatureDecoder()  # stored rows -> float32: set_feature_codec

    def set_feature_codec(self, codec) -> BlockGNN:
        """Decode input rows stored as ``codec`` says (a dataset's
        :attr:`~gnnio.graph.dataset.Dataset.feature_codec`: float16, bfloat16, int8) on the
        model's device; see :mod:`gnnio.train.decode`. Returns the model."""
        dev = next(self.parameters()).device
        self.decode = FeatureDecoder(codec).to(dev)
        return self

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def normalize_input(self, x: torch.Tensor) -> torch.Tensor:
        """Feature transform applied before layer 0: the stored rows decoded to float32
        (:class:`~gnnio.train.decode.FeatureDecoder`) and, with ``feature_norm="row"``, each row
        divided by its sum of absolute values (rows that sum to 0 are left as is)."""
        x = self.decode(x)
        if self.feature_norm == "row":
            x = x / x.abs().sum(dim=1, keepdim=True).clamp_min(1e-12)
        return x

    def apply_layer(self, i: int, x: torch.Tensor, block: Block) -> torch.Tensor:
        """Layer ``i`` on the rows ``x[:block.num_src]`` (dropout before, ReLU after unless last)."""
        x = dropout(first_rows(x, block.num_src), p=self.dropout, training=self.training)
        x = self.layers[i](x, block)
        if i < self.num_layers - 1:
            x = F.relu(x)
        return x

    def forward(self, x: torch.Tensor, blocks: list[Block]) -> torch.Tensor:
        if len(blocks) != self.num_layers:
            raise ValueError(
                f"{self.name}: got {len(blocks)} blocks for a {self.num_layers}-layer model"
            )
        if x.shape[0] < blocks[0].num_src:
            raise ValueError(
                f"{self.name}: x has {x.shape[0]} rows but block 0 has {blocks[0].num_src} sources"
            )
        x = self.normalize_input(x)
        for i, b in enumerate(blocks):
            x = self.apply_layer(i, x, b)
        return x

    @torch.no_grad()
    def inference(
        self,
        graph: CSRGraph,
        features,
        batch_size: int = 4096,
        device: torch.device | str = "cpu",
        progress: bool = True,
    ) -> torch.Tensor:
        """Exact full-neighbour forward pass over all nodes, layer by layer.

        Each layer is computed for destination chunks of ``batch_size`` consecutive node ids with
        all their in-neighbours (no sampling); the intermediate ``[N, hidden]`` float32 activations
        are kept in host memory (so this needs about ``2 * N * hidden * 4`` bytes of RAM and costs
        ``O(E * num_layers)``). ``features``: ``[N, F]`` NumPy array / memmap, torch tensor, or a
        :class:`~gnnio.features.base.FeatureStore` (only layer 0 reads it). Runs in eval mode and
        restores the previous mode. Returns ``[N, out_dim]`` float32 logits on the CPU.
        """
        was_training = self.training
        self.eval()
        device = torch.device(device)
        n = graph.num_nodes
        chunks = [(s, min(s + batch_size, n)) for s in range(0, n, batch_size)]
        h = None
        try:
            with bar(len(chunks) * self.num_layers, "inference", "chunk", enabled=progress) as pb:
                for i in range(self.num_layers):
                    out = None
                    for s, e in chunks:
                        block, src_nodes = full_neighbor_block(graph, s, e)
                        if h is None:
                            x = self.normalize_input(_rows(features, src_nodes).to(device))
                        else:
                            x = h[torch.from_numpy(src_nodes)].to(device)
                        y = self.layers[i](x, block.to(device))
                        if i < self.num_layers - 1:
                            y = F.relu(y)
                        if out is None:
                            out = torch.empty((n, y.shape[1]), dtype=torch.float32)
                        out[s:e] = y.float().cpu()
                        pb.update(1)
                    h = out
        finally:
            self.train(was_training)
        assert h is not None
        return h


def _rows(features, ids: np.ndarray) -> torch.Tensor:
    """Rows ``ids`` (global ids) of a feature matrix given as array, tensor or FeatureStore."""
    if isinstance(features, torch.Tensor):
        return features[torch.from_numpy(ids).to(features.device)].cpu()
    if isinstance(features, FeatureStore):
        return features.gather(torch.from_numpy(ids)).cpu()
    # sorted reads are kinder to memory-mapped files; restore the requested order afterwards
    order = np.argsort(ids, kind="stable")
    rows = np.asarray(features[ids[order]])
    out = np.empty_like(rows)
    out[order] = rows
    return torch.from_numpy(out)


def full_neighbor_block(graph: CSRGraph, start: int, end: int) -> tuple[Block, np.ndarray]:
    """The block of destination nodes ``[start, end)`` (global ids) with all their in-neighbours.

    Returns ``(block, src_nodes)``: ``src_nodes`` int64 global ids with the destination nodes first
    (``src_nodes[:end - start] == arange(start, end)``), then every other in-neighbour once; the
    block's ``edge_index`` uses positions in ``src_nodes`` (the mini-batch local-id convention).
    """
    indptr = np.asarray(graph.indptr)
    nd = end - start
    lo, hi = int(indptr[start]), int(indptr[end])
    nbrs = np.asarray(graph.indices[lo:hi], dtype=np.int64)
    dst = np.repeat(np.arange(nd, dtype=np.int64), np.diff(indptr[start : end + 1]))
    inside = (nbrs >= start) & (nbrs < end)
    local = np.empty_like(nbrs)
    local[inside] = nbrs[inside] - start
    outside, inv = np.unique(nbrs[~inside], return_inverse=True)
    local[~inside] = nd + inv.reshape(-1)
    src_nodes = np.concatenate([np.arange(start, end, dtype=np.int64), outside])
    edge_index = torch.from_numpy(np.stack([local, dst]))
    return Block(edge_index, int(src_nodes.shape[0]), nd), src_nodes


def build_model(
    name: str,
    in_dim: int,
    hidden: int,
    out_dim: int,
    num_layers: int,
    dropout: float = 0.5,
    heads: int = 4,
    attn_dropout: float = 0.0,
    feature_norm: str = "none",
    edge_weight_norm: str = "mean",
) -> BlockGNN:
    """A ``num_layers``-layer model ``name`` in ``MODELS``: ``in_dim -> hidden -> ... -> out_dim``.

    ``heads``: GAT attention heads (inner layers concatenate ``heads`` heads of ``hidden // heads``
    channels; the output layer averages ``heads`` heads). ``attn_dropout``: GAT attention dropout.
    ``feature_norm``: ``"none"`` or ``"row"`` (see :meth:`BlockGNN.normalize_input`).
    ``edge_weight_norm``: how SAGE combines per-edge weights, ``"mean"`` or ``"sum"`` (module
    docstring). Raises :class:`~gnnio.errors.UsageError` on a bad argument.
    """
    if name not in MODELS:
        raise UsageError(f"--model: unknown model '{name}' (choose from {', '.join(MODELS)})")
    if num_layers < 1:
        raise UsageError(f"num_layers: must be >= 1, got {num_layers}")
    if in_dim < 1 or hidden < 1 or out_dim < 1:
        raise UsageError(f"model dims must be >= 1, got in={in_dim} hidden={hidden} out={out_dim}")
    if not 0.0 <= dropout < 1.0:
        raise UsageError(f"--dropout: must be in [0, 1), got {dropout}")
    if feature_norm not in FEATURE_NORMS:
        raise UsageError(f"feature_norm: must be one of {FEATURE_NORMS}, got '{feature_norm}'")
    if edge_weight_norm not in EDGE_WEIGHT_NORMS:
        raise UsageError(
            f"edge_weight_norm: must be one of {EDGE_WEIGHT_NORMS}, got '{edge_weight_norm}'"
        )
    if name == "gat" and (heads < 1 or hidden % heads):
        raise UsageError(f"--heads: GAT needs hidden ({hidden}) divisible by heads ({heads})")
    dims = [in_dim] + [hidden] * (num_layers - 1) + [out_dim]
    layers: list[nn.Module] = []
    for i in range(num_layers):
        a, b = dims[i], dims[i + 1]
        last = i == num_layers - 1
        if name == "sage":
            layers.append(SAGELayer(a, b, edge_weight_norm))
        elif name == "gcn":
            layers.append(GCNLayer(a, b))
        elif name == "gat":
            layers.append(GATLayer(a, b, heads, concat=not last, attn_dropout=attn_dropout))
        else:
            layers.append(GINLayer(a, b, hidden))
    return BlockGNN(name, layers, dropout=dropout, feature_norm=feature_norm)


def count_parameters(model: nn.Module) -> int:
    """Number of trainable scalars."""
    return int(sum(math.prod(p.shape) for p in model.parameters() if p.requires_grad))
