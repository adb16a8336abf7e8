"""What bounded-memory preprocessing shares (issue 25, item 1): the budget check and the chunks.

A ``--memory-budget BYTES`` counts what a command allocates and keeps resident: its arrays of
length N (the *fixed* bytes, each command says which) plus one *chunk*, the pages a chunked pass
over the memory-mapped CSR (or the features) makes resident before it drops them
(:func:`gnnio.utils.pages.drop_pages`). The interpreter and its libraries come on top.

Reading a range of edges through a mapping makes its pages resident, plus at most one
fault-around window (:data:`FAULT`: the kernel maps the cached pages around a read fault, 64 KiB
by default, whatever ``madvise`` says) at each end.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ..errors import UsageError

__all__ = ["FAULT", "MIN_CHUNK", "chunk_bytes", "cum_ranges", "edge_ranges", "row_ranges"]

#: the least a budget must leave for the chunks (bytes)
MIN_CHUNK = 1 << 20
#: what one read fault through a file mapping can make resident (fault-around)
FAULT = 64 << 10


def chunk_bytes(budget: int | None, fixed: int, what: str) -> int | None:
    """The bytes ``budget`` leaves for a chunk once ``fixed`` are held (None: no budget), or a
    one-line UsageError, before anything starts, when that is less than :data:`MIN_CHUNK`."""
    if budget is None:
        return None
    budget, fixed = int(budget), int(fixed)
    if budget - fixed < MIN_CHUNK:
        raise UsageError(
            f"--memory-budget: {budget:,} bytes cannot hold {what}; at least "
            f"{fixed + MIN_CHUNK:,} are needed ({fixed:,} for the per-node arrays and what must "
            f"stay resident, {MIN_CHUNK:,} for a chunk)"
        )
    return budget - fixed


def cum_ranges(cum: np.ndarray, cap: int) -> Iterator[tuple[int, int]]:
    """Consecutive ranges ``[a, b)`` of rows whose summed cost (``cum[b] - cum[a]``; ``cum`` is
    cumulative, length rows + 1, e.g. a CSR ``indptr``) stays within ``cap``; at least one row
    each (a row costing more than ``cap`` stands alone). The one range cutter of the bounded
    passes: the scores and partition (:func:`row_ranges`), the reorder's chunks and prepare's
    CSR buckets."""
    n = cum.shape[0] - 1
    a = 0
    while a < n:
        b = int(np.searchsorted(cum, int(cum[a]) + cap, side="right")) - 1
        b = min(n, max(a + 1, b))
        yield a, b
        a = b


def row_ranges(indptr: np.ndarray, chunk: int, per_edge: int) -> Iterator[tuple[int, int]]:
    """Ranges ``[a, b)`` of CSR rows (consecutive) whose edges, at ``per_edge`` bytes each plus
    the two fault-around windows, fit ``chunk`` bytes; at least one row each (a row with more
    edges than a chunk holds stands alone)."""
    return cum_ranges(indptr, max(1, (int(chunk) - 2 * FAULT) // max(1, int(per_edge))))


def edge_ranges(num_edges: int, chunk: int, per_edge: int) -> Iterator[tuple[int, int]]:
    """Ranges ``[s, e)`` of edge positions of at most ``chunk`` bytes each (``per_edge`` bytes an
    edge, the fault-around windows counted); at least one edge each."""
    step = max(1, (int(chunk) - 2 * FAULT) // max(1, int(per_edge)))
    for s in range(0, int(num_edges), step):
        yield s, min(int(num_edges), s + step)
