"""The transpose of a CSR (out-neighbour lists from in-neighbour lists) by counting sort, O(N + E),
as a numba kernel: the BFS traversals of the proximity-aware order and of BGL's partitioner walk
both edge directions without building a symmetrized, deduplicated copy."""

from __future__ import annotations

import numpy as np
from numba import njit

from .csr import CSRGraph

__all__ = ["transpose_csr"]


@njit(cache=True)
def _transpose_kernel(indptr, indices, n):  # pragma: no cover - compiled
    counts = np.zeros(n + 1, dtype=np.int64)
    for e in range(indices.shape[0]):
        counts[indices[e] + 1] += 1
    for v in range(n):
        counts[v + 1] += counts[v]
    rptr = counts.copy()
    ridx = np.empty(indices.shape[0], dtype=indices.dtype)
    fill = counts[:n].copy()
    for v in range(n):
        for e in range(indptr[v], indptr[v + 1]):
            u = indices[e]
            ridx[fill[u]] = v
            fill[u] += 1
    return rptr, ridx


def transpose_csr(graph: CSRGraph) -> tuple[np.ndarray, np.ndarray]:
    """``(indptr, indices)`` of the transposed CSR (out-neighbours), by counting sort, O(N + E)."""
    return _transpose_kernel(
        np.asarray(graph.indptr, dtype=np.int64), np.asarray(graph.indices), graph.num_nodes
    )
