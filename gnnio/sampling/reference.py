"""Plain-Python reference of uniform neighbour sampling, for tests (slow: loops per node).

Same conventions as :class:`gnnio.sampling.uniform.UniformSampler` (fanout order, fresh sampling
for every destination of every hop, first-appearance local ids, blocks input layer first), but its
own random numbers: compare the two on distribution-level properties, not batch for batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .base import Block, MiniBatch

__all__ = ["sample_reference"]


def sample_reference(
    indptr: np.ndarray,
    indices: np.ndarray,
    seeds,
    fanouts: Sequence[int],
    rng: np.random.Generator,
) -> MiniBatch:
    """Sample ``len(fanouts)`` hops around ``seeds`` (distinct global ids).

    ``fanouts[h]`` neighbours per node at hop ``h + 1`` (-1 = all), drawn without replacement with
    ``rng.choice``. Returns a :class:`MiniBatch` like the fast sampler's.
    """
    indptr = np.asarray(indptr)
    indices = np.asarray(indices)
    seeds = [int(s) for s in np.asarray(seeds).tolist()]
    if len(set(seeds)) != len(seeds):
        raise ValueError("seeds: must be distinct")
    input_nodes = list(seeds)
    local = {g: i for i, g in enumerate(input_nodes)}
    hop_nodes = [len(input_nodes)]
    hop_edges = []
    for fanout in fanouts:
        num_dst = len(input_nodes)
        src_local, dst_local = [], []
        for i in range(num_dst):
            v = input_nodes[i]
            neigh = indices[indptr[v] : indptr[v + 1]]
            deg = len(neigh)
            if fanout < 0 or deg <= fanout:
                chosen = neigh
            else:
                chosen = neigh[rng.choice(deg, size=fanout, replace=False)]
            for u in chosen.tolist():
                if u not in local:
                    local[u] = len(input_nodes)
                    input_nodes.append(u)
                src_local.append(local[u])
                dst_local.append(i)
        hop_nodes.append(len(input_nodes))
        hop_edges.append(torch.tensor([src_local, dst_local], dtype=torch.int64).reshape(2, -1))
    blocks = [
        Block(hop_edges[h], num_src=hop_nodes[h + 1], num_dst=hop_nodes[h])
        for h in range(len(fanouts) - 1, -1, -1)
    ]
    return MiniBatch(
        seeds=torch.tensor(seeds, dtype=torch.int64),
        input_nodes=torch.tensor(input_nodes, dtype=torch.int64),
        blocks=blocks,
        meta={"hop_nodes": hop_nodes},
    )
