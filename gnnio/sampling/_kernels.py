"""Numba CPU kernels of the uniform neighbour sampler (used through :mod:`gnnio.sampling.uniform`).

Randomness is counter-based: the random stream of a destination row is
``splitmix64(hop_key ^ g * GAMMA)`` stepped by ``GAMMA`` (Steele et al.'s SplitMix64), where ``g``
is the destination's global id and ``hop_key`` mixes the sampler seed, the call key and the hop.
So the result never depends on how the rows are split over threads.

Per row with degree ``d`` and fanout ``k`` (``k < 0`` = all):

* ``d <= k`` (or ``k < 0``): every in-neighbour, in CSR order;
* ``d > k``: ``k`` distinct CSR positions drawn uniformly without replacement by Floyd's
  algorithm (for ``j`` in ``d-k .. d-1``: draw ``t`` in ``[0, j]``; keep ``t`` if new, else ``j``),
  with the membership test a linear scan of the row's own output slice for ``k <= 32`` (the slice
  sits in L1) and a small open-addressing hash set for larger ``k``. Random integers in
  ``[0, bound)`` come from Lemire's multiply-shift with rejection, so they are exactly uniform.

All kernels are serial and ``nogil``. Parallelism comes from the caller running
:func:`sample_rows` on disjoint row ranges in several Python threads (see
:class:`gnnio.sampling.uniform.UniformSampler`), not from ``prange``: numba's OpenMP layer shares
torch's libgomp, whose spin-waiting barriers made a 2-thread ``prange`` version 5-20x *slower* on a
loaded 2-core machine (every fork/join waits for a descheduled spinning thread), and
``OMP_WAIT_POLICY`` can only be set before torch is imported. Plain threads blocking on a queue do
not spin, so the sampler degrades gracefully when it shares cores with training.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = [
    "count_rows",
    "sample_rows",
    "split_rows",
    "relabel",
    "insert_seeds",
    "reset_range",
    "mix64",
]

_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_LOW32 = np.uint64(0xFFFFFFFF)
_TWO32 = np.uint64(1 << 32)
_LINEAR_MAX_K = 32


@njit(cache=True, nogil=True, inline="always")
def mix64(z):
    """SplitMix64 finalizer of a uint64."""
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


@njit(cache=True, nogil=True, inline="always")
def _bounded(state, bound):
    """Uniform integer in ``[0, bound)`` (``1 <= bound``); returns ``(value, new_state)``."""
    b = np.uint64(bound)
    if b <= _LOW32:
        # Lemire (2019): the high 32 bits of r32 * b are uniform after rejecting l < 2^32 mod b.
        while True:
            state = state + _GAMMA
            r = mix64(state) >> np.uint64(32)
            m = r * b
            low = m & _LOW32
            if low >= b or low >= (_TWO32 - b) % b:
                return np.int64(m >> np.uint64(32)), state
    # rows of 2^32 or more neighbours: 64-bit modulo with rejection
    threshold = (np.uint64(0) - b) % b
    while True:
        state = state + _GAMMA
        r = mix64(state)
        if r >= threshold:
            return np.int64(r % b), state


@njit(cache=True, nogil=True)
def _floyd_linear(out, off, d, k, state):
    """Write ``k`` distinct positions in ``[0, d)`` to ``out[off:off+k]`` (small ``k``)."""
    cnt = 0
    for j in range(d - k, d):
        t, state = _bounded(state, j + 1)
        for q in range(off, off + cnt):
            if out[q] == t:
                t = j
                break
        out[off + cnt] = t
        cnt += 1


@njit(cache=True, nogil=True)
def _floyd_hashed(out, off, d, k, state):
    """Floyd's algorithm with an open-addressing hash set (large ``k``)."""
    size = 1
    while size < 2 * k:
        size *= 2
    mask = size - 1
    table = np.full(size, -1, dtype=np.int64)
    cnt = 0
    for j in range(d - k, d):
        t, state = _bounded(state, j + 1)
        h = np.int64(mix64(np.uint64(t)) & np.uint64(mask))
        while table[h] != -1 and table[h] != t:
            h = (h + 1) & mask
        if table[h] == t:  # t already chosen: take j, which cannot be in the set yet
            t = j
            h = np.int64(mix64(np.uint64(t)) & np.uint64(mask))
            while table[h] != -1:
                h = (h + 1) & mask
        table[h] = t
        out[off + cnt] = t
        cnt += 1


@njit(cache=True, nogil=True)
def count_rows(indptr, dst_nodes, fanout):
    """Row sizes of one hop: ``rows[0]`` the CSR start, ``rows[1]`` the degree of each row.

    Returns ``(offs, rows)``: ``offs`` int64 ``[n + 1]`` with ``offs[0] = 0`` and
    ``offs[i + 1] - offs[i] = min(deg(dst_nodes[i]), fanout)`` (``fanout < 0`` = all), and
    ``rows`` int64 ``[2, n]``. Saving start and degree here, in a tight loop whose random
    ``indptr`` reads overlap, spares :func:`sample_rows` a second, slower round of them.
    """
    n = dst_nodes.shape[0]
    offs = np.empty(n + 1, dtype=np.int64)
    rows = np.empty((2, n), dtype=np.int64)
    offs[0] = 0
    for i in range(n):
        v = dst_nodes[i]
        start = indptr[v]
        d = indptr[v + 1] - start
        rows[0, i] = start
        rows[1, i] = d
        offs[i + 1] = offs[i] + (d if (fanout < 0 or d <= fanout) else fanout)
    return offs, rows


@njit(cache=True, nogil=True)
def sample_rows(indices, dst_nodes, rows, hop_key, offs, lo, hi, edges):
    """Sample rows ``lo <= i < hi`` of one hop into ``edges[:, offs[lo]:offs[hi]]``.

    ``rows`` and ``offs`` come from :func:`count_rows`. Writes ``edges[0, q]`` = global id of the
    chosen neighbour and ``edges[1, q]`` = ``i`` (the row's local id). Threads call this on
    disjoint row ranges.

    Two passes on purpose: first every row's chosen CSR *positions* (branchy Floyd loops that touch
    no big array), then one tight, branch-free gather ``indices[pos]``. Its random reads are
    independent, so the CPU keeps many cache misses in flight; reading ``indices`` inside the
    branchy per-row loop measured about 2.5x slower on a 2^21-node graph.
    """
    src = edges[0]
    dst = edges[1]
    for i in range(lo, hi):
        start = rows[0, i]
        d = rows[1, i]
        o = offs[i]
        k = offs[i + 1] - o
        for q in range(o, o + k):
            dst[q] = i
        if k == d:
            for q in range(k):
                src[o + q] = start + q
        elif k > 0:
            state = mix64(hop_key ^ (np.uint64(dst_nodes[i]) * _GAMMA))
            if k <= _LINEAR_MAX_K:
                _floyd_linear(src, o, d, k, state)
            else:
                _floyd_hashed(src, o, d, k, state)
            for q in range(o, o + k):
                src[q] += start
    for q in range(offs[lo], offs[hi]):
        src[q] = indices[src[q]]


@njit(cache=True, nogil=True)
def split_rows(offs, parts):
    """Row bounds ``[0, b1, ..., n]`` splitting rows into ``parts`` ranges of about equal cost,
    where a row costs its sampled edges plus one (the per-row overhead)."""
    n = offs.shape[0] - 1
    bounds = np.empty(parts + 1, dtype=np.int64)
    bounds[0] = 0
    bounds[parts] = n
    total = offs[n] + n
    lo = 0
    for p in range(1, parts):
        target = (total * p) // parts
        hi = n
        while lo < hi:  # first row i with offs[i] + i >= target
            mid = (lo + hi) // 2
            if offs[mid] + mid < target:
                lo = mid + 1
            else:
                hi = mid
        bounds[p] = lo
    return bounds


@njit(cache=True, nogil=True)
def insert_seeds(seeds, loc):
    """Give ``seeds[i]`` local id ``i`` in ``loc``; returns -1, or the index of the first repeated
    seed (then ``loc`` is restored to all -1 for the seeds)."""
    n = seeds.shape[0]
    for i in range(n):
        g = seeds[i]
        if loc[g] >= 0:
            for j in range(i):
                loc[seeds[j]] = -1
            return i
        loc[g] = i
    return -1


@njit(cache=True, nogil=True)
def relabel(src, loc, base):
    """Map the global ids in ``src`` to local ids in place; unseen nodes (``loc[g] < 0``) get ids
    ``base, base + 1, ...`` in order of first appearance in ``src``. Returns the new nodes.

    Serial: first-appearance order is inherently sequential. (Reading ``loc`` ahead in a parallel,
    branch-free pass saved little on 2 threads and cost CPU, so it is not done.)
    """
    e = src.shape[0]
    new = np.empty(e, dtype=np.int64)
    cnt = 0
    for q in range(e):
        g = src[q]
        lid = np.int64(loc[g])
        if lid < 0:
            lid = base + cnt
            loc[g] = lid
            new[cnt] = g
            cnt += 1
        src[q] = lid
    return new[:cnt].copy()


@njit(cache=True, nogil=True)
def reset_range(nodes, lo, hi, loc):
    """Set ``loc[nodes[lo:hi]] = -1``."""
    for i in range(lo, hi):
        loc[nodes[i]] = -1
