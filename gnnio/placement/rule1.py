"""Song & Jiang Rule 1: a GPU not connected to other GPUs stores the rows most likely to be read.

From Eq. 5 (Eq. 3 with ``C_gpu >= C_cpu``), the cost of GPU ``i`` is
``C_cpu * (E|S| - ||b_i^T p||_1)``; it is smallest when ``b_i`` selects the ``BSIZE`` largest
``p``. Every GPU therefore holds the same ``BSIZE`` hottest rows and never reads from a peer.
"""

from __future__ import annotations

from . import Placement, PlacementRequest, hottest_order

__all__ = ["place_rule1"]


def place_rule1(req: PlacementRequest) -> Placement:
    """Every GPU buffers ``V[:BSIZE]``, the ``BSIZE`` hottest nodes (ties by ascending id)."""
    top = hottest_order(req.probs, k=req.buffer_rows)
    return Placement(
        strategy="rule1",
        num_nodes=req.num_nodes,
        groups=req.topology.groups,
        buffers=[top.copy() for _ in range(req.topology.num_gpus)],
        peer_reads=False,
        params={},
    )
