"""Checking a CSR's arrays before numba kernels walk them (:func:`check_csr`)."""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..utils.pages import drop_pages, written_pages

__all__ = ["check_csr"]

_CHUNK = 1 << 24  # items read at a time


def _written(a: np.ndarray, s: int, e: int) -> bool:
    """Whether this process holds a private copy of a page of ``a[s:e]`` (``a`` a C-contiguous
    copy-on-write mapping: :func:`~gnnio.utils.pages.written_pages`); True where that cannot be
    told (then the chunk is read from ``a``)."""
    e = min(e, a.shape[0])
    if e <= s:
        return False
    row = a.strides[0]
    return written_pages(a.ctypes.data + s * row, (e - s) * row) is not False


def _chunks(a: np.ndarray) -> Iterator[np.ndarray]:
    """``a`` ``_CHUNK`` items at a time. A memory-mapped ``a`` leaves no pages resident in this
    process (issue 26): a read-only or shared mapping's pages are dropped after each chunk; a
    copy-on-write one (whose private writes dropping would lose) is read through a read-only
    mapping of its file of our own, except a chunk holding a page written in this process
    (:func:`_written`), which is read from ``a`` itself (the kernels read those bytes, not the
    file's; the chunk's pages then stay mapped)."""
    src, m = a, None
    if isinstance(a, np.memmap) and a.filename is not None and a.flags.c_contiguous:
        base: Any = a
        while base is not None and m is None:  # (the mapping behind a view of a memmap)
            m = base if isinstance(base, mmap.mmap) else getattr(base, "_mmap", None)
            base = getattr(base, "base", None)
    if isinstance(m, mmap.mmap) and isinstance(a, np.memmap) and a.mode == "c" and a.filename:
        start = a.offset - a.offset % mmap.ALLOCATIONGRANULARITY  # where np.memmap maps from
        at = start + a.ctypes.data - np.frombuffer(m, dtype=np.uint8).ctypes.data
        src = np.memmap(a.filename, dtype=a.dtype, mode="r", offset=at, shape=a.shape)
    for s in range(0, src.shape[0], _CHUNK):
        yield (
            a[s : s + _CHUNK]
            if src is not a and _written(a, s, s + _CHUNK)
            else src[s : s + _CHUNK]
        )
        if m is not None:
            drop_pages(src, s, s + _CHUNK)


def check_csr(indptr: np.ndarray, indices: np.ndarray, what: str = "graph.") -> None:
    """Raise ValueError (one line naming the array) unless ``indptr``/``indices`` are a CSR:
    1-D integer arrays, ``indptr`` from 0 to ``len(indices)`` without decreasing, every index in
    ``[0, len(indptr) - 1)``. The numba kernels that walk a graph trust these (an index or a row
    end out of range reads past the arrays). Costs one vectorised pass over ``indptr`` and a min
    and a max over ``indices``, in chunks (memory maps: :func:`_chunks`). ``what`` prefixes the
    array names in the message."""
    for name, a in (("indptr", indptr), ("indices", indices)):
        if a.ndim != 1 or not np.issubdtype(a.dtype, np.integer):
            raise ValueError(f"{what}{name}: need a 1-D integer array, got {a.dtype} {a.shape}")
    if indptr.shape[0] < 1 or indptr[0] != 0 or indptr[-1] != indices.shape[0]:
        raise ValueError(
            f"{what}indptr: must run from 0 to len(indices) = {indices.shape[0]}, got "
            + (f"{int(indptr[0])} .. {int(indptr[-1])}" if indptr.shape[0] else "an empty array")
        )
    pos, prev = 0, int(indptr[0])
    for c in _chunks(indptr):
        d = np.diff(c, prepend=prev)
        if (d < 0).any():
            raise ValueError(f"{what}indptr: decreases at position {pos + int(np.argmax(d < 0))}")
        pos, prev = pos + c.shape[0], int(c[-1])
    n = indptr.shape[0] - 1
    for c in _chunks(indices):
        lo, hi = int(c.min()), int(c.max())
        if lo < 0 or hi >= n:
            raise ValueError(
                f"{what}indices: node id {lo if lo < 0 else hi} is out of range [0, {n})"
            )
