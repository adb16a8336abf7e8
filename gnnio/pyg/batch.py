"""One gnnio :class:`~gnnio.sampling.base.MiniBatch` as the ``Data`` object PyG's
``NeighborLoader`` yields.

Fields, in NeighborLoader's order (``filter_data`` copies the dataset's node attributes, then the
loader adds the sampler's outputs)::

    x                  [S, F]  feature rows of n_id (gathered by gnnio's store)
    edge_index         [2, E]  local ids: row 0 = source (neighbour), row 1 = target; hop 1's
                               edges first, then hop 2's, ... (flow source_to_target)
    y                  [S]     labels of n_id (-1 = unlabelled)
    train_mask, ...    [S]     the split masks of n_id (when asked for)
    edge_attr          [E, *]  edge features, when the dataset stores some (from_pyg)
    edge_weight        [E]     per-edge weights, when the sampler sets them (locality-aware)
    n_id               [S]     global node ids; the first batch_size are the seeds, in order
    e_id               [E]     edge ids: positions in the dataset's CSR, or the user's original
                               edge_index columns for a dataset made by from_pyg
    num_sampled_nodes  list    [seeds, new nodes of hop 1, of hop 2, ...]
    num_sampled_edges  list    [edges of hop 1, hop 2, ...]
    input_id           [B]     the seeds' positions in the loader's input nodes
    batch_size         int     B

Which edges a hop holds depends on the sampler (see :mod:`gnnio.pyg`): a
:class:`~gnnio.sampling.frontier.FrontierSampler` batch (``meta["expand"] == "new"``) is PyG's
layout already; any other gnnio sampler's blocks (every node reached so far re-expanded at each
hop) are laid out hop by hop the same way, so ``trim_to_layer`` still trims consistently.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit
from torch_geometric.data import Data

from ..sampling.base import MiniBatch

__all__ = ["csr_positions", "hop_layout", "to_pyg_data"]


@njit(cache=True, nogil=True)
def _positions(indptr, indices, src, dst):
    out = np.empty(src.shape[0], dtype=np.int64)
    for q in range(src.shape[0]):
        u = src[q]
        p = indptr[dst[q]]
        end = indptr[dst[q] + 1]
        while p < end and indices[p] != u:
            p += 1
        out[q] = p if p < end else -1
    return out


def csr_positions(graph, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """CSR position of each edge ``src[q] -> dst[q]`` (global ids): the first entry ``src[q]`` in
    row ``dst[q]`` (a scan of the row; -1 if the edge is absent). Repeated edges ``u -> v`` all
    get the first one's position."""
    indptr = np.ascontiguousarray(np.asarray(graph.indptr), dtype=np.int64)
    indices = np.asarray(graph.indices)
    dst = np.ascontiguousarray(dst, np.int64)
    n = indptr.shape[0] - 1
    if dst.size and (dst.min() < 0 or dst.max() >= n):  # (the kernel reads indptr[dst] unchecked)
        bad = int(dst.min()) if dst.min() < 0 else int(dst.max())
        raise ValueError(
            f"graph: node id {bad} of the batch is not in this graph's [0, {n}) (pass the graph "
            "the batch was sampled from)"
        )
    return _positions(indptr, indices, np.ascontiguousarray(src, np.int64), dst)


def hop_layout(mb: MiniBatch) -> tuple[torch.Tensor, torch.Tensor | None, list[int], list[int]]:
    """``(edge_index, edge_weight, num_sampled_nodes, num_sampled_edges)`` of a batch, edges hop
    by hop (hop 1 first)."""
    blocks = mb.blocks
    hop_nodes = mb.meta.get("hop_nodes")
    if hop_nodes is None:
        hop_nodes = [blocks[-1].num_dst] + [b.num_src for b in reversed(blocks)]
    num_nodes = [int(hop_nodes[0])] + [int(b - a) for a, b in zip(hop_nodes, hop_nodes[1:])]
    if mb.meta.get("expand") == "new":  # FrontierSampler: blocks[0] holds every hop already
        edge_index, weight = blocks[0].edge_index, blocks[0].edge_weight
        num_edges = [int(e) for e in mb.meta["hop_edges"]]
    else:
        hops = list(reversed(blocks))
        edge_index = torch.cat([b.edge_index for b in hops], dim=1)
        weights = [b.edge_weight for b in hops if b.edge_weight is not None]
        weight = torch.cat(weights) if len(weights) == len(hops) else None
        num_edges = [b.num_edges for b in hops]
    return edge_index, weight, num_nodes, num_edges


def to_pyg_data(
    mb: MiniBatch,
    graph=None,
    labels: torch.Tensor | None = None,
    masks: dict[str, torch.Tensor] | None = None,
    edge_ids: torch.Tensor | None = None,
    edge_attr: torch.Tensor | None = None,
    input_id: torch.Tensor | None = None,
) -> Data:
    """The ``Data`` batch of ``mb`` (fields: module docstring).

    Args:
        mb: a sampled batch with ``x`` gathered (``x`` may be None: no ``x`` field then).
        graph: the CSR the batch was sampled from; needed for ``e_id`` unless the sampler recorded
            CSR positions (``meta["edge_pos"]``, as :class:`FrontierSampler` does).
        labels: ``[N]`` labels by global id (``y = labels[n_id]``); None = no ``y``.
        masks: name -> ``[N]`` bool tensor by global id (``train_mask`` etc.).
        edge_ids: ``[num_edges]`` map CSR position -> the user's edge id (a from_pyg dataset's
            ``pyg_edge_id``); None = ``e_id`` is the CSR position.
        edge_attr: ``[num_edges, ...]`` edge features by *user* edge id (``edge_attr[e_id]``).
        input_id: ``[B]`` the seeds' positions in the loader's input; None = ``arange(B)``.
    """
    edge_index, weight, num_nodes, num_edges = hop_layout(mb)
    n_id = mb.input_nodes
    dev = n_id.device
    pos = mb.meta.get("edge_pos")
    if pos is None:
        if graph is None:
            raise ValueError("to_pyg_data: pass graph= to compute e_id for this sampler's batch")
        ids = n_id.cpu()
        ei = edge_index.cpu()
        pos = torch.from_numpy(csr_positions(graph, ids[ei[0]].numpy(), ids[ei[1]].numpy()))
    e_id = pos if edge_ids is None else edge_ids[pos.to(edge_ids.device)]
    e_id = e_id.to(dev)
    data = Data()
    if mb.x is not None:
        data.x = mb.x
    data.edge_index = edge_index
    if labels is not None:
        data.y = labels[n_id.to(labels.device)].to(dev)
    for name, mask in (masks or {}).items():
        data[name] = mask[n_id.to(mask.device)].to(dev)
    if edge_attr is not None:
        data.edge_attr = edge_attr[e_id.to(edge_attr.device)].to(dev)
    if weight is not None:
        data.edge_weight = weight
    data.n_id = n_id
    data.e_id = e_id
    data.num_sampled_nodes = num_nodes
    data.num_sampled_edges = num_edges
    b = int(mb.seeds.shape[0])
    data.input_id = torch.arange(b, device=dev) if input_id is None else input_id.to(dev)
    data.batch_size = b
    return data
