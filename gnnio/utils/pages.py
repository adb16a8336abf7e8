"""Dropping a memory mapping's pages from this process (issue 25: bounded-memory preprocessing).

Every page a process touches through a mapping stays resident in it (file-backed pages count in its
RSS) until unmapped. :func:`drop_pages` unmaps them with ``madvise(MADV_DONTNEED)``; the mapping
stays valid and pages are read again on the next access. Safe for read-only mappings, for
copy-on-write mappings that were never written (private changes would be lost), and for shared
ones (written pages stay in the page cache and reach the file).
"""

from __future__ import annotations

import mmap

import numpy as np

__all__ = ["drop_pages"]

_PAGE = mmap.PAGESIZE


def _mapping_of(arr) -> mmap.mmap | None:
    base = arr
    while base is not None:
        m = base if isinstance(base, mmap.mmap) else getattr(base, "_mmap", None)
        if isinstance(m, mmap.mmap):
            return m
        base = getattr(base, "base", None)
    return None


def drop_pages(arr, start: int | None = None, stop: int | None = None) -> None:
    """Drop the pages of the mapping behind ``arr`` (a ``np.memmap``, a view of one, or an
    ``mmap.mmap``); nothing happens for anything else.

    With ``start``/``stop`` (element indices along the first axis of ``arr``, a C-contiguous
    array) only the pages that hold ``arr[start:stop]`` are dropped (whole pages; a page shared
    with a neighbouring element goes too, which costs a re-read at most), not the whole mapping.
    """
    m = _mapping_of(arr)
    if m is None or not hasattr(m, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
        return
    if start is None and stop is None or isinstance(arr, mmap.mmap):
        m.madvise(mmap.MADV_DONTNEED)
        return
    a = np.asarray(arr)
    rows = a.shape[0] if a.ndim else 1
    s, e, _ = slice(start, stop).indices(rows)
    if e <= s:
        return
    row = a.strides[0] if a.ndim else a.itemsize
    base = np.frombuffer(m, dtype=np.uint8).ctypes.data  # the mapping's first byte
    lo = a.ctypes.data - base + s * row
    hi = a.ctypes.data - base + e * row
    lo -= lo % _PAGE
    hi = min(len(m), -(-hi // _PAGE) * _PAGE)
    if hi > lo:
        m.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
