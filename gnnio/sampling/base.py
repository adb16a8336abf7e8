"""Mini-batch types and the sampler contract.

Id spaces (the one rule to remember):

* **global ids** are node ids of the dataset, in ``[0, num_nodes)``: ``MiniBatch.seeds`` and
  ``MiniBatch.input_nodes`` hold global ids.
* **local ids** are positions in ``MiniBatch.input_nodes``. ``input_nodes`` lists the seeds first,
  then the new nodes of hop 1, then of hop 2, ... so every hop's node set is a *prefix* of it.
  Each :class:`Block` therefore has ``src`` nodes ``input_nodes[:num_src]`` and ``dst`` nodes
  ``input_nodes[:num_dst]`` (``num_dst <= num_src``), and its ``edge_index`` holds local ids.

Why sampling is separate from fetching features: sampling only touches the topology and decides
*which* rows are needed; the feature store decides *where* they come from (GPU, host, disk, cache).
Keeping them apart lets the loader overlap the two stages and lets every tier count its own bytes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Block", "MiniBatch", "Sampler", "dst_ptr"]


@dataclass
class Block:
    """One message-passing layer of a mini-batch (a bipartite graph src -> dst).

    Attributes:
        edge_index: ``[2, E]`` int64, local ids; row 0 = source (neighbour, in ``[0, num_src)``),
            row 1 = destination (in ``[0, num_dst)``). PyG's ``source_to_target`` convention.
        num_src: number of source nodes (``input_nodes[:num_src]``).
        num_dst: number of destination nodes (``input_nodes[:num_dst]``).
        edge_weight: optional ``[E]`` float aggregation weights (e.g. Horvitz-Thompson 1/q_j,
            whose weighted sum is unbiased; a per-row ratio of them is not); None = plain
            aggregation.
        ptr: optional ``[num_dst + 1]`` int64 CSR row pointer over the destinations, given by a
            sampler whose edges are grouped by destination in local-id order (edges
            ``ptr[i]:ptr[i+1]`` go into destination ``i``): the model aggregates straight from it
            (:mod:`gnnio.train.spmm`) without sorting the edges again. None = not known.
    """

    edge_index: torch.Tensor
    num_src: int
    num_dst: int
    edge_weight: torch.Tensor | None = None
    ptr: torch.Tensor | None = None

    @property
    def num_edges(self) -> int:
        return int(self.edge_index.shape[1])

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Block:
        w, p = self.edge_weight, self.ptr
        return Block(
            self.edge_index.to(device, non_blocking=non_blocking),
            self.num_src,
            self.num_dst,
            None if w is None else w.to(device, non_blocking=non_blocking),
            None if p is None else p.to(device, non_blocking=non_blocking),
        )


def dst_ptr(edge_index: torch.Tensor, num_dst: int) -> torch.Tensor:
    """The CSR row pointer ``[num_dst + 1]`` of edges already grouped by destination in local-id
    order (what :attr:`Block.ptr` holds). Runs on the edges' device without a host sync; the
    caller guarantees the order (a sampler that builds its edges that way)."""
    return torch._convert_indices_from_coo_to_csr(edge_index[1], num_dst)


@dataclass
class MiniBatch:
    """A sampled mini-batch.

    Attributes:
        seeds: ``[B]`` int64 global ids of the output nodes (the nodes whose labels are predicted).
        input_nodes: ``[S]`` int64 global ids of every node whose features are needed, seeds first,
            then each hop's new nodes (see module docstring). Every id is in ``[0, num_nodes)``:
            the loader's gather relies on it and does not check ids already on a GPU
            (:func:`gnnio.features.base.ids_in_range`).
        blocks: one :class:`Block` per GNN layer, ordered from the input layer (outermost hop, most
            src nodes) to the output layer (whose ``num_dst == len(seeds)``).
        labels: ``[B]`` int64 labels of the seeds, or None.
        x: ``[S, F]`` features of ``input_nodes``, filled in by the loader after gathering.
    """

    seeds: torch.Tensor
    input_nodes: torch.Tensor
    blocks: list[Block]
    labels: torch.Tensor | None = None
    x: torch.Tensor | None = None
    meta: dict = field(default_factory=dict)

    @property
    def num_sampled_edges(self) -> int:
        return sum(b.num_edges for b in self.blocks)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> MiniBatch:
        return MiniBatch(
            seeds=self.seeds.to(device, non_blocking=non_blocking),
            input_nodes=self.input_nodes.to(device, non_blocking=non_blocking),
            blocks=[b.to(device, non_blocking=non_blocking) for b in self.blocks],
            labels=None
            if self.labels is None
            else self.labels.to(device, non_blocking=non_blocking),
            x=None if self.x is None else self.x.to(device, non_blocking=non_blocking),
            meta=dict(self.meta),
        )

    def pyg_inputs(self) -> list[tuple[torch.Tensor, tuple[int, int], torch.Tensor | None]]:
        """Per layer ``(edge_index, (num_src, num_dst), edge_weight)``, the arguments a PyG
        bipartite layer takes as ``conv((x_src, x_dst), edge_index, size=(num_src, num_dst))``
        with ``x_dst = x_src[:num_dst]``."""
        return [(b.edge_index, (b.num_src, b.num_dst), b.edge_weight) for b in self.blocks]


class Sampler(ABC):
    """Turns seed ids into a :class:`MiniBatch` (topology only; no features)."""

    @abstractmethod
    def sample(self, seeds: torch.Tensor | np.ndarray) -> MiniBatch:
        """Sample the multi-hop neighbourhood of ``seeds`` (int64 global ids, tensor or array)."""
