"""PyG's ``disjoint=True``: every seed samples its own subgraph, and ``batch.batch`` says which
subgraph each node belongs to (SGFormer and Polynormer read it to attend within a seed's nodes).

:class:`DisjointSampler` runs a :class:`~gnnio.sampling.frontier.FrontierSampler` once per seed,
each call with its own random key (``hop_key(batch key, position of the seed)``), so two subgraphs
draw independently even where they meet the same node. The subgraphs are then laid out as
pyg-lib lays out a disjoint batch, hop by hop and, within a hop, subgraph by subgraph:

* ``input_nodes`` (PyG's ``n_id``): the seeds in order (subgraph ``j`` is seed ``j``), then the
  nodes new at hop 1 of subgraph 0, of subgraph 1, ..., then those of hop 2, ...; a node reached
  by several subgraphs appears once per subgraph (``n_id`` may repeat ids, as in PyG);
* ``meta["batch"]`` (int64 ``[S]``): the subgraph of each entry of ``input_nodes``;
* the edges of hop ``h``, subgraph by subgraph, in local ids of the whole batch, with
  ``meta["hop_edges"]`` / ``meta["edge_pos"]`` / ``meta["hop_nodes"]`` as a FrontierSampler batch
  has them, so ``num_sampled_nodes``, ``num_sampled_edges`` and ``trim_to_layer`` work unchanged.

Cost: one numba call per seed and hop, and a Python loop over the seeds per batch; meant for the
models that need it, not as a faster sampler.
"""

from __future__ import annotations

import numpy as np
import torch

from ..sampling.base import MiniBatch, Sampler
from ..sampling.frontier import FrontierSampler, _assemble
from ..sampling.threaded import check_seeds, hop_key

__all__ = ["DisjointSampler"]


class DisjointSampler(Sampler):
    """Per-seed subgraphs of a :class:`FrontierSampler` (module docstring).

    Args:
        base: the sampler each seed's subgraph is drawn with (its fanouts, seed, ``replace``).
    """

    def __init__(self, base: FrontierSampler) -> None:
        self.base = base
        self.fanouts = base.fanouts
        self._calls = 0

    @property
    def device(self) -> torch.device:
        return self.base.device

    def sample(self, seeds, epoch_seed: int | None = None) -> MiniBatch:
        seeds = check_seeds(seeds, self.base.num_nodes)
        if epoch_seed is None:
            epoch_seed, self._calls = self._calls, self._calls + 1
        parts = [
            self.base.sample(seeds[j : j + 1], epoch_seed=hop_key(int(epoch_seed), j))
            for j in range(seeds.shape[0])
        ]
        L = len(self.fanouts)
        # hop_nodes of each subgraph: [1, n_1, n_2, ...] (cumulative, seed first)
        hn = np.array([p.meta["hop_nodes"] for p in parts], dtype=np.int64).reshape(-1, L + 1)
        he = np.array([p.meta["hop_edges"] for p in parts], dtype=np.int64).reshape(-1, L)
        per_hop = np.diff(hn, axis=1, prepend=0)  # [B, L + 1] new nodes per hop and subgraph
        # where hop h of subgraph j starts in the batch's node list: hops first, then subgraphs
        starts = np.cumsum(np.concatenate([[0], per_hop.T.reshape(-1)]))[:-1].reshape(L + 1, -1)
        remaps = []
        for j, p in enumerate(parts):
            ids = p.input_nodes.numpy()
            remap = np.empty(ids.shape[0], dtype=np.int64)
            lo = 0
            for h in range(L + 1):
                hi = int(hn[j, h])
                remap[lo:hi] = starts[h, j] + np.arange(hi - lo)
                lo = hi
            remaps.append(remap)
        total = int(hn[:, -1].sum())
        input_nodes = np.empty(total, dtype=np.int64)
        batch = np.empty(total, dtype=np.int64)
        for j, p in enumerate(parts):
            input_nodes[remaps[j]] = p.input_nodes.numpy()
            batch[remaps[j]] = j
        srcs, dsts, poss = [], [], []
        for h in range(L):
            src_h, dst_h, pos_h = [], [], []
            for j, p in enumerate(parts):
                e0 = int(he[j, :h].sum())
                e1 = e0 + int(he[j, h])
                ei = p.blocks[0].edge_index[:, e0:e1].numpy()
                src_h.append(remaps[j][ei[0]])
                dst_h.append(remaps[j][ei[1]])
                pos_h.append(p.meta["edge_pos"][e0:e1].numpy())
            srcs.append(np.concatenate(src_h) if src_h else np.empty(0, np.int64))
            dsts.append(np.concatenate(dst_h) if dst_h else np.empty(0, np.int64))
            poss.append(np.concatenate(pos_h) if pos_h else np.empty(0, np.int64))
        hop_nodes = np.cumsum(per_hop.sum(axis=0)).tolist()
        mb = _assemble(seeds, input_nodes, srcs, dsts, poss, hop_nodes)
        mb.meta["batch"] = torch.from_numpy(batch)
        return mb
