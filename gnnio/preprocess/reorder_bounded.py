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
labels: :func:`fixed_bytes`) plus one chunk. The relabel keeps the whole input ``indices``
resident when it fits the chunk (then only the output is chunked), else every row it reads costs
two fault-around windows plus its edges. The feature copy is an external permutation by sorted,
sequential ``preadv`` runs (:func:`copy_feature_rows_bounded`). A budget that leaves less than
:data:`MIN_CHUNK` for the chunks is refused before anything is written. The hotness score before
it runs within the same budget (:mod:`gnnio.preprocess.graph_scores`, chunked passes; the budget
must hold the larger of the two phases). Not bounded: a single row larger than the chunk (a hub
with more edges than the chunk holds is still moved at once).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator

import numba
import numpy as np

from ..errors import UsageError
from ..graph.csr import index_dtype
from ..utils.pages import drop_pages
from ._relabel_kernels import _move_rows, _move_run, _new_degrees
from .budget import FAULT, MIN_CHUNK, cum_ranges

__all__ = ["MIN_CHUNK", "check_budget", "fixed_bytes", "release", "row_chunks"]

_FAULT = FAULT
#: the source rows one read of the feature copy brings in (bytes)
_READ_BYTES = 64 << 20


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
    return cum_ranges(cost_cum, chunk_bytes)


def relabel_csr_bounded(indptr, indices, new2old, out, chunk_bytes: int) -> np.ndarray:
    """:func:`gnnio.preprocess.reorder.relabel_csr` (``impl="numba"``) into ``out`` in chunks of
    new rows, each making at most about ``chunk_bytes`` resident, released after it.
    ``new2old`` must be a permutation of ``[0, N)`` (the caller checked it).

    When the input ``indices`` is in RAM, or a mapped file that fits the chunk with room to spare
    (:data:`MIN_CHUNK`), it is read in place (a mapped one stays resident through the pass) and
    only the output is chunked. Else it is not mapped at all: each chunk of new rows reads its old
    rows sorted by old id, in runs of consecutive edges with ``preadv`` (:func:`_read_runs`), as
    the feature copy does; a chunk then holds 24 bytes per row besides its output edges."""
    indptr = np.asarray(indptr)
    n = new2old.shape[0]
    lookup = np.empty(n, dtype=index_dtype(n))
    lookup[new2old] = np.arange(n, dtype=lookup.dtype)  # old2new
    indptr2 = np.empty(n + 1, dtype=np.int64)
    src = np.ascontiguousarray(indptr, dtype=np.int64)
    _new_degrees(src, new2old, indptr2)
    np.cumsum(indptr2, out=indptr2)
    item = indices.dtype.itemsize
    in_bytes = indices.shape[0] * item + 2 * _FAULT
    path = getattr(indices, "filename", None)
    runs = path is not None and chunk_bytes - in_bytes < MIN_CHUNK
    block = max(1, min(_READ_BYTES, chunk_bytes // 8) // item)  # edges a read run holds
    cost = indptr2 * out.dtype.itemsize
    if runs:
        cost += np.arange(n + 1, dtype=np.int64) * 24  # the sort order, old ids, row ends
        limit = max(1, chunk_bytes - 2 * block * item)
    else:
        limit = chunk_bytes - in_bytes if path is not None else chunk_bytes
    threads = numba.get_num_threads()
    fd = os.open(path, os.O_RDONLY) if runs and path is not None else -1
    try:
        for a, b in row_chunks(cost, limit):
            e0, e1 = int(indptr2[a]), int(indptr2[b])
            if runs:
                _read_runs(fd, int(indices.offset), indices.dtype, block, src, new2old[a:b], a,
                           lookup, indptr2, out)  # fmt: skip
            else:
                parts = max(1, min(b - a, 16 * threads))
                targets = e0 + (np.arange(parts + 1, dtype=np.int64) * (e1 - e0)) // parts
                bounds = np.searchsorted(indptr2, targets, side="left").astype(np.int64)
                bounds[0], bounds[-1] = a, b
                bounds = np.unique(np.clip(bounds, a, b))
                _move_rows(src, indices, new2old, lookup, indptr2, bounds, out)
            drop_pages(out, e0, e1)
    finally:
        if fd >= 0:
            os.close(fd)
    release(indices)
    del cost
    return indptr2


def _read_runs(fd, offset, dtype, block, indptr, old, a, lookup, indptr2, out) -> None:
    """Move the old rows ``old`` (new rows ``a, a+1, ...``) by sorted runs of at most ``block``
    edges read from the ``.npy`` data at ``offset`` of ``fd`` (a row longer than a run is read
    alone)."""
    order = np.argsort(old, kind="stable")
    rows = old[order]
    ends = indptr[rows + 1]
    item = np.dtype(dtype).itemsize
    buf = np.empty(block, dtype=dtype)
    pos = 0
    while pos < rows.shape[0]:
        start = int(indptr[rows[pos]])
        j = max(pos + 1, int(np.searchsorted(ends, start + block, side="right")))
        end = int(ends[j - 1])
        run = buf if end - start <= block else np.empty(end - start, dtype=dtype)
        raw = run.view(np.uint8).data
        _pread_rows(fd, raw, offset + start * item, (end - start) * item)
        _move_run(run, start, indptr, rows[pos:j], a + order[pos:j], lookup, indptr2, out)
        pos = j


def copy_feature_rows_bounded(src, dst, new2old, chunk_bytes: int, progress: bool) -> None:
    """``dst[i] = src[new2old[i]]`` (``src`` a memmap of a file, ``dst`` a writable memmap) in
    chunks of output rows, each within ``chunk_bytes``.

    An external permutation by sequential reads: a chunk's source rows, sorted by old id, are
    read in runs of at most :data:`_READ_BYTES` with ``preadv`` (through the page cache into
    one buffer: no mapping of the source, so nothing of it stays resident), each run from the
    first row still missing, and scattered into the chunk's rows of ``dst``'s mapping, whose
    pages are dropped after the chunk. Every chunk reads at most the whole source once, so a
    budget that holds all the rows reads it once, in order. Per output row the chunk holds the
    row, its sort order and its sorted old id (``row_bytes + 16``)."""
    from ..utils.progress import bar

    n = new2old.shape[0]
    row_bytes = max(1, int(np.prod(src.shape[1:], dtype=np.int64)) * src.dtype.itemsize)
    path = getattr(src, "filename", None)
    if src.ndim < 1 or n == 0 or path is None:  # not a mapped file: gather in memory
        dst[:] = src[new2old]
        return
    block = max(1, min(_READ_BYTES, chunk_bytes // 8) // row_bytes)
    rows = max(1, (chunk_bytes - 2 * block * (row_bytes + 8)) // (row_bytes + 16))
    buf = np.empty((block, *src.shape[1:]), dtype=src.dtype)
    raw = buf.reshape(-1).view(np.uint8).data
    offset = int(src.offset)
    nsrc = src.shape[0]
    fd = os.open(path, os.O_RDONLY)
    try:
        with bar(n, desc="reorder features", unit="row", enabled=progress) as pb:
            for s in range(0, n, rows):
                e = min(n, s + rows)
                order = np.argsort(new2old[s:e], kind="stable")
                old = new2old[s:e][order]
                view = dst[s:e]
                pos = 0
                while pos < old.shape[0]:
                    r0 = int(old[pos])
                    r1 = min(nsrc, r0 + block)
                    j = int(np.searchsorted(old, r1, side="left"))
                    _pread_rows(fd, raw, offset + r0 * row_bytes, (r1 - r0) * row_bytes)
                    view[order[pos:j]] = buf[old[pos:j] - r0]
                    pos = j
                del view
                drop_pages(dst, s, e)
                pb.update(e - s)
    finally:
        os.close(fd)


def _pread_rows(fd: int, raw: memoryview, offset: int, nbytes: int) -> None:
    """Fill ``raw[:nbytes]`` from ``fd`` at ``offset`` (short reads continued; EOF is an error)."""
    got = 0
    while got < nbytes:
        k = os.preadv(fd, [raw[got:nbytes]], offset + got)
        if k <= 0:
            raise OSError(errno.EIO, f"short read of the features at byte {offset + got}")
        got += k
