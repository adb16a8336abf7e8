"""Id lookups of the partitioned sampler without an array sized by the whole graph (numba).

A rank of :class:`~gnnio.distributed.sampling.ShardedSampler` holds only its shard (issue 26),
so it cannot keep the single-process samplers' ``[N]`` global-to-local map. Two structures
replace it:

* :class:`ShardIndex`: the row of a global id in a shard. The shard's node ids sorted, their rows,
  and a *bucket directory* over the id space (``N >> shift`` + 2 offsets, ``shift`` chosen so
  there are about a quarter as many buckets as stored nodes): a lookup reads the bucket's bounds
  and searches the few sorted ids inside it, a cache line or two, where a binary search over the
  whole shard touched ~20 far-apart ones (16 bytes per stored node, as before, plus ~2 for the
  directory).
* :class:`BatchIds`: the batch's global ids -> local ids, in order of first appearance (seeds
  first, then each hop's new ids as they first occur in its sampled lists, which is the
  single-process samplers' numbering), an open-addressing hash table sized by the batch and
  grown by rehashing.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..sampling._kernels import mix64
from ..sampling._las_kernels import _lower_bound

__all__ = ["BatchIds", "ShardIndex"]


@njit(cache=True, nogil=True)
def _lookup(sorted_ids, order, directory, shift, queries, out):
    for i in range(queries.shape[0]):
        q = queries[i]
        b = q >> shift
        if q < 0 or b + 1 >= directory.shape[0]:
            out[i] = -1
            continue
        hi = directory[b + 1]
        lo = _lower_bound(sorted_ids, directory[b], hi, q)
        out[i] = order[lo] if lo < hi and sorted_ids[lo] == q else -1


class ShardIndex:
    """The row of every stored global id of a shard (module docstring)."""

    def __init__(self, nodes: np.ndarray) -> None:
        nodes = np.asarray(nodes, dtype=np.int64)
        self.order = np.argsort(nodes, kind="stable")
        self.sorted = nodes[self.order]
        top = int(self.sorted[-1]) + 1 if self.sorted.size else 1
        want = max(self.sorted.size // 4, 1)
        self.shift = max(int(np.ceil(np.log2(max(top / want, 1.0)))), 0)
        edges = np.arange((top >> self.shift) + 2, dtype=np.int64) << self.shift
        self.directory = np.searchsorted(self.sorted, edges).astype(np.int64)

    def rows_of(self, ids: np.ndarray) -> np.ndarray:
        """The row of every id in ``ids`` (-1 where the shard does not store it)."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        out = np.empty(ids.shape[0], dtype=np.int64)
        _lookup(self.sorted, self.order, self.directory, np.int64(self.shift), ids, out)
        return out


@njit(cache=True, nogil=True)
def _insert(keys, vals, mask, ids, start, nodes, n, local, limit):
    """Look up ``ids[start:]`` in order; a new id gets local id ``n`` (then ``n + 1``...) and is
    appended to ``nodes``; each id's local id goes to ``local``. Stops before an insertion would
    take the table past ``limit`` entries: returns ``(n, the position reached)``."""
    for i in range(start, ids.shape[0]):
        key = ids[i]
        h = np.int64(mix64(np.uint64(key)) & np.uint64(mask))
        while keys[h] != -1 and keys[h] != key:
            h = (h + 1) & mask
        if keys[h] == -1:
            if n >= limit:
                return n, i
            keys[h] = key
            vals[h] = n
            nodes[n] = key
            n += 1
        local[i] = vals[h]
    return n, ids.shape[0]


class BatchIds:
    """A batch's global ids -> local ids in order of first appearance (module docstring). The
    table doubles (a rehash of the ids so far) whenever it would be more than half full, so it
    stays sized by the batch's distinct ids, not by the ids looked up."""

    def __init__(self, seeds: np.ndarray) -> None:
        seeds = np.ascontiguousarray(seeds, dtype=np.int64)
        self.n = 0
        self.nodes = np.empty(max(2 * seeds.shape[0], 16), dtype=np.int64)
        self._table(4 * seeds.shape[0])
        self.add(seeds)

    def _table(self, size: int) -> None:
        cap = 1 << max(int(size - 1).bit_length(), 4)
        self.keys = np.full(cap, -1, dtype=np.int64)
        self.vals = np.empty(cap, dtype=np.int64)
        self.mask = np.int64(cap - 1)
        self.limit = cap // 2
        if self.n:  # rehash the ids so far (their local ids are their positions)
            old = self.nodes[: self.n].copy()
            tmp = np.empty(self.n, dtype=np.int64)
            _insert(self.keys, self.vals, self.mask, old, 0, self.nodes, 0, tmp, self.limit)

    def add(self, ids: np.ndarray) -> np.ndarray:
        """The local id of every id in ``ids``; ids not seen before are numbered in order."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        most = self.n + ids.shape[0]
        if most > self.nodes.shape[0]:
            grown = np.empty(max(most, 2 * self.nodes.shape[0]), dtype=np.int64)
            grown[: self.n] = self.nodes[: self.n]
            self.nodes = grown
        local = np.empty(ids.shape[0], dtype=np.int64)
        i = 0
        while True:
            n, i = _insert(self.keys, self.vals, self.mask, ids, i, self.nodes, self.n, local,
                           self.limit)  # fmt: skip
            self.n = int(n)
            if i >= ids.shape[0]:
                return local
            self._table(2 * self.keys.shape[0])

    def ids(self) -> np.ndarray:
        """The batch's global ids, local id order."""
        return self.nodes[: self.n]
