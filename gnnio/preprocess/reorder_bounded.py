"""Reordering within a memory budget (issue 25, item 1): ``gnnio reorder ... --memory-budget BYTES``.

The in-memory path (:func:`gnnio.preprocess.reorder.reorder_dataset`) relabels the CSR in one
numba pass and copies feature rows 64 MiB at a time, but both read and write through memory
mappings, and every page they touch stays *resident* in the process (file-backed pages count in
its RSS until they are unmapped): a reorder's peak RSS grows with the dataset (17.6 GB for a 5.3 GB
one, issue 25). The bounded path does the same work in chunks and, after each chunk, drops the
pages it touched from the process (``madvise(MADV_DONTNEED)`` on the input and output mappings:
clean pages of the read-only inputs are read again from their files if needed, written pages of
the shared output mappings stay in the page cache and reach the file). The kernel writes the same
values in the same places, so the output files are the in-memory path's, bit for bit.

What the budget counts: the arrays of length N that must stay in RAM (``new2old``, the
``old2new`` lookup, the input ``indptr`` and the new one, the cumulative chunk costs, the permuted
labels: :func:`fixed_bytes`) plus one chunk, whose cost is what it can make resident: every row it
reads touches at least one 4 KiB page of the input (two when it straddles one), every edge or
feature byte is read once and written once. A budget that leaves less than :data:`MIN_CHUNK` for
the chunks is refused before anything is written. Not bounded yet: the hotness score itself
(``degree`` reads only ``indptr``; the others walk the edges once per iteration, then their pages
are dropped before the reorder starts), and a single row larger than the chunk (a hub with more
edges than the chunk holds is still moved at once).
"""

from __future__ import annotations

from collections.abc import Iterator

import numba
import numpy as np

from ..errors import UsageError
from ..graph.csr import index_dtype
from ..utils.pages import drop_pages
from ._relabel_kernels import _move_rows, _new_degrees

__all__ = ["MIN_CHUNK", "check_budget", "fixed_bytes", "release", "row_chunks"]

#: the least a budget must leave for the chunks (bytes)
MIN_CHUNK = 1 << 20
_PAGE = 4096
#: what one read fault through a file mapping can make resident: the kernel maps the pages around
#: it that are already cached ("fault-around", 64 KiB by default), whatever madvise says
_FAULT = 64 << 10


def fixed_bytes(num_nodes: int) -> int:
    """Bytes of the per-node arrays the bounded reorder keeps in RAM (module docstring)."""
    n = int(num_nodes) + 1
    # new2old, old2new (int64 while inverting), lookup, indptr in + out, chunk costs, labels x 2
    return n * (8 + 8 + 8 + 8 + 8 + 8 + 16)


def check_budget(budget: int, num_nodes: int) -> int:
    """The chunk bytes ``budget`` leaves, or a one-line UsageError when it cannot make progress."""
    need = fixed_bytes(num_nodes)
    if budget - need < MIN_CHUNK:
        raise UsageError(
            f"--memory-budget: {budget:,} bytes cannot reorder {num_nodes:,} nodes; at least "
            f"{need + MIN_CHUNK:,} are needed ({need:,} for the per-node arrays, {MIN_CHUNK:,} "
            "for a chunk)"
        )
    return int(budget - need)


def release(arr) -> None:
    """Drop the pages of ``arr``'s memory mapping from this process
    (:func:`gnnio.utils.pages.drop_pages`)."""
    drop_pages(arr)


def row_chunks(cost_cum: np.ndarray, chunk_bytes: int) -> Iterator[tuple[int, int]]:
    """Ranges ``[a, b)`` of rows whose summed cost (``cost_cum[b] - cost_cum[a]``, a cumulative
    int64 array of length rows + 1) stays within ``chunk_bytes``; at least one row each."""
    n = cost_cum.shape[0] - 1
    a = 0
    while a < n:
        b = int(np.searchsorted(cost_cum, cost_cum[a] + chunk_bytes, side="right")) - 1
        b = min(n, max(a + 1, b))
        yield a, b
        a = b


def relabel_csr_bounded(indptr, indices, new2old, out, chunk_bytes: int) -> np.ndarray:
    """:func:`gnnio.preprocess.reorder.relabel_csr` (``impl="numba"``) into ``out`` in chunks of
    new rows, each making at most about ``chunk_bytes`` resident, released after it.
    ``new2old`` must be a permutation of ``[0, N)`` (the caller checked it)."""
    indptr = np.asarray(indptr)
    n = new2old.shape[0]
    lookup = np.empty(n, dtype=index_dtype(n))
    lookup[new2old] = np.arange(n, dtype=lookup.dtype)  # old2new
    indptr2 = np.empty(n + 1, dtype=np.int64)
    _new_degrees(np.ascontiguousarray(indptr, dtype=np.int64), new2old, indptr2)
    np.cumsum(indptr2, out=indptr2)
    per_edge = indices.dtype.itemsize + out.dtype.itemsize
    cost = indptr2 * per_edge + np.arange(n + 1, dtype=np.int64) * (2 * _FAULT)
    threads = numba.get_num_threads()
    src = np.ascontiguousarray(indptr, dtype=np.int64)
    for a, b in row_chunks(cost, chunk_bytes):
        parts = max(1, min(b - a, 16 * threads))
        e0, e1 = int(indptr2[a]), int(indptr2[b])
        targets = e0 + (np.arange(parts + 1, dtype=np.int64) * (e1 - e0)) // parts
        bounds = np.searchsorted(indptr2, targets, side="left").astype(np.int64)
        bounds[0], bounds[-1] = a, b
        bounds = np.unique(np.clip(bounds, a, b))
        _move_rows(src, indices, new2old, lookup, indptr2, bounds, out)
        release(indices)
        release(out)
    del cost
    return indptr2


def copy_feature_rows_bounded(src, dst, new2old, chunk_bytes: int, progress: bool) -> None:
    """``dst[i] = src[new2old[i]]`` (``src`` a memmap of a file, ``dst`` a writable memmap) in
    chunks of rows. The rows are read with :class:`~gnnio.features.stores.disk.DiskFeatureStore`
    (``O_DIRECT``, page-aware), not through the mapping: a random read through a mapping makes
    its fault-around pages resident (64 KiB each), which would fill the budget with pages never
    needed. Writes go through ``dst``'s mapping in order; its pages are dropped after each chunk."""
    from ..features.stores.disk import DiskFeatureStore
    from ..utils.progress import bar

    n = new2old.shape[0]
    row_bytes = max(1, int(np.prod(src.shape[1:], dtype=np.int64)) * src.dtype.itemsize)
    if src.ndim != 2 or n == 0 or row_bytes == 0:  # nothing the page reader handles: as before
        dst[:] = src[new2old]
        return
    buf = max(_PAGE * 4, min(64 << 20, chunk_bytes // 4))
    store = DiskFeatureStore(src, max_buffer_bytes=buf)
    rows = max(1, (chunk_bytes - buf) // (2 * row_bytes))
    try:
        with bar(n, desc="reorder features", unit="row", enabled=progress) as pb:
            for s in range(0, n, rows):
                e = min(n, s + rows)
                dst[s:e] = store.gather(new2old[s:e]).numpy()
                drop_pages(dst)
                pb.update(e - s)
    finally:
        store.close()
