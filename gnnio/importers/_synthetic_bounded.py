"""The synthetic graph within a memory budget (``gnnio prepare synthetic --memory-budget``).

The same draws as :func:`gnnio.importers._synthetic_graph.generate`, in the same order, so the
same files bit for bit; what changes is where the bytes live:

- **Pair keys.** The unique pair keys (8 bytes per undirected pair) stay in RAM, in one buffer
  sized up front (:class:`BoundedKeys`). A round's chunks are collected in a round buffer of
  what the budget leaves, sorted, deduplicated and merged into the keys *in place*, from the back
  (the in-memory path concatenates a round, then ``np.insert`` makes a second copy of all keys).
  Merging a round in several pieces gives the same set and the same count of new same-class
  pairs as merging it at once.
- **Trim.** The protected pairs, tiers and classes are one byte per pair (:func:`trim_bounded`);
  each pool's random draw is ``rng.choice(pool_size, ...)``, the same stream of numbers as the
  in-memory ``rng.choice(pool, ...)`` (NumPy draws positions, then indexes ``pool``), and the
  dropped pairs are compacted out of the buffer in place.
- **CSR.** Relabelled pairs are streamed from the keys into
  :func:`gnnio.preprocess.chunked.build_csr` (buckets of destination rows), never as the
  in-memory path's 16 bytes per directed edge of sort keys plus the relabelled ``lo``/``hi``.

What stays in RAM regardless of the budget: the keys (8 bytes per pair, 8 % of headroom for the
top-up rounds), round 0 (the backbone: about 70 bytes per node while it is drawn), one chunk of
R-MAT pairs (:data:`_CHUNK_PAIRS` of them, about 64 bytes each) and the per-node arrays;
:func:`need_bytes` adds them up and a smaller budget is refused before anything is written.
"""

from __future__ import annotations

import numba
import numpy as np

from ..preprocess.chunked import (
    CHUNK_EDGES,
    MIN_BUCKET,
    _unique_sorted_inplace,
    build_csr,
    csr_fixed_bytes,
)
from ._synthetic_graph import _CHUNK_PAIRS, draw_pairs, finish_info

__all__ = ["BoundedKeys", "generate_bounded", "need_bytes", "trim_bounded"]

#: bytes one R-MAT pair of a chunk costs while it is drawn, rewired and keyed
_PAIR_COST = 64
#: bytes per node of round 0 (the backbone pairs) while they are drawn
_ROUND0_PER_NODE = 72
_DROPPED = 6  # trim code of a dropped pair (codes 0-5 are tier + 3 * same-class)


def _capacity(target: int) -> int:
    return int(target * 1.08) + 4096


def _chunk_pairs(cap: int) -> int:
    """Pairs of the largest chunk a round draws: at most :data:`_CHUNK_PAIRS`, and counted as at
    most twice the keys, which the rounds do not exceed unless the graph is near-complete (then
    a chunk may cost up to :data:`_CHUNK_PAIRS` x :data:`_PAIR_COST` bytes beyond the budget)."""
    return min(_CHUNK_PAIRS, 2 * cap)


def need_bytes(num_nodes: int, target_pairs: int) -> int:
    """The least budget :func:`generate_bounded` accepts for ``num_nodes`` and the target pairs."""
    n, cap = int(num_nodes), _capacity(target_pairs)
    per_node = 2 * 8 * n  # labels and the relabelling, besides the classes (8 bytes at most)
    draw = 8 * cap + _chunk_pairs(cap) * (_PAIR_COST + 8)
    trim = 8 * cap + 11 * cap + 25 * n
    csr = 8 * cap + per_node + csr_fixed_bytes(n, cap) + MIN_BUCKET
    return max(_ROUND0_PER_NODE * n, draw, trim, csr) + 8 * n


# --------------------------------------------------------------------------- kernels


@numba.njit(cache=True, nogil=True)
def _count_fresh(keys, k, new, cls, n):
    """How many of the sorted unique ``new`` are not in ``keys[:k]``, and how many of those are
    same-class pairs."""
    i = 0
    fresh = 0
    same = 0
    for j in range(new.shape[0]):
        x = new[j]
        while i < k and keys[i] < x:
            i += 1
        if i < k and keys[i] == x:
            continue
        fresh += 1
        if cls[x // n] == cls[x % n]:
            same += 1
    return fresh, same


@numba.njit(cache=True, nogil=True)
def _merge_back(buf, k, new, fresh):
    """Merge the sorted unique ``new`` into the sorted unique ``buf[:k]`` in place (from the back;
    ``buf[:k + fresh]`` holds the union afterwards)."""
    i = k - 1
    j = new.shape[0] - 1
    w = k + fresh - 1
    while j >= 0:
        x = new[j]
        if i >= 0 and buf[i] > x:
            buf[w] = buf[i]
            i -= 1
            w -= 1
        elif i >= 0 and buf[i] == x:
            j -= 1
        else:
            buf[w] = x
            w -= 1
            j -= 1


@numba.njit(cache=True, nogil=True)
def _trim_codes(keys, n, cls, code):
    """``code[i] = tier + 3 * same_class`` of every pair, as :func:`_trim` computes them."""
    deg = np.zeros(n, dtype=np.int64)
    for i in range(keys.shape[0]):
        deg[keys[i] // n] += 1
        deg[keys[i] % n] += 1
    last_hi = np.full(n, -1, dtype=np.int64)
    has_lo = np.zeros(n, dtype=np.bool_)
    prev = -1
    n_same = 0
    for i in range(keys.shape[0]):
        lo = keys[i] // n
        hi = keys[i] % n
        t = 0 if deg[lo] >= 3 and deg[hi] >= 3 else 1
        if lo != prev:  # the first pair of each lo value is protected
            t = 2
            prev = lo
        has_lo[lo] = True
        last_hi[hi] = i
        s = 1 if cls[lo] == cls[hi] else 0
        n_same += s
        code[i] = t + 3 * s
    for v in range(n):  # the last pair of a node that is never a lo is protected
        if last_hi[v] >= 0 and not has_lo[v]:
            i = last_hi[v]
            code[i] = 2 + 3 * (code[i] // 3)
    return n_same


@numba.njit(cache=True, nogil=True)
def _mark(code, c, sel):
    """Mark the pairs of pool ``c`` whose rank in it is selected (``sel``) as dropped."""
    r = 0
    for i in range(code.shape[0]):
        if code[i] == c:
            if sel[r]:
                code[i] = _DROPPED
            r += 1


@numba.njit(cache=True, nogil=True)
def _compact(keys, code):
    w = 0
    for i in range(keys.shape[0]):
        if code[i] != _DROPPED:
            keys[w] = keys[i]
            w += 1
    return w


# --------------------------------------------------------------------------- the key set


class BoundedKeys:
    """The sorted unique pair keys in one buffer of ``capacity`` keys (grown if a round needs
    more), and a round buffer of ``round_keys`` keys in front of it (module docstring)."""

    def __init__(self, first: np.ndarray, capacity: int, round_keys: int, cls, n: int):
        self.buf = np.empty(max(int(capacity), first.size), dtype=np.int64)
        self.buf[: first.size] = first
        self.k = int(first.size)
        self.round = np.empty(max(1, int(round_keys)), dtype=np.int64)
        self.pos = 0
        self.cls, self.n = cls, int(n)
        self.same = 0

    @property
    def keys(self) -> np.ndarray:
        return self.buf[: self.k]

    @property
    def size(self) -> int:
        return self.k

    def add(self, chunk: np.ndarray) -> None:
        if self.pos + chunk.size > self.round.size:
            self._flush()
        if chunk.size > self.round.size:
            self._merge(chunk)
            return
        self.round[self.pos : self.pos + chunk.size] = chunk
        self.pos += chunk.size

    def end_round(self, cls, n) -> int:
        self._flush()
        same, self.same = self.same, 0
        return same

    def _flush(self) -> None:
        r = self.round[: self.pos]
        r.sort()
        self._merge(r[: _unique_sorted_inplace(r)])
        self.pos = 0

    def _merge(self, new: np.ndarray) -> None:
        fresh, same = _count_fresh(self.buf, self.k, new, self.cls, self.n)
        if self.k + fresh > self.buf.size:  # more than the headroom: grow (a copy)
            grown = np.empty(int((self.k + fresh) * 1.05) + 4096, dtype=np.int64)
            grown[: self.k] = self.buf[: self.k]
            self.buf = grown
        _merge_back(self.buf, self.k, new, fresh)
        self.k += int(fresh)
        self.same += int(same)

    def release_round(self) -> None:
        self.round = np.empty(0, dtype=np.int64)


def trim_bounded(rng, keys: BoundedKeys, cls, n: int, target: int, want_same: int) -> int:
    """:func:`gnnio.importers._synthetic_graph._trim` (``keep_protected`` off) in place on
    ``keys``, with the same draws; returns the number of pairs dropped."""
    size = keys.size
    if size <= target:
        return 0
    code = np.empty(size, dtype=np.int8)
    n_same = int(_trim_codes(keys.keys, int(n), cls, code))
    surplus = size - target
    drop_same = min(max(0, n_same - want_same), surplus)
    drop_same = max(drop_same, surplus - (size - n_same))
    for same, k in ((1, drop_same), (0, surplus - drop_same)):
        for t in range(3):
            if k == 0:
                break
            c = t + 3 * same
            pool = int(np.count_nonzero(code == c))
            take = min(k, pool)
            sel = np.ones(pool, dtype=np.bool_)
            if take < pool:
                sel[:] = False
                sel[rng.choice(pool, size=take, replace=False)] = True
            _mark(code, c, sel)
            del sel
            k -= take
    keys.k = int(_compact(keys.buf[:size], code))
    return surplus


def _round_keys(budget: int, cap: int, n: int) -> int:
    """Keys of the round buffer: what the budget leaves beside the keys, a chunk and the per-node
    arrays (at least 1024, at most the keys' capacity)."""
    fixed = 8 * cap + _chunk_pairs(cap) * _PAIR_COST + 20 * n
    return int(min(cap, max(1024, (budget - fixed) // 8)))


#: the most keys a bucket of the CSR build holds (None: what the budget leaves; tests set it)
BUCKET_KEYS_MAX: int | None = None


def generate_bounded(writer, budget: int, num_nodes, avg_degree, num_classes, seed, homophily,
                     rmat, rmat_noise, backbone_degree, progress) -> tuple[np.ndarray, dict]:  # fmt: skip
    """Steps 1-5 of the generator within ``budget`` bytes (at least :func:`need_bytes`, which the
    caller checked): writes ``indptr`` and ``indices`` through ``writer`` and returns ``(labels,
    info)`` as :func:`gnnio.importers._synthetic_graph.generate` would."""
    n = int(num_nodes)
    target = int(round(n * float(avg_degree) / 2))
    cap = _capacity(target)
    round_keys = _round_keys(budget, cap, n)

    def make_keys(first, cls):
        return BoundedKeys(first, cap, round_keys, cls, n)

    store, rng, cls, target, want_same, info = draw_pairs(
        num_nodes, avg_degree, num_classes, seed, homophily, rmat, rmat_noise,
        backbone_degree, progress, make_keys=make_keys,
    )  # fmt: skip
    store.release_round()
    trimmed = trim_bounded(rng, store, cls, n, target, want_same)

    perm = rng.permutation(n)
    labels = np.empty(n, dtype=np.int64)
    labels[perm] = cls
    keys = store.keys
    same = 0
    step = CHUNK_EDGES
    for s in range(0, keys.size, step):
        lo, hi = np.divmod(keys[s : s + step], n)
        same += int(np.count_nonzero(cls[lo] == cls[hi]))
    del cls

    def edges():
        for s in range(0, keys.size, step):
            lo, hi = np.divmod(keys[s : s + step], n)
            yield perm[lo], perm[hi]

    left = budget - 8 * store.buf.size - 16 * n
    build_csr(writer, edges, n, left, symmetrize=True, progress=progress, desc="synthetic: csr",
              max_bucket_keys=BUCKET_KEYS_MAX)  # fmt: skip
    return labels, finish_info(info, int(keys.size), same, trimmed)
