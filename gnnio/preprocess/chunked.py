"""Building a CSR within a memory budget (issue 25, item 1: ``gnnio prepare ... --memory-budget``).

The in-memory importers sort one int64 key ``dst * N + src`` per directed edge (8 bytes per edge,
plus the edge list itself) and write the result. :func:`build_csr` does the same work in
*buckets* of destination rows: a first pass over the edges counts each row's keys (duplicates
included), the rows are cut into consecutive ranges whose keys fit the budget, and each range is
one more pass over the edges that collects its keys, sorts and deduplicates them in RAM, and
appends the neighbour ids to a file. Sorting ``(dst - a) * N + src`` within the range orders the
keys exactly as the global sort does, so ``indptr`` and ``indices`` are the in-memory path's, bit
for bit (:func:`gnnio.importers._common.edges_to_graph`, ``drop_self_loops`` off).

The edges come from any re-iterable source of ``(src, dst)`` int64 chunks; :class:`EdgeArrays`
reads them from (memory-mapped) arrays, an edge list or a CSR, and drops the input pages it read
after each chunk (:func:`gnnio.utils.pages.drop_pages`), so a pass over a file of any size keeps
one chunk resident.

What the budget counts here: the per-node arrays (the row counts, their prefix sum, the output
``indptr``: 24 bytes per node, :func:`csr_fixed_bytes`), one chunk of edges (``CHUNK_EDGES`` x 48
bytes) and the bucket (8 bytes per key). A row with more keys than the whole bucket holds is
built alone (over the budget by its own size: a hub row is never split).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator

import numba
import numpy as np

from ..errors import UsageError
from ..graph.csr import index_dtype
from ..utils.pages import drop_pages
from ..utils.progress import bar
from .budget import cum_ranges

__all__ = [
    "CHUNK_EDGES",
    "DEFAULT_BUDGET_FRACTION",
    "MIN_BUCKET",
    "EdgeArrays",
    "build_csr",
    "csr_fixed_bytes",
    "default_budget",
    "resolve_budget",
    "refuse_budget",
    "write_npy_from_file",
    "write_to",
]

#: edges read per chunk of a pass
CHUNK_EDGES = 1 << 20
#: bytes a chunk of edges costs while it is processed (src and dst int64, their casts, masks)
_CHUNK_COST = 48
#: the least a budget must leave for the bucket of keys (bytes)
MIN_BUCKET = 1 << 20
#: ``gnnio prepare``'s default ``--memory-budget``: this share of the available RAM
DEFAULT_BUDGET_FRACTION = 0.5


def default_budget() -> int:
    """:data:`DEFAULT_BUDGET_FRACTION` of ``MemAvailable`` (4 GiB where the system does not say)."""
    from ..utils.rss import available_ram

    avail = available_ram()
    return int(DEFAULT_BUDGET_FRACTION * avail) if avail else 4 << 30


def resolve_budget(text: str | None, default_applies: bool = True) -> int | None:
    """``--memory-budget`` as bytes for ``prepare``, ``reorder``, ``partition`` and ``plan``:
    None (work in RAM) for ``none``, or when the user named no budget and the work has no
    bounded path (``default_applies`` False: METIS, bfs-block, ``--refine``); otherwise the named
    budget, or :func:`default_budget` when none was named (issue 25: "the default is a fraction of
    the available RAM")."""
    from ..placement.topology import parse_bytes

    if text is None:
        return default_budget() if default_applies else None
    if str(text).strip().lower() == "none":
        return None
    return parse_bytes(text, "--memory-budget")


def refuse_budget(budget: int, need: int, what: str, parts: str) -> None:
    """One-line UsageError when ``budget`` is below ``need`` bytes (``parts`` says what they are)."""
    if budget < need:
        raise UsageError(
            f"--memory-budget: {budget:,} bytes cannot {what}; at least {need:,} are needed "
            f"({parts}); name a larger budget, or 'none' to work in RAM"
        )


def csr_fixed_bytes(num_nodes: int, num_edges: int | None = None) -> int:
    """Bytes :func:`build_csr` keeps besides the bucket: the per-node arrays and one chunk (of
    at most ``num_edges`` edges)."""
    chunk = CHUNK_EDGES if num_edges is None else min(CHUNK_EDGES, int(num_edges))
    return 24 * (int(num_nodes) + 1) + chunk * _CHUNK_COST


# --------------------------------------------------------------------------- edge sources


class EdgeArrays:
    """Re-iterable ``(src, dst)`` int64 chunks of an edge list ``src[i] -> dst[i]`` (two 1-D
    arrays, e.g. views of a memory-mapped ``[2, E]`` or ``[E, 2]`` file) or of a CSR of
    in-neighbours (``indices`` as ``src``, ``dst`` from ``indptr``). Pages of the mapped inputs
    are dropped after each chunk."""

    def __init__(self, src, dst=None, indptr=None, chunk: int | None = None):
        if (dst is None) == (indptr is None):
            raise ValueError("EdgeArrays: give dst or indptr")
        self.src, self.dst = src, dst
        self.indptr = None if indptr is None else np.ascontiguousarray(indptr, dtype=np.int64)
        self.chunk = int(CHUNK_EDGES if chunk is None else chunk)
        self.num_edges = int(src.shape[0])

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for a in range(0, self.num_edges, self.chunk):
            b = min(self.num_edges, a + self.chunk)
            s = np.array(self.src[a:b], dtype=np.int64)
            if self.indptr is not None:
                d = np.searchsorted(self.indptr, np.arange(a, b, dtype=np.int64), side="right")
                d -= 1
            else:
                d = np.array(self.dst[a:b], dtype=np.int64)
                drop_pages(self.dst)
            drop_pages(self.src)
            yield s, d

    def min_max(self) -> tuple[int, int]:
        """The smallest and largest node id of the edges, one pass (``(0, -1)`` without edges)."""
        lo: int | None = None
        hi: int | None = None
        for s, d in self:
            if s.size:
                m0, m1 = int(min(s.min(), d.min())), int(max(s.max(), d.max()))
                lo = m0 if lo is None else min(lo, m0)
                hi = m1 if hi is None else max(hi, m1)
        return (0, -1) if lo is None or hi is None else (lo, hi)


# --------------------------------------------------------------------------- kernels


@numba.njit(cache=True, nogil=True)
def _count_rows(src, dst, counts, symmetrize):
    for i in range(dst.shape[0]):
        counts[dst[i]] += 1
        if symmetrize:
            counts[src[i]] += 1


@numba.njit(cache=True, nogil=True)
def _fill_bucket(src, dst, a, b, n, buf, pos, symmetrize):
    for i in range(dst.shape[0]):
        d = dst[i]
        s = src[i]
        if a <= d < b:
            if pos == buf.shape[0]:
                return -1
            buf[pos] = (d - a) * n + s
            pos += 1
        if symmetrize and a <= s < b:
            if pos == buf.shape[0]:
                return -1
            buf[pos] = (s - a) * n + d
            pos += 1
    return pos


@numba.njit(cache=True, nogil=True)
def _unique_sorted_inplace(keys):
    """Compact a sorted array's distinct values to its front; returns how many there are."""
    m = keys.shape[0]
    if m == 0:
        return 0
    w = 1
    for i in range(1, m):
        if keys[i] != keys[w - 1]:
            keys[w] = keys[i]
            w += 1
    return w


@numba.njit(cache=True, nogil=True)
def _row_counts(keys, n, deg):
    for i in range(keys.shape[0]):
        deg[keys[i] // n] += 1


# --------------------------------------------------------------------------- the builder


def _buckets(counts: np.ndarray, cap: int) -> Iterator[tuple[int, int]]:
    """Consecutive row ranges ``[a, b)`` whose summed ``counts`` stay within ``cap`` keys (at
    least one row each)."""
    cum = np.zeros(counts.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=cum[1:])
    return cum_ranges(cum, cap)


def build_csr(
    writer,
    edges: Iterable[tuple[np.ndarray, np.ndarray]] | Callable[[], Iterable],
    num_nodes: int,
    budget: int,
    symmetrize: bool = False,
    progress: bool = False,
    desc: str = "csr",
    max_bucket_keys: int | None = None,
) -> int:
    """Write the deduplicated CSR of in-neighbours of ``edges`` as ``indptr`` (int64 [N+1]) and
    ``indices`` (:func:`gnnio.graph.csr.index_dtype`) through ``writer`` (a
    :class:`gnnio.graph.DatasetWriter`), in buckets of rows whose keys fit in ``budget`` bytes
    less :func:`csr_fixed_bytes`. ``edges`` is iterated once per bucket plus once (ids must lie
    in ``[0, N)``, checked by the caller); ``max_bucket_keys`` caps a bucket further. Returns the
    number of edges written."""
    n = int(num_nodes)
    if n > 3_037_000_499:  # (dst - a) * N + src must fit in int64
        raise ValueError(f"build_csr: {n} nodes is too many for int64 edge keys")
    it = edges if callable(edges) else (lambda: edges)
    counts = np.zeros(n, dtype=np.int64)
    for s, d in it():
        _count_rows(s, d, counts, symmetrize)
    total = int(counts.sum())
    cap = max(1, (int(budget) - csr_fixed_bytes(n, total)) // 8)
    if max_bucket_keys is not None:
        cap = min(cap, int(max_bucket_keys))
    deg = np.zeros(n, dtype=np.int64)
    idt = index_dtype(n)
    part = writer.tmp / "indices.part"
    try:
        with open(part, "wb") as f, bar(total, desc=desc, unit="edge", enabled=progress) as pb:
            for a, b in _buckets(counts, cap):
                want = int(counts[a:b].sum())
                buf = np.empty(want, dtype=np.int64)
                pos = 0
                for s, d in it():
                    pos = _fill_bucket(s, d, a, b, n, buf, pos, symmetrize)
                    if pos < 0:
                        break
                if pos != want:  # the counting pass saw other edges: never write a wrong CSR
                    raise RuntimeError(f"build_csr: the edges of rows [{a}, {b}) changed between "
                                       "two passes over them")  # fmt: skip
                buf.sort()
                m = _unique_sorted_inplace(buf)
                keys = buf[:m]
                _row_counts(keys, n, deg[a:b])
                step = 1 << 20  # keys converted and written at a time (in _CHUNK_COST)
                for s0 in range(0, m, step):
                    write_to(f, np.remainder(keys[s0 : s0 + step], n).astype(idt), part)
                del buf, keys
                pb.update(want)
        del counts
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(deg, out=indptr[1:])
        del deg
        writer.save_array("indptr", indptr)
        e = int(indptr[-1])
        del indptr
        write_npy_from_file(writer, "indices", part, idt, e)
    finally:
        part.unlink(missing_ok=True)
    return e


def write_to(f, data, path) -> None:
    """``f.write(data)`` (an array's bytes or bytes) with ``path`` named in the OSError of a failed
    write (a full disk, a file size limit), which the dataset writer turns into one line."""
    try:
        f.write(np.ascontiguousarray(data).data if isinstance(data, np.ndarray) else data)
    except OSError as e:
        raise OSError(e.errno, e.strerror or str(e), str(path)) from None


def write_npy_from_file(writer, key: str, raw, dtype, length: int) -> None:
    """Array ``key`` of ``writer`` (1-D, ``length`` items of ``dtype``) from the raw bytes of the
    file ``raw``, copied with file reads and writes (no mapping made resident). The ``.npy``
    header is the writer's (:meth:`~gnnio.graph.DatasetWriter.create_array`), as ``np.save``
    writes it."""
    dtype = np.dtype(dtype)
    arr = writer.create_array(key, (int(length),), dtype)
    offset = int(arr.offset)
    del arr
    nbytes = int(length) * dtype.itemsize
    if os.path.getsize(raw) != nbytes:
        raise ValueError(f"write_npy_from_file: {raw} holds {os.path.getsize(raw)} bytes, "
                         f"expected {nbytes}")  # fmt: skip
    with open(raw, "rb") as src, open(writer.path(key), "r+b") as dst:
        dst.seek(offset)
        while block := src.read(64 << 20):
            write_to(dst, block, writer.path(key))
