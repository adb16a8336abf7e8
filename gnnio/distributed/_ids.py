"""Id lookups of the partitioned sampler without an array sized by the whole graph (numba).

A rank of :class:`~gnnio.distributed.sampling.ShardedSampler` holds only its shard (issue 26),
so it cannot keep the single-process samplers' ``[N]`` global-to-local map. Two structures
replace it:

* :class:`ShardIndex`: the row of a global id in a shard. The shard's node ids sorted, each
  beside its row (one ``[n, 2]`` array: a hit reads one cache line, not one in each of two
  arrays), and a *bucket directory* over the id space (``N >> shift`` + 2 offsets, ``shift``
  chosen so there are about a quarter as many buckets as stored nodes): a lookup reads the
  bucket's bounds and scans the few sorted ids inside it (halving a crowded bucket first),
  where a binary search over the whole shard touched ~20 far-apart ones (16 bytes per stored
  node, as before, plus ~2 for the directory).
* :class:`BatchIds`: the batch's global ids -> local ids, in order of first appearance (seeds
  first, then each hop's new ids as they first occur in its sampled lists, which is the
  single-process samplers' numbering), an open-addressing hash table sized by the batch (by
  the sampler's last batch, else each hop's new ids estimated from the last hop's rate) and
  grown by rehashing.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..utils.prefetch import prefetch, prefetch_row

__all__ = ["BatchIds", "ShardIndex", "place_rows"]

# lookups / inserts ahead whose cache lines are prefetched: the ids are in first-appearance
# order, so every one is a miss, and a mispredicted branch per id (stored or not, new or not)
# keeps the CPU from running ahead on its own (2^21-node graph, one rank's batches, quiet VM:
# shard lookups 1.1-1.6 -> 0.7 ms, the batch's inserts ~10% faster)
_PF = 16
_FIB = np.uint64(0x9E3779B97F4A7C15)  # 2^64 / golden ratio: Fibonacci hashing


@njit(cache=True, nogil=True)
def _lookup(pairs, directory, shift, queries, out):
    m, top = queries.shape[0], directory.shape[0] - 1
    for i in range(m):
        if i + 2 * _PF < m:  # the directory entry two strides ahead, the ids one stride ahead
            prefetch(directory, queries[i + 2 * _PF] >> shift)
        if i + _PF < m:
            b = queries[i + _PF] >> shift
            if 0 <= b < top:
                prefetch_row(pairs, directory[b], 0)
        q = queries[i]
        b = q >> shift
        if q < 0 or b + 1 >= directory.shape[0]:
            out[i] = -1
            continue
        lo, end = directory[b], directory[b + 1]
        hi = end
        # (not _las_kernels._lower_bound over pairs[:, 0]: measured 8-15 % slower here, the
        # scan of a bucket's few ids beats halving it to the end)
        while hi - lo > 8:  # a crowded bucket: halve it (``pairs[hi]`` stays >= q)...
            mid = (lo + hi) >> 1
            if pairs[mid, 0] < q:
                lo = mid + 1
            else:
                hi = mid
        while lo < hi and pairs[lo, 0] < q:  # ...then scan the few ids left
            lo += 1
        out[i] = pairs[lo, 1] if lo < end and pairs[lo, 0] == q else -1


class ShardIndex:
    """The row of every stored global id of a shard (module docstring)."""

    def __init__(self, nodes: np.ndarray) -> None:
        nodes = np.asarray(nodes, dtype=np.int64)
        order = np.argsort(nodes, kind="stable")
        # each stored id beside its row: a lookup's hit reads one cache line, not two
        self.pairs = np.empty((nodes.shape[0], 2), dtype=np.int64)
        self.pairs[:, 0] = nodes[order]
        self.pairs[:, 1] = order
        top = int(self.pairs[-1, 0]) + 1 if nodes.size else 1
        want = max(nodes.size // 4, 1)
        self.shift = max(int(np.ceil(np.log2(max(top / want, 1.0)))), 0)
        edges = np.arange((top >> self.shift) + 2, dtype=np.int64) << self.shift
        self.directory = np.searchsorted(self.pairs[:, 0], edges).astype(np.int64)

    def rows_of(self, ids: np.ndarray) -> np.ndarray:
        """The row of every id in ``ids`` (-1 where the shard does not store it)."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        out = np.empty(ids.shape[0], dtype=np.int64)
        _lookup(self.pairs, self.directory, np.int64(self.shift), ids, out)
        return out


@njit(cache=True, nogil=True)
def _insert(table, bits, ids, start, nodes, n, local, limit):
    """Look up ``ids[start:]`` in order; a new id gets local id ``n`` (then ``n + 1``...) and is
    appended to ``nodes``; each id's local id goes to ``local``. ``table`` interleaves each
    slot's key and value (``2 h``, ``2 h + 1``: one cache line per probe). Stops before an
    insertion would take the table past ``limit`` entries: returns ``(n, the position
    reached)``. A key's slot: the top ``bits`` bits of ``key * _FIB`` (one multiply; ids that
    share low bits, a stride of the table's size, still spread)."""
    m = ids.shape[0]
    mask = (np.int64(1) << bits) - 1
    down = np.uint64(64) - np.uint64(bits)
    for i in range(start, m):
        if i + _PF < m:
            prefetch(table, 2 * np.int64((np.uint64(ids[i + _PF]) * _FIB) >> down))
        key = ids[i]
        h = np.int64((np.uint64(key) * _FIB) >> down)
        while True:
            k = table[2 * h]
            if k == key or k == -1:
                break
            h = (h + 1) & mask
        if k == -1:
            if n >= limit:
                return n, i
            table[2 * h] = key
            table[2 * h + 1] = n
            nodes[n] = key
            n += 1
        local[i] = table[2 * h + 1]
    return n, m


class BatchIds:
    """A batch's global ids -> local ids in order of first appearance (module docstring).

    The table is kept at most half full and sized by the batch, never by the graph: before each
    :meth:`add` it grows to twice the ids so far plus the new ones expected at the rate the
    previous call found new ids (every id, after the seeds), and it doubles (a rehash) should
    that fall short. Growing only by doubling rehashed the 2^21-node graph's batches six times:
    2.9x the time with the estimate (6.4 against 2.2 ms per batch for this step alone, the
    development VM, 2026-11-29), with tables of the same size at the end (262,144 slots for
    ~84,000 ids).

    Given ``expect`` (the ids an earlier batch numbered), the table starts sized for them and
    the estimate is used only once this batch has outgrown it: the estimate runs ahead of a
    batch's falling rate of new ids (its last hop expected ~140,000 ids of the 2^21-node graph's
    ~104,000, and doubled the table to 524,288 slots: 8 MiB to fill and miss in, where 4 do),
    while batches of one sampler are alike, so a batch like the last needs no rehash at all."""

    def __init__(
        self, seeds: np.ndarray, buffer: np.ndarray | None = None, expect: int = 0
    ) -> None:
        """``buffer``: an int64 array to hold the table while it fits (an earlier batch's
        :attr:`buffer`): a fresh one costs a page fault per 4 KiB on every batch where freed
        memory goes back to the system (the ranks' heap). ``expect``: the ids an earlier batch
        numbered (0: unknown; class docstring)."""
        seeds = np.ascontiguousarray(seeds, dtype=np.int64)
        self.buffer = np.empty(0, dtype=np.int64) if buffer is None else buffer
        self.n = 0
        self.rate = 1.0  # new ids / ids looked up, in the last add
        self.rehashes = 0  # tables filled again (grown with ids in them)
        self.nodes = np.empty(max(2 * seeds.shape[0], 16), dtype=np.int64)
        self.expect = max(int(expect), 0)
        self._table(2 * max(seeds.shape[0], self.expect))
        self.add(seeds)

    def _table(self, size: int) -> None:
        cap = 1 << max(int(size - 1).bit_length(), 4)
        if self.buffer.shape[0] < 2 * cap:  # (a rehash reads the ids from nodes, not the table)
            self.buffer = np.empty(2 * cap, dtype=np.int64)
        self.table = self.buffer[: 2 * cap]
        self.table.fill(-1)
        self.cap = cap
        self.bits = np.int64(cap.bit_length() - 1)
        self.limit = cap // 2
        if self.n:  # rehash the ids so far (their local ids are their positions)
            self.rehashes += 1
            old = self.nodes[: self.n].copy()
            tmp = np.empty(self.n, dtype=np.int64)
            _insert(self.table, self.bits, old, 0, self.nodes, 0, tmp, self.limit)

    def add(self, ids: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The local id of every id in ``ids``; ids not seen before are numbered in order.
        ``out``: an int64 array for them (``ids`` itself is fine: each id is read before its
        local id is written)."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        most = self.n + ids.shape[0]
        if most > self.nodes.shape[0]:
            grown = np.empty(max(most, 2 * self.nodes.shape[0]), dtype=np.int64)
            grown[: self.n] = self.nodes[: self.n]
            self.nodes = grown
        expect = self.n + int(np.ceil(ids.shape[0] * self.rate))
        if expect > self.limit and self.n >= self.expect:
            self._table(2 * expect)
        local = np.empty(ids.shape[0], dtype=np.int64) if out is None else out
        n0, i = self.n, 0
        while True:
            n, i = _insert(self.table, self.bits, ids, i, self.nodes, self.n, local, self.limit)
            self.n = int(n)
            if i >= ids.shape[0]:
                if ids.shape[0]:
                    self.rate = (self.n - n0) / ids.shape[0]
                return local
            self._table(2 * self.cap)

    def ids(self) -> np.ndarray:
        """The batch's global ids, local id order."""
        return self.nodes[: self.n]


@njit(cache=True, nogil=True)
def place_rows(offs, where, counts, flat, edges):
    """Put rows ``where``'s sampled ids (``counts`` each, one after the other in ``flat``) at
    their rows' places in a hop's ``[2, E]`` edges (``offs``: the hop's row offsets): row 0 the
    ids, row 1 the row."""
    p = 0
    for j in range(where.shape[0]):
        i = where[j]
        o = offs[i]
        for q in range(counts[j]):
            edges[0, o + q] = flat[p + q]
            edges[1, o + q] = i
        p += counts[j]
