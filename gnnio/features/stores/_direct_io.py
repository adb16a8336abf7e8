"""Page-aware, batched, parallel reads of byte spans of one file, with ``O_DIRECT`` (issue 25).

What :class:`~gnnio.features.stores.disk.DiskFeatureStore` reads through. Three steps per batch:

1. **Plan** (:func:`plan_pages`): the byte spans of the requested rows become the sorted set of the
   blocks they touch (rows sharing a block need it once), cut into *runs* of consecutive blocks
   (at most ``max_run_pages`` each: one read per run). A block is the smallest read ``O_DIRECT``
   accepts on the file (:func:`direct_block_size`): the device's logical block (512 bytes on this
   project's development disk) where it is smaller than a 4 KiB page, else the page. A 3,200-byte
   row costs 7-8 sectors of 512 bytes (1.16x its bytes) instead of 1-2 pages (2.2x).
2. **Read** (:class:`PageReader`): the runs go to ``queue_depth`` threads; each issues its share
   with ``os.preadv`` into one page-aligned buffer (anonymous ``mmap``; ``O_DIRECT`` needs the
   address, the file offset and the length aligned). ``preadv`` releases the GIL, so the threads
   keep ``queue_depth`` requests in flight at the device.
3. **Copy** (:func:`copy_spans`): each row's bytes, found at ``block_index * block + offset in
   block`` of the buffer, are copied to the output (a numba ``prange`` kernel; NumPy fallback).

Why a pool of ``preadv`` threads and not io_uring: the kernel has io_uring, but the Python bindings
on PyPI (``liburing``, ``pyuring``, ``uringio``, ...) prepare and submit every request from Python
with the GIL held, so a batch costs the same interpreter work per read as a ``preadv`` loop, with
a young native dependency on top (some of them months old, one maintainer each); a thread pool
needs no dependency and reaches the queue depth the device wants. The ceiling it is held to is
measured by ``gnnio bench disk`` with the same threads and the same reads.

Faults: a filesystem that refuses ``O_DIRECT`` (``EINVAL`` at open or at the first read; tmpfs
before Linux 6.6) falls back to buffered reads and says so in one line (logger
``gnnio.features.stores.disk``; then the page cache serves repeats and the counted bytes are no longer all
device bytes). A read that returns fewer bytes than the file should hold (the file was truncated)
or fails (``EIO``) raises :class:`~gnnio.errors.DatasetError` with one line naming the file and
the offset.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ...errors import DatasetError

try:
    from numba import njit, prange

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - numba is a hard dependency
    HAVE_NUMBA = False

__all__ = ["PAGE", "PagePlan", "PageReader", "copy_spans", "direct_block_size", "plan_pages"]

PAGE = 4096
#: read sizes below a page that :func:`direct_block_size` tries, smallest first
SUB_PAGE_BLOCKS = (512, 1024, 2048)
log = logging.getLogger("gnnio.features.stores.disk")


@dataclass
class PagePlan:
    """The blocks a set of byte spans touches, and the reads that fetch them.

    Attributes:
        pages: sorted unique block numbers (int64; block ``p`` = file bytes
            ``[p*block, (p+1)*block)``; 4 KiB pages unless ``block`` says otherwise).
        run_start, run_len: the reads, as index into ``pages`` and block count (consecutive ones).
        span_pos: for every span, the byte position of its first byte in a buffer holding
            ``pages`` back to back.
        block: bytes per block (a power of two, 512 to 4096).
    """

    pages: np.ndarray
    run_start: np.ndarray
    run_len: np.ndarray
    span_pos: np.ndarray
    block: int = PAGE


def plan_pages(
    starts: np.ndarray, length: int, max_run_pages: int = 64, block: int = PAGE
) -> PagePlan:
    """Plan the reads of the spans ``[starts[i], starts[i] + length)`` (``length >= 1`` bytes) in
    blocks of ``block`` bytes (runs of at most ``max_run_pages`` blocks)."""
    _check_block(block)
    starts = np.asarray(starts, dtype=np.int64)
    first = starts // block
    last = (starts + (length - 1)) // block
    width = last - first  # extra pages a span covers past its first
    if starts.size == 0:
        pages = np.empty(0, dtype=np.int64)
    elif int(width.max()) == 0:
        pages = np.unique(first)
    else:
        parts = [first]
        for k in range(1, int(width.max()) + 1):
            parts.append(first[width >= k] + k)
        pages = np.unique(np.concatenate(parts))
    # runs: break where the next page is not the following one, and every max_run_pages pages
    brk = np.ones(pages.size, dtype=bool)
    if pages.size > 1:
        brk[1:] = np.diff(pages) != 1
    run_start = np.flatnonzero(brk)
    bounds = np.append(run_start, pages.size)
    lens = np.diff(bounds)
    if lens.size and int(lens.max()) > max_run_pages:  # split long runs
        pieces = [np.arange(s, s + n, max_run_pages) for s, n in zip(run_start, lens, strict=True)]
        run_start = np.concatenate(pieces)
        bounds = np.append(run_start, pages.size)
        lens = np.diff(bounds)
    span_pos = np.searchsorted(pages, first) * block + (starts - first * block)
    return PagePlan(pages, run_start.astype(np.int64), lens.astype(np.int64), span_pos, block)


def _check_block(block: int) -> None:
    if block not in (*SUB_PAGE_BLOCKS, PAGE):
        raise ValueError(f"block must be one of 512, 1024, 2048, 4096 bytes, got {block}")


def direct_block_size(fd: int, file_size: int) -> int:
    """The smallest block ``O_DIRECT`` reads of ``fd`` (opened with it) accept: the first of
    :data:`SUB_PAGE_BLOCKS` with which one read, at a file offset and into a buffer address that
    are multiples of the block but not of a page, works; else :data:`PAGE`. Trying is the
    authority (the device's ``queue/logical_block_size`` in sysfs says what the device takes,
    not what the filesystem and the kernel's direct-I/O path accept). A try reads one block (the
    kernel counts it in ``read_bytes``; this reader's counters do not)."""
    buf = mmap.mmap(-1, 2 * PAGE)
    try:
        mv = memoryview(buf)
        for block in SUB_PAGE_BLOCKS:
            off = block if file_size >= 2 * block else 0
            try:
                os.preadv(fd, [mv[block : 2 * block]], off)
            except OSError:
                continue  # EINVAL: not aligned enough; anything else: the page reads will say
            return block
        return PAGE
    finally:
        mv.release()
        buf.close()


class PageReader:
    """Reads planned blocks of one file into a reused page-aligned buffer, ``queue_depth`` reads
    in flight (module docstring). Thread-safe: one batch at a time (a lock).

    ``block``: the read unit plans for this reader should use (bytes); None: with ``O_DIRECT`` the
    smallest the file accepts (:func:`direct_block_size`), buffered a 4 KiB page. A plan's block
    must be a multiple of it.

    Attributes:
        direct: whether reads bypass the page cache (``O_DIRECT``); False after a fallback.
        block: the read unit (bytes).
        pages_read, bytes_read, reads: blocks, bytes and read calls since the last reset.
    """

    def __init__(
        self, path: str, queue_depth: int = 16, direct: bool = True, block: int | None = None
    ) -> None:
        if queue_depth < 1:
            raise ValueError(f"queue_depth must be >= 1, got {queue_depth}")
        if block is not None:
            _check_block(block)
        self.path = str(path)
        self.queue_depth = int(queue_depth)
        self.direct = False
        self.fd = -1
        self._open(direct)
        self.file_size = os.fstat(self.fd).st_size
        if block is None:
            block = direct_block_size(self.fd, self.file_size) if self.direct else PAGE
        self.block = int(block)
        self._buf: mmap.mmap | None = None
        self._view: np.ndarray | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self.pages_read = self.bytes_read = self.reads = 0

    def _open(self, direct: bool) -> None:
        flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
        odirect = getattr(os, "O_DIRECT", 0)
        if direct and odirect:
            try:
                self.fd = os.open(self.path, flags | odirect)
                self.direct = True
                return
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise DatasetError(f"{self.path}: cannot open ({e.strerror})") from None
                self._say_buffered("the filesystem refuses O_DIRECT at open")
        try:
            self.fd = os.open(self.path, flags)
        except OSError as e:
            raise DatasetError(f"{self.path}: cannot open ({e.strerror})") from None
        self.direct = False

    def _say_buffered(self, why: str) -> None:
        log.warning(
            "gnnio: %s: %s; reading feature rows buffered (through the page cache) instead",
            self.path,
            why,
        )

    def _fall_back(self) -> None:
        """Reopen without ``O_DIRECT`` after a read refused it (``EINVAL``)."""
        os.close(self.fd)
        self._say_buffered("the filesystem refuses O_DIRECT reads")
        self._open(False)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self._view = self._buf = None

    def reset(self) -> None:
        self.pages_read = self.bytes_read = self.reads = 0

    def _buffer(self, nbytes: int) -> np.ndarray:
        """A page-aligned uint8 buffer of at least ``nbytes`` (grown by doubling, then reused)."""
        if self._buf is None or len(self._buf) < nbytes:
            # the old buffer is dropped, not closed: a caller may still hold a view of it
            self._view = self._buf = None
            size = max(PAGE, 1 << max(0, int(nbytes - 1).bit_length()))
            self._buf = mmap.mmap(-1, size)
            self._view = np.frombuffer(self._buf, dtype=np.uint8)
        assert self._view is not None
        return self._view

    def read(self, plan: PagePlan) -> np.ndarray:
        """The blocks of ``plan`` back to back in the (reused) buffer; valid until the next call.
        Bytes past the end of the file read as whatever the buffer held (no span reaches there)."""
        if plan.block % self.block:
            raise ValueError(
                f"a plan of {plan.block}-byte blocks; this reader reads multiples of {self.block}"
            )
        with self._lock:
            buf = self._buffer(max(PAGE, plan.pages.size * plan.block))
            nruns = int(plan.run_start.size)
            if nruns == 0:
                return buf
            try:
                self._read_all(plan, buf, nruns)
            except OSError as e:
                if e.errno != errno.EINVAL or not self.direct:
                    raise
                self._fall_back()
                self._read_all(plan, buf, nruns)
            self.pages_read += int(plan.pages.size)
            self.reads += nruns
            return buf

    def _read_all(self, plan: PagePlan, buf: np.ndarray, nruns: int) -> None:
        workers = min(self.queue_depth, nruns)
        if workers <= 1 or nruns < 4:
            self.bytes_read += self._read_runs(plan, buf, 0, nruns)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.queue_depth, thread_name_prefix="gnnio-disk")
        cuts = np.linspace(0, nruns, workers + 1).astype(np.int64)
        futs = [
            self._pool.submit(self._read_runs, plan, buf, int(a), int(b))
            for a, b in zip(cuts[:-1], cuts[1:], strict=True)
            if b > a
        ]
        err = None
        for f in futs:  # wait for every read before the buffer is reused or an error leaves
            try:
                self.bytes_read += f.result()
            except BaseException as e:  # noqa: BLE001 - re-raised below, after the others end
                err = err or e
        if err is not None:
            raise err

    def _read_runs(self, plan: PagePlan, buf: np.ndarray, a: int, b: int) -> int:
        """Runs ``[a, b)`` of ``plan`` into ``buf``; returns the bytes read."""
        mv = buf.data  # (the array's buffer as a memoryview)
        fd, size, total, bs = self.fd, self.file_size, 0, plan.block
        pages, rs, rl = plan.pages, plan.run_start, plan.run_len
        for r in range(a, b):
            i, n = int(rs[r]), int(rl[r])
            off = int(pages[i]) * bs
            want = min(n * bs, size - off)
            try:
                got = os.preadv(fd, [mv[i * bs : (i + n) * bs]], off)
            except OSError as e:
                if e.errno == errno.EINVAL and self.direct:
                    raise
                raise DatasetError(
                    f"{self.path}: read error at byte {off} ({e.strerror or e}); the feature file "
                    "or its device is damaged"
                ) from None
            if got < want:
                raise DatasetError(
                    f"{self.path}: truncated: a read at byte {off} returned {got} of {want} bytes "
                    f"(the file is shorter than its {size} bytes at open)"
                )
            total += got
        return total


if HAVE_NUMBA:

    @njit(parallel=True, nogil=True, cache=True)
    def _copy_spans(buf, pos, out, dst):  # pragma: no cover - compiled, tested via copy_spans
        rb = out.shape[1]
        for k in prange(pos.shape[0]):
            p = pos[k]
            out[dst[k], :] = buf[p : p + rb]


def copy_spans(buf: np.ndarray, pos: np.ndarray, out: np.ndarray, dst: np.ndarray) -> None:
    """``out[dst[k]] = buf[pos[k] : pos[k] + out.shape[1]]`` for every ``k`` (uint8 arrays)."""
    if pos.size == 0 or out.shape[1] == 0:
        return
    if HAVE_NUMBA:
        _copy_spans(buf, pos.astype(np.int64, copy=False), out, dst.astype(np.int64, copy=False))
    else:  # pragma: no cover
        out[dst] = buf[pos[:, None] + np.arange(out.shape[1])]
