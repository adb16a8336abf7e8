"""A feature store reading rows from a file with direct I/O (tier "disk"): the SSD tier (issue 25).

Where :class:`~gnnio.features.stores.mmap.MmapFeatureStore` lets the OS page rows in (its page cache
serves repeats, so a warm store reads at memory speed and nothing says how many bytes came from
the device), :class:`DiskFeatureStore` reads with ``O_DIRECT``: the page cache serves nothing, every
counted byte is a device byte, and host memory holds only what a cache above it keeps. A host cache
goes on top of it (:class:`~gnnio.features.caches.cache.FeatureCache` with ``device="cpu"``; policies
static, SIEVE, S3-FIFO, ...), a GPU tier above that.

A gather reads each block holding a requested row once (rows sharing a block, and repeated ids,
are read once), in runs of consecutive blocks, ``queue_depth`` reads in flight; a block is the
smallest ``O_DIRECT`` read the file accepts (the device's 512-byte logical block where it takes
one, else a 4 KiB page; ``block_size``); see :mod:`gnnio.features.stores._direct_io` for the plan,
the reader threads and why they are not io_uring. The rows come back bit-identical to the file's.
``stats`` counts what the device delivered: ``pages_read`` (blocks), ``bytes_read`` (what
``/proc/self/io``'s ``read_bytes`` counts for these reads) and ``read_amplification`` = bytes read
/ bytes of the distinct rows asked for (1.0 = no waste; a 512-byte row alone in its 4 KiB page
costs 8, in its 512-byte sector 1).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ...errors import DatasetError
from .._gather import as_index_array, output_rows, row_bytes_view
from ..base import FeatureStore
from ._direct_io import PAGE, PageReader, copy_spans, plan_pages

__all__ = ["DiskFeatureStore", "DiskStats"]


@dataclass
class DiskStats:
    """What a :class:`DiskFeatureStore` asked for and what the device delivered, since a reset.

    Attributes:
        gathers: gather calls; rows: rows served (repeats included); unique_rows: distinct rows
        read (per gather); pages_read: blocks read (of ``block_bytes`` each: 4 KiB pages or the
        device's smaller logical blocks); bytes_read: bytes the reads returned; reads: read calls
        (runs of consecutive blocks); row_bytes: bytes of one row.
    """

    gathers: int = 0
    rows: int = 0
    unique_rows: int = 0
    pages_read: int = 0
    bytes_read: int = 0
    reads: int = 0
    row_bytes: int = 0
    block_bytes: int = PAGE

    @property
    def read_amplification(self) -> float:
        """Bytes read over bytes of the distinct rows asked for (0.0 before any read)."""
        want = self.unique_rows * self.row_bytes
        return self.bytes_read / want if want else 0.0

    def as_dict(self) -> dict:
        return {
            "gathers": self.gathers,
            "rows": self.rows,
            "unique_rows": self.unique_rows,
            "pages_read": self.pages_read,
            "bytes_read": self.bytes_read,
            "reads": self.reads,
            "read_amplification": self.read_amplification,
            "block_bytes": self.block_bytes,
        }


class DiskFeatureStore(FeatureStore):
    """Feature rows read from their file with ``O_DIRECT`` on every gather (module docstring).

    Args:
        features: a ``np.memmap`` of a file (e.g. ``gnnio.load(path).features``; only its file,
            offset, shape and dtype are used), the path of a ``.npy`` file, or of a raw row-major
            file (then ``dtype`` and ``shape`` are required).
        dtype, shape: layout of a raw file; ignored otherwise.
        queue_depth: reads in flight (reader threads).
        direct: read with ``O_DIRECT`` (False: buffered reads, through the page cache).
        block_size: the read unit in bytes (512, 1024, 2048 or 4096); None: the smallest the file
            takes with ``O_DIRECT`` (:func:`~gnnio.features.stores._direct_io.direct_block_size`),
            4096 for buffered reads.
        max_run_pages: most 4 KiB pages one read fetches (longer runs of needed blocks are split).
        max_buffer_bytes: the page buffer's size limit; a batch needing more pages is read in
            chunks of rows (a page shared by two chunks is read twice).
    """

    tier = "disk"

    def __init__(
        self,
        features,
        dtype=None,
        shape: tuple[int, int] | None = None,
        queue_depth: int = 16,
        direct: bool = True,
        block_size: int | None = None,
        max_run_pages: int = 64,
        max_buffer_bytes: int = 64 << 20,
    ) -> None:
        super().__init__()
        path, offset, shp, dt = _layout(features, dtype, shape)
        if len(shp) != 2:
            raise ValueError(f"features must be 2-D [num_rows, dim], got shape {shp}")
        if shp[1] == 0:
            raise ValueError("features have no columns (dim 0)")
        self.path = Path(path)
        self.offset = int(offset)
        self.num_rows, self.dim = int(shp[0]), int(shp[1])
        self._np_dtype = np.dtype(dt)
        self.dtype = torch.from_numpy(np.empty(0, dtype=self._np_dtype)).dtype
        self.device = torch.device("cpu")
        need = self.offset + self.num_rows * self.dim * self._np_dtype.itemsize
        have = self.path.stat().st_size
        if have < need:
            raise DatasetError(
                f"{self.path}: truncated: {have} bytes, but {self.num_rows} rows of "
                f"{self.dim} x {self._np_dtype} from byte {self.offset} need {need}"
            )
        self.max_run_pages = int(max_run_pages)
        self.max_buffer_bytes = int(max_buffer_bytes)
        self._reader = PageReader(str(self.path), queue_depth, direct, block_size)
        self.stats = DiskStats(row_bytes=self.row_bytes, block_bytes=self.block_size)
        self._lock = threading.Lock()

    @property
    def direct(self) -> bool:
        """Whether reads bypass the page cache (False after a fallback to buffered reads)."""
        return self._reader.direct

    @property
    def block_size(self) -> int:
        """Bytes per read unit (block): 512-4096 (class docstring)."""
        return self._reader.block

    @property
    def queue_depth(self) -> int:
        return self._reader.queue_depth

    def __repr__(self) -> str:
        mode = "O_DIRECT" if self.direct else "buffered"
        return (
            f"DiskFeatureStore(num_rows={self.num_rows}, dim={self.dim}, dtype={self.dtype}, "
            f"path={str(self.path)!r}, {mode}, queue_depth={self.queue_depth}, "
            f"block_size={self.block_size})"
        )

    def close(self) -> None:
        """Close the file and stop the reader threads (the store cannot gather afterwards)."""
        self._reader.close()

    def __del__(self) -> None:  # pragma: no cover - best effort at interpreter exit
        try:
            self._reader.close()
        except Exception:  # noqa: BLE001
            pass

    def reset_stats(self) -> None:
        """Zero ``stats`` and ``counters``."""
        with self._lock:
            self.stats = DiskStats(row_bytes=self.row_bytes, block_bytes=self.block_size)
            self.counters.reset()

    def gather(self, ids, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rows ``ids`` (global ids; int32/int64; repeats allowed) as a ``[len(ids), dim]`` CPU
        tensor, written into ``out[:len(ids)]`` when given; each needed page read once. Raises
        IndexError for ids outside ``[0, num_rows)``, TypeError for non-integer ids,
        :class:`~gnnio.errors.DatasetError` for a truncated or unreadable file."""
        idx = as_index_array(ids, self.num_rows)
        n = int(idx.shape[0])
        dst = output_rows(out, n, self.dim, self.dtype, self.device)
        if n == 0:
            return dst
        rb, bs = self.row_bytes, self.block_size
        max_run = max(1, self.max_run_pages * PAGE // bs)
        uniq, inv = np.unique(idx, return_inverse=True)
        out_b = row_bytes_view(dst)
        with self._lock:
            r = self._reader
            p0, b0 = r.pages_read, r.bytes_read
            reads0 = r.reads
            for a, b in self._chunks(uniq):
                starts = self.offset + uniq[a:b].astype(np.int64) * rb
                plan = plan_pages(starts, rb, max_run, bs)
                buf = r.read(plan)
                if a == 0 and b == uniq.size:
                    sel = np.arange(n, dtype=np.int64)
                    pos = plan.span_pos[inv]
                else:
                    sel = np.flatnonzero((inv >= a) & (inv < b))
                    pos = plan.span_pos[inv[sel] - a]
                copy_spans(buf, pos, out_b, sel)
            st = self.stats
            st.gathers += 1
            st.rows += n
            st.unique_rows += int(uniq.size)
            st.pages_read += r.pages_read - p0
            st.bytes_read += r.bytes_read - b0
            st.reads += r.reads - reads0
        self.counters.add(self.tier, n, rb)
        return dst

    def _chunks(self, uniq: np.ndarray) -> list[tuple[int, int]]:
        """Ranges of the sorted unique rows whose blocks fit the buffer limit (one range when all
        do: counted exactly for rows of at most a block, so a batch of 10,000 blocks is not cut in
        two by an estimate of twice that, re-reading the blocks shared across the cut). Cut by the
        index of each row's first block among all needed blocks, so a chunk needs at most
        ``limit`` blocks plus the blocks its last row spills into the next."""
        rb, bs = self.row_bytes, self.block_size
        per_row = (rb + bs - 1) // bs + 1
        limit = max(per_row, self.max_buffer_bytes // bs)
        starts = self.offset + uniq.astype(np.int64) * rb
        first = starts // bs
        if rb <= bs:  # a row touches its first block and maybe the next: count them exactly
            if np.union1d(first, (starts + rb - 1) // bs).size <= limit:
                return [(0, int(uniq.size))]
        elif (np.count_nonzero(np.diff(first)) + 1) * per_row <= limit:
            return [(0, int(uniq.size))]
        rank = np.concatenate([[0], np.cumsum(np.diff(first) != 0)])  # first page's index
        step = max(1, (limit - per_row) // per_row)
        cuts = np.searchsorted(rank, np.arange(0, int(rank[-1]) + 1, step))
        bounds = [*cuts.tolist(), int(uniq.size)]
        return [(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]


def _layout(features, dtype, shape) -> tuple[str, int, tuple[int, ...], np.dtype]:
    """``(path, byte offset of row 0, shape, dtype)`` of a memmap, a .npy path or a raw file."""
    if isinstance(features, np.memmap):
        fn = getattr(features, "filename", None)
        if fn is None:
            raise TypeError("DiskFeatureStore needs a memmap of a file")
        if not features.flags.c_contiguous:
            raise ValueError("memory-mapped features must be row-major (C-contiguous)")
        base = features
        while isinstance(base.base, np.memmap):  # a view's offset is its own start's
            base = base.base
        start = features.__array_interface__["data"][0] - base.__array_interface__["data"][0]
        return str(fn), int(base.offset) + int(start), tuple(features.shape), features.dtype
    if not isinstance(features, (str, os.PathLike)):
        raise TypeError(
            "DiskFeatureStore needs a np.memmap or a file path, got " + type(features).__name__
        )
    path = Path(features)
    if not path.is_file():
        raise DatasetError(f"{path}: no such feature file")
    with open(path, "rb") as f:
        if f.read(6) == b"\x93NUMPY":
            f.seek(0)
            try:
                version = np.lib.format.read_magic(f)
                read_header = (
                    np.lib.format.read_array_header_1_0
                    if version == (1, 0)
                    else np.lib.format.read_array_header_2_0
                )
                shp, fortran, dt = read_header(f)
            except ValueError as e:
                raise DatasetError(f"{path}: not a readable .npy file ({e})") from None
            if fortran and len(shp) > 1:
                raise ValueError(f"{path}: Fortran-ordered features; need row-major")
            if dt.hasobject:
                raise DatasetError(f"{path}: holds Python objects, not numbers")
            return str(path), f.tell(), tuple(shp), dt
    if dtype is None or shape is None:
        raise DatasetError(f"{path}: not a .npy file; give dtype= and shape= to read a raw file")
    shp = tuple(int(s) for s in shape)
    if any(s < 0 for s in shp):  # not NumPy's -1 ("the rest"): a store of -1 rows read nothing
        raise ValueError(f"{path}: shape {shp}: sizes must be >= 0")
    return str(path), 0, shp, np.dtype(dtype)
