"""A rank's host rows, read from the feature file with ``pread``: nothing of it mapped (issue 26).

Every rank of a machine reads its host rows (its shard once, then per batch the rows no shard
holds) from the dataset's feature file: the machine keeps one copy in its page cache. Read
through a memory mapping (:class:`~gnnio.features.MmapFeatureStore`), every page a rank touched
stays mapped, and mapped file pages count in its resident memory (RSS) until it unmaps them. A
read fault also maps more than its page (fault-around, large page-cache folios): on the
development VM (Linux 6.18) one gather of 30,000 random 512-byte rows of a 2 GiB feature file
left all 2 GiB mapped, with or without ``MADV_RANDOM``. So every rank's RSS grew with the whole
feature matrix (2.6 of a rank's 3.9 GiB peak on the 2^22-node graph, docs/benchmarks.md), though
the machine holds the file once.

:class:`PreadRows` copies each row with one ``pread`` from the file into the output (a numba
``prange`` kernel calling libc's ``pread``; the kernel runs without the GIL). The bytes come from
the same page cache, so the rows read and the bytes counted are the same as through the
mapping, and the rank's RSS holds the rows it copied, not the pages they came from. The cost:
one system call per row. Measured on the VM (2 shared cores, 30,000 random rows of the 2^22
graph, page cache warm): 68-83 ms by ``pread``, 11-25 ms from a mapping already holding the
pages, and 480 ms when the pages are unmapped after each 64 MiB chunk of rows instead (every
fault maps a whole folio again): reading by ``pread`` is what keeps the mapping out.
"""

from __future__ import annotations

import os

import numba
import numpy as np
import torch
from numba import njit, prange, types

from ..errors import DatasetError
from ..features.base import FeatureStore

__all__ = ["PreadFeatureStore", "PreadRows", "pread_into", "pread_rows_of"]

# libc's pread, resolved by symbol when the kernel is linked (so the compiled kernel can be
# cached on disk, which a ctypes pointer, an address of this process, does not allow)
_pread = types.ExternalFunction(
    "pread", types.intp(types.intc, types.voidptr, types.uintp, types.int64)
)


@njit(parallel=True, nogil=True, cache=True)
def _pread_rows(fd, ids, out, at, offset, row_bytes, got):  # pragma: no cover - compiled
    """Row ``ids[i]`` of the file (``row_bytes`` each from byte ``offset``) into ``out[at[i]]``;
    ``got[i]``: what ``pread`` returned (``row_bytes`` unless the row came back short)."""
    for i in prange(ids.shape[0]):
        got[i] = _pread(fd, out[at[i]].ctypes, row_bytes, offset + ids[i] * row_bytes)


def pread_into(fd: int, path: str, ids, rows: np.ndarray, at: np.ndarray, offset: int) -> None:
    """Row ``ids[i]`` of the file open as ``fd`` (rows of ``rows.shape[1]`` bytes from byte
    ``offset``) into ``rows[at[i]]`` (``rows``: a C-contiguous uint8 ``[n, row_bytes]``), one
    ``pread`` per row; a short read (a truncated file) is one :class:`DatasetError` naming
    ``path``."""
    row_bytes = int(rows.shape[1])
    ids_np = np.ascontiguousarray(ids, dtype=np.int64)
    if at.shape != ids_np.shape:  # (the kernel reads at[i] for every id, unchecked)
        raise ValueError(f"at: {at.shape[0]} positions for {ids_np.shape[0]} ids")
    if at.size and (int(at.min()) < 0 or int(at.max()) >= rows.shape[0]):
        raise IndexError(f"at: positions outside the {rows.shape[0]} rows of out")
    got = np.empty(ids_np.shape[0], dtype=np.int64)
    _pread_rows(fd, ids_np, rows, at, int(offset), row_bytes, got)
    short = np.flatnonzero(got != row_bytes)
    if short.size:
        where = int(offset) + int(ids_np[short[0]]) * row_bytes
        raise DatasetError(f"{path}: short read of {row_bytes} bytes at offset {where}")


class PreadRows:
    """Rows of the feature file behind ``store`` (a :class:`~gnnio.features.MmapFeatureStore`),
    read by ``pread`` (module docstring) and counted in ``store.counters`` as its own
    :meth:`~gnnio.features.MmapFeatureStore.gather` counts them.

    Args:
        store: the memory-mapped store (its file, dtype and layout; never its mapping).
        path: the file (``store``'s mapped file).
        num_threads: the kernel's threads (None: numba's setting).
    """

    def __init__(self, store, path: str, num_threads: int | None = None) -> None:
        arr = store._mm  # the store's np.memmap (features/stores/mmap.py): its layout in the file
        self.store = store
        self.path = str(path)
        self.row_bytes = int(arr.strides[0])
        self.offset = int(arr.offset)
        self.num_threads = num_threads
        self._fd: int | None = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None:
            os.close(fd)
            self._fd = None

    def gather(self, ids: torch.Tensor, out: torch.Tensor, at: torch.Tensor | None = None):
        """Rows ``ids`` (int64, any order, repeats allowed) into ``out[at[i]]`` (contiguous CPU
        rows of the store's dtype and width; ``at`` None: ``out[i]``, and ``out[:len(ids)]`` is
        returned). Reading straight into the batch's rows saves a buffer and a copy."""
        n = int(ids.shape[0])
        if n == 0:
            return out[:0]
        if self.num_threads is not None:
            numba.set_num_threads(
                max(1, min(int(self.num_threads), numba.config.NUMBA_NUM_THREADS))  # type: ignore[attr-defined]  # set by numba.config at import
            )
        rows = out.view(torch.uint8).numpy().reshape(out.shape[0], self.row_bytes)
        at_np = np.arange(n, dtype=np.int64) if at is None else at.numpy()
        assert self._fd is not None  # (closed only when collected)
        pread_into(self._fd, self.path, ids.numpy(), rows, at_np, self.offset)
        st = self.store
        st.counters.add(st.tier, n, st.row_bytes)
        return out[:n] if at is None else out


def pread_rows_of(store, num_threads: int | None = None) -> PreadRows | None:
    """A :class:`PreadRows` over ``store`` when it reads a file through a mapping itself (not
    behind a cache, whose state depends on what it is asked); None otherwise."""
    from ..features.stores.mmap import MmapFeatureStore

    mm = getattr(store, "_mm", None)
    path = getattr(mm, "filename", None)
    if type(store) is not MmapFeatureStore or path is None:
        return None
    return PreadRows(store, path, num_threads)


class PreadFeatureStore(FeatureStore):
    """A memory-mapped store's rows read by ``pread`` (:class:`PreadRows`), as a store of its
    own: the backing of a rank's ``--cache-policy`` cache, so the cache's misses leave nothing
    of the feature file mapped either. Its gathers are counted in ``base``'s counters, under
    ``base``'s tier, as ``base.gather`` counts them (the same rows and bytes per tier).

    Args:
        base: a :class:`~gnnio.features.MmapFeatureStore` (:func:`pread_rows_of` must accept it).
        num_threads: the kernel's threads (None: numba's setting).
    """

    def __init__(self, base, num_threads: int | None = None) -> None:
        super().__init__()
        reader = pread_rows_of(base, num_threads)
        if reader is None:
            raise TypeError(
                f"PreadFeatureStore: needs a MmapFeatureStore, got {type(base).__name__}"
            )
        self.base, self._reader = base, reader
        self.counters, self.tier = base.counters, base.tier
        self.num_rows, self.dim, self.dtype, self.device = (
            base.num_rows, base.dim, base.dtype, base.device
        )  # fmt: skip

    def gather(self, ids, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rows ``ids`` as :meth:`~gnnio.features.MmapFeatureStore.gather` returns them (the
        same checks of the ids and of ``out``)."""
        from ..features._gather import as_index_array, check_out

        idx = torch.from_numpy(as_index_array(ids, self.num_rows).astype(np.int64, copy=False))
        n = int(idx.shape[0])
        if out is None:
            out = torch.empty((n, self.dim), dtype=self.dtype)
        dst = check_out(out, n, self.dim, self.dtype, self.device)
        if not dst.is_contiguous():
            raise ValueError("out: rows must be contiguous")
        return self._reader.gather(idx, dst)
