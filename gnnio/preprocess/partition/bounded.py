"""``gnnio partition ... --memory-budget BYTES`` (issue 25, item 1): what each method holds.

``random``, ``range`` and ``hdr`` over ``greedy``, ``random`` or ``range`` assign parts from
per-node arrays only; what grows with the edges is chunked: the edge cut of the quality report
walks the CSR in ranges of rows (:func:`edge_cut`), and each shard's neighbour lists are written
into their file's mapping in chunks of rows whose pages are dropped (:func:`write_lists`). The
fixed bytes are :data:`NODE_BYTES` per node plus the whole CSR, which stays resident: the
sampled epoch of ``remote_fraction`` and the shards read it at random. The files are the
in-memory path's, bit for bit.

``metis`` and ``bfs-block`` (and ``hdr`` over them) stay in memory: METIS needs the symmetrized
graph in RAM, BGL's partitioner the transposed CSR and a block graph with up to one entry per
edge. Under a budget they run only when their estimate (:data:`IN_MEMORY`, bytes per node and
per edge, upper estimates from the arrays they build) fits; else they are refused with one line
before they start.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ...errors import UsageError
from ...graph.csr import CSRGraph
from ...utils.pages import drop_pages
from ..budget import chunk_bytes, row_ranges

__all__ = ["IN_MEMORY", "NODE_BYTES", "check_budget", "edge_cut", "write_lists"]

#: per-node bytes of the chunked methods: the parts, the permutation or degree order of the
#: method, and one shard's node lists (own nodes, row starts, counts, indptr)
NODE_BYTES = 64
#: bytes a chunk of the edge cut holds per edge: both ends as int64, their parts, the test
CUT_EDGE_BYTES = 24
#: (bytes per node, bytes per edge) of the methods that stay in memory, besides the CSR and
#: :data:`NODE_BYTES`: bfs-block from its arrays, checked against a measurement (4.47 GB peak RSS,
#: interpreter included, on a 2^22-node R-MAT graph of 67 M edges, 4 parts, where this gives
#: 4.8 GB); metis from the symmetrization's int64 edge pairs, sort keys and pymetis's copy
IN_MEMORY = {"metis": (96, 72), "bfs-block": (112, 56)}


def _csr_bytes(graph: CSRGraph) -> int:
    return int(np.asarray(graph.indptr).nbytes) + int(np.asarray(graph.indices).nbytes)


def check_budget(budget: int | None, graph: CSRGraph, method: str, base: str) -> int | None:
    """The chunk bytes ``budget`` leaves for partitioning ``graph`` with ``method`` (``base`` for
    ``hdr``), None without a budget, or a one-line UsageError before anything starts."""
    if budget is None:
        return None
    n, e = graph.num_nodes + 1, graph.num_edges
    which = base if method == "hdr" else method
    fixed = NODE_BYTES * n + _csr_bytes(graph)
    if which in IN_MEMORY:
        per_node, per_edge = IN_MEMORY[which]
        need = fixed + per_node * n + per_edge * e
        if need > int(budget):
            raise UsageError(
                f"--memory-budget: {which} runs in memory (not chunked) and needs about "
                f"{need:,} bytes on {graph.num_nodes:,} nodes and {e:,} edges, more than "
                f"{int(budget):,}; choose --method random, range or hdr (--base greedy) or a "
                "larger budget"
            )
        fixed = need
    return chunk_bytes(budget, fixed, f"a {method} partition of {graph.num_nodes:,} nodes")


def edge_cut(graph: CSRGraph, parts: np.ndarray, chunk: int | None) -> int:
    """Edges whose two ends lie in different parts, counted in one pass (``chunk`` None) or in
    ranges of rows holding at most ``chunk`` bytes of temporaries each."""
    n = graph.num_nodes
    indptr = np.asarray(graph.indptr)
    if chunk is None:
        src = np.asarray(graph.indices, dtype=np.int64)
        dst = np.repeat(np.arange(n, dtype=np.int64), graph.in_degrees())
        return int((parts[src] != parts[dst]).sum())
    cut = 0
    for a, b in row_ranges(indptr, chunk, CUT_EDGE_BYTES):
        e0, e1 = int(indptr[a]), int(indptr[b])
        src = np.asarray(graph.indices[e0:e1], dtype=np.int64)
        dst = np.repeat(np.arange(a, b, dtype=np.int64), np.diff(indptr[a : b + 1]))
        cut += int((parts[src] != parts[dst]).sum())
    return cut


@njit(cache=True, nogil=True)
def _copy_lists(indptr, indices, nodes, offs, a, b, out):  # pragma: no cover
    """``out[offs[i]:offs[i+1]] = indices[indptr[v]:indptr[v+1]]`` for ``v = nodes[i]``,
    ``i`` in ``[a, b)``."""
    for i in range(a, b):
        v = nodes[i]
        s = indptr[v]
        t = offs[i]
        for j in range(indptr[v + 1] - s):
            out[t + j] = indices[s + j]


def write_lists(path, graph: CSRGraph, nodes: np.ndarray, offs: np.ndarray, chunk: int) -> None:
    """Write the neighbour lists of ``nodes`` (a shard's rows; ``offs`` their indptr) to the
    ``.npy`` file ``path`` through a mapping, in chunks of rows of at most ``chunk`` bytes whose
    pages are dropped after each: the bytes ``np.save`` writes for the concatenated lists."""
    indices = np.asarray(graph.indices)
    indptr = np.asarray(graph.indptr, dtype=np.int64)
    if int(offs[-1]) == 0:  # nothing to map
        np.save(path, np.zeros(0, dtype=indices.dtype), allow_pickle=False)
        return
    out = np.lib.format.open_memmap(path, "w+", indices.dtype, (int(offs[-1]),))
    try:
        for a, b in row_ranges(offs, chunk, indices.dtype.itemsize):
            _copy_lists(indptr, indices, nodes, offs, a, b, out)
            drop_pages(out, int(offs[a]), int(offs[b]))
        out.flush()
    finally:
        del out
