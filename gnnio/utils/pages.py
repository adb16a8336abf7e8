"""Dropping a memory mapping's pages from this process (issue 25: bounded-memory preprocessing).

Every page a process touches through a mapping stays resident in it (file-backed pages count in its
RSS) until unmapped. :func:`drop_pages` unmaps them with ``madvise(MADV_DONTNEED)``; the mapping
stays valid and pages are read again on the next access. Safe for read-only mappings, for
copy-on-write mappings that were never written (private changes would be lost), and for shared
ones (written pages stay in the page cache and reach the file).
"""

from __future__ import annotations

import mmap

__all__ = ["drop_pages"]


def drop_pages(arr) -> None:
    """Drop the pages of the mapping behind ``arr`` (a ``np.memmap``, a view of one, or an
    ``mmap.mmap``); nothing happens for anything else."""
    base = arr
    while base is not None:
        m = base if isinstance(base, mmap.mmap) else getattr(base, "_mmap", None)
        if isinstance(m, mmap.mmap):
            if hasattr(m, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
                m.madvise(mmap.MADV_DONTNEED)
            return
        base = getattr(base, "base", None)
