"""The baseline partitioners and HyDRA's HDR (Algorithm 1): node -> part maps.

Every method returns an int16 ``[N]`` array ``parts`` with values in ``[0, M)``; HDR also returns
the replicated set (whose neighbour lists every part stores).

* ``random``: a seeded random permutation cut into M equal ranges.
* ``range``: consecutive id ranges of equal size.
* ``metis``: METIS k-way (pymetis) on the symmetrized graph without self loops, equal node weights.
* ``hdr`` (HyDRA §III-A2, Algorithm 1): the top ``p_r * N`` nodes by degree are replicated on
  every part (lines 1-2); the remaining nodes, in groups of ``n`` consecutive ids, each go to the
  part with the smallest sum of degrees so far (lines 3-6, the paper's greedy degree balance).
  ``base`` other than ``"greedy"`` replaces lines 3-6 by another method's assignment (metis,
  bfs-block, random, range), so replication composes with any partitioner. "Degree" is the length
  of the node's in-neighbour list, the list that sampling reads and replication copies.
"""

from __future__ import annotations

import numpy as np

from ...errors import UsageError
from ...graph.csr import CSRGraph

__all__ = ["hdr_replicated", "hdr_greedy_parts", "metis_parts", "random_parts", "range_parts"]


def random_parts(num_nodes: int, nparts: int, seed: int = 0) -> np.ndarray:
    """Seeded random equal-size parts (int16 ``[N]``)."""
    size = max(1, -(-num_nodes // nparts))
    perm = np.random.default_rng(seed).permutation(num_nodes)
    parts = np.empty(num_nodes, dtype=np.int16)
    parts[perm] = (np.arange(num_nodes, dtype=np.int64) // size).astype(np.int16)
    return parts


def range_parts(num_nodes: int, nparts: int) -> np.ndarray:
    """Consecutive id ranges of equal size (int16 ``[N]``)."""
    size = max(1, -(-num_nodes // nparts))
    return (np.arange(num_nodes, dtype=np.int64) // size).astype(np.int16)


def metis_parts(graph: CSRGraph, nparts: int) -> np.ndarray:
    """METIS k-way partition of the symmetrized graph (self loops dropped); int16 ``[N]``."""
    if nparts == 1:
        return np.zeros(graph.num_nodes, dtype=np.int16)
    try:
        import pymetis
    except ImportError:
        raise UsageError("method 'metis' needs pymetis (pip install pymetis)") from None
    sym = graph.symmetrize(drop_self_loops=True)
    xadj = np.asarray(sym.indptr, dtype=np.int64)
    adjncy = np.asarray(sym.indices, dtype=np.int64)
    if hasattr(pymetis, "CSRAdjacency"):  # pymetis >= 2025.2
        _, membership = pymetis.part_graph(nparts, pymetis.CSRAdjacency(xadj, adjncy))
    else:  # pragma: no cover - older pymetis
        _, membership = pymetis.part_graph(nparts, xadj=xadj, adjncy=adjncy)
    return np.asarray(membership, dtype=np.int16)


def hdr_replicated(graph: CSRGraph, replicate: float) -> np.ndarray:
    """Algorithm 1 lines 1-2: the top ``round(p_r * N)`` nodes by in-neighbour-list length
    (ties: lower id first), sorted ids (int64)."""
    n = graph.num_nodes
    nr = int(round(float(replicate) * n))
    if nr <= 0:
        return np.zeros(0, dtype=np.int64)
    deg = graph.in_degrees()
    top = np.lexsort((np.arange(n), -deg))[:nr]
    return np.sort(top).astype(np.int64)


def hdr_greedy_parts(
    graph: CSRGraph, nparts: int, replicated: np.ndarray, group: int | None = None
) -> np.ndarray:
    """Algorithm 1 lines 3-6: the non-replicated nodes in groups of ``group`` consecutive ids
    (the paper's "assign batch size n"; default ``min(1024, ceil(N' / (16 M)))`` so a small graph
    still gives every part many groups), each group to the part whose degree sum is smallest so
    far (ties: lowest part). Replicated nodes get a home part round-robin (every part stores
    their lists)."""
    n = graph.num_nodes
    deg = graph.in_degrees().astype(np.int64)
    is_rep = np.zeros(n, dtype=bool)
    is_rep[replicated] = True
    rest = np.flatnonzero(~is_rep)
    parts = np.zeros(n, dtype=np.int16)
    load = np.zeros(nparts, dtype=np.int64)
    g = int(group) if group else min(1024, max(1, -(-rest.shape[0] // (16 * nparts))))
    g = max(1, g)
    for s in range(0, rest.shape[0], g):
        ids = rest[s : s + g]
        k = int(np.argmin(load))
        parts[ids] = k
        load[k] += int(deg[ids].sum())
    # replicated nodes: a home part for bookkeeping (round-robin); their lists are on every part
    parts[replicated] = (np.arange(replicated.shape[0]) % nparts).astype(np.int16)
    return parts
