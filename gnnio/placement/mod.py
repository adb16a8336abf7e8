"""BGL (Liu et al.) multi-GPU cache sharded by node id modulo the number of GPUs.

BGL avoids duplicated entries among GPU caches "by assigning different and disjoint node IDs to each
GPU cache map (mod by the number of workers)"; a GPU reads the other shards over NVLink. BGL fills
its shards dynamically (FIFO); this is the *static* counterpart: GPU ``j`` of a group of ``g`` GPUs
holds the ``BSIZE`` hottest nodes whose id satisfies ``id mod g == j``. The modulus is the group
size, because GPUs outside a group cannot read each other (BGL's GPUs are all NVLink-connected);
with several groups every group holds the same shards.
"""

from __future__ import annotations

import numpy as np

from . import Placement, PlacementRequest, hottest_order

__all__ = ["place_mod", "mod_shards"]


def mod_shards(probs: np.ndarray, g: int, bsize: int) -> list[np.ndarray]:
    """For each residue ``j < g``: the ``bsize`` hottest nodes with ``id mod g == j``."""
    n = probs.shape[0]
    return [hottest_order(probs, k=bsize, among=np.arange(j, n, g)) for j in range(g)]


def place_mod(req: PlacementRequest) -> Placement:
    """Shard ``id mod g`` over each NVLink group of ``g`` GPUs, hottest rows of each shard first."""
    topo = req.topology
    buffers: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * topo.num_gpus
    for g in topo.groups:
        size = len(g) if topo.peers_cheaper else 1
        shards = mod_shards(req.probs, size, req.buffer_rows)
        for j, d in enumerate(g):
            buffers[d] = shards[j % size].copy()
    return Placement(
        strategy="mod",
        num_nodes=req.num_nodes,
        groups=topo.groups,
        buffers=buffers,
        peer_reads=topo.peers_cheaper,
        params={},
    )
