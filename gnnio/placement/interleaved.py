"""Data Tiering (Min et al.) multi-GPU placement: hottest rows interleaved over an NVLink group.

The feature table is sorted by score; "instead of using a naive blocked partition method, we use an
interleaved data loading method" so that memory and link traffic are balanced across the GPUs of
the group: the ``k``-th hottest row of the multi-GPU tensor goes to GPU ``k mod g`` of a group of
``g`` GPUs. Optionally ("in case the data transfer time is still an issue, we can additionally
replicate some hot data over multiple GPUs") the hottest ``R = top_count(replicate, BSIZE)`` rows are
replicated on every GPU; each GPU then holds ``R`` replicated rows plus ``BSIZE - R`` interleaved
ones, so the group holds ``R + g * (BSIZE - R)`` distinct rows (the paper's own runs use
``replicate = 0``). Groups are independent: every group holds the same rows. Rows are placed by
rank in ``probs`` (no reordering of ids needed); readers find them through the ``dev_num`` /
``buf_pos`` lookup, not the paper's boundary arithmetic (:mod:`gnnio.features.tiers.multidevice`).
"""

from __future__ import annotations

import numpy as np

from ..utils.counts import top_count
from . import Placement, PlacementRequest, hottest_order

__all__ = ["place_interleaved", "interleave"]


def interleave(order: np.ndarray, g: int, bsize: int, replicated: int) -> list[np.ndarray]:
    """Buffers of one group of ``g`` GPUs: ``order[:R]`` on all, then ``order[R + k]`` on GPU
    ``k mod g`` while each buffer has room (``bsize`` rows in all, clipped by ``N``)."""
    n = order.shape[0]
    r = min(int(replicated), int(bsize), n)
    rest = order[r : min(n, r + g * (int(bsize) - r))]
    return [np.concatenate([order[:r], rest[j::g]]) for j in range(g)]


def place_interleaved(req: PlacementRequest) -> Placement:
    """Interleaved hot rows over each NVLink group, plus an optional replicated hottest part."""
    topo = req.topology
    r = top_count(req.replicate, req.buffer_rows)
    gmax = max(len(g) for g in topo.groups) if topo.peers_cheaper else 1
    V = hottest_order(req.probs, k=r + gmax * (req.buffer_rows - r))
    buffers: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * topo.num_gpus
    for g in topo.groups:
        size = len(g) if topo.peers_cheaper else 1
        bufs = interleave(V, size, req.buffer_rows, r)
        for j, d in enumerate(g):
            buffers[d] = bufs[j % size].copy()
    return Placement(
        strategy="interleaved",
        num_nodes=req.num_nodes,
        groups=topo.groups,
        buffers=buffers,
        peer_reads=topo.peers_cheaper,
        params={"replicate": float(req.replicate), "replicated_rows": r},
    )
