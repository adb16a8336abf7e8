"""Dropping a memory mapping's pages from this process (issue 25: bounded-memory preprocessing).

Every page a process touches through a mapping stays resident in it (file-backed pages count in its
RSS) until unmapped. :func:`drop_pages` unmaps them with ``madvise(MADV_DONTNEED)``; the mapping
stays valid and pages are read again on the next access. Safe for read-only mappings, for shared
ones (written pages stay in the page cache and reach the file), and for a copy-on-write
``np.memmap`` (``mode="c"``, how :func:`gnnio.load` opens arrays), whose written pages would be
lost: a range holding one (:func:`written_pages`) is not dropped. A bare ``mmap.mmap`` is taken
as not copy-on-write.
"""

from __future__ import annotations

import mmap

import numpy as np

__all__ = ["drop_pages", "written_pages"]

_PAGE = mmap.PAGESIZE
# /proc/self/pagemap's bits (Linux, Documentation/admin-guide/mm/pagemap.rst)
_PRESENT, _SWAPPED, _FILE = np.uint64(1 << 63), np.uint64(1 << 62), np.uint64(1 << 61)
_PAGEMAP_READ = 1 << 16  # entries read at a time (512 KiB), stopping at the first written page


def written_pages(addr: int, nbytes: int) -> bool | None:
    """Whether this process holds a private copy of a page of ``[addr, addr + nbytes)`` (in a
    copy-on-write mapping: a page written since it was mapped, whose bytes its file no longer
    holds): present and not a file page, or swapped out (only anonymous pages are). ``None``
    where ``/proc/self/pagemap`` cannot be read (not Linux)."""
    if nbytes <= 0:
        return False
    first, last = addr // _PAGE, (addr + nbytes - 1) // _PAGE
    try:
        with open("/proc/self/pagemap", "rb", buffering=0) as f:
            for lo in range(first, last + 1, _PAGEMAP_READ):
                n = min(_PAGEMAP_READ, last + 1 - lo)
                f.seek(8 * lo)
                raw = f.read(8 * n)
                if len(raw) != 8 * n:
                    return None
                flags = np.frombuffer(raw, dtype=np.uint64)
                present_anon = ((flags & _PRESENT) != 0) & ((flags & _FILE) == 0)
                if (present_anon | ((flags & _SWAPPED) != 0)).any():
                    return True
    except OSError:
        return None
    return False


def _mapping_of(arr) -> tuple[mmap.mmap | None, bool]:
    """The mmap behind ``arr`` and whether it is a copy-on-write ``np.memmap``'s."""
    base, cow = arr, False
    while base is not None:
        cow = cow or (isinstance(base, np.memmap) and base.mode in ("c", "copyonwrite"))
        m = base if isinstance(base, mmap.mmap) else getattr(base, "_mmap", None)
        if isinstance(m, mmap.mmap):
            return m, cow
        base = getattr(base, "base", None)
    return None, cow


def drop_pages(arr, start: int | None = None, stop: int | None = None) -> None:
    """Drop the pages of the mapping behind ``arr`` (a ``np.memmap``, a view of one, or an
    ``mmap.mmap``); nothing happens for anything else.

    With ``start``/``stop`` (element indices along the first axis of ``arr``, a C-contiguous
    array) only the pages that hold ``arr[start:stop]`` are dropped (whole pages; a page shared
    with a neighbouring element goes too, which costs a re-read at most), not the whole mapping.
    """
    m, cow = _mapping_of(arr)
    if m is None or not hasattr(m, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
        return
    if start is None and stop is None or isinstance(arr, mmap.mmap):
        if not (cow and _keeps_writes(m, 0, len(m))):
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
    if hi > lo and not (cow and _keeps_writes(m, lo, hi - lo)):
        m.madvise(mmap.MADV_DONTNEED, lo, hi - lo)


def _keeps_writes(m: mmap.mmap, lo: int, nbytes: int) -> bool:
    """Whether dropping ``m[lo : lo + nbytes]`` (a copy-on-write mapping) would lose this
    process's writes: a written page there, or no way to tell (no pagemap)."""
    if len(m) == 0:
        return False
    written = written_pages(np.frombuffer(m, dtype=np.uint8).ctypes.data + lo, nbytes)
    return written is not False
