"""CPU kernels of the lookahead cache (:mod:`gnnio.features.caches.lookahead`): one pass over a
batch's ids instead of a chain of torch index ops.

The per-key state is one ``[num_keys, 4]`` int64 array (rank, last announced serial, fallback
rank, cache slot), so a key's values share a cache line: the kernels read the big per-key arrays
at random positions, and one miss per key instead of four is most of their speed. Each key's line
is software-prefetched ``_PF`` keys ahead, as the sampler kernels do. ``slot_rank`` (one int64 per
cache slot, small enough to stay in cache) mirrors the rank of every cached key, so admission
reads the cached keys' ranks as one contiguous slice instead of gathering them.

They compute exactly what the torch path of :class:`~gnnio.features.caches.lookahead.LookaheadPolicy`
computes (``tests/test_lookahead.py`` runs both on the same traces and compares the state); the
policy uses them for CPU tensors and the torch path on a GPU.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ...utils.prefetch import prefetch

INF = np.int64(1 << 62)  # "no next use known" (cache_lookahead._INF)
BEYOND = np.int64(1 << 61)  # ranks beyond the window start here (cache_lookahead._BEYOND)
FREQ_MAX = np.int64((1 << 24) - 1)  # the frequency field of a fallback rank (cache_lookahead)
RANK, LAST, FALLBACK, SLOT = 0, 1, 2, 3  # columns of the per-key state
_PF = 16  # keys prefetched ahead


@njit(cache=True, nogil=True, inline="always")
def _ahead(flat, keys, i, m):
    prefetch(flat, 4 * keys[min(i + _PF, m - 1)])


@njit(cache=True, nogil=True)
def announce(keys, state, ring_ids, ring_next, slot_rank, consumed, next_serial, j):
    """Append batch ``j``'s unique ``keys`` at serials ``next_serial ..``: link each key's pending
    occurrence (serial >= ``consumed``) to ``j``, or make ``j`` its next use (its rank)."""
    r = ring_ids.shape[0]
    m = keys.shape[0]
    flat = state.ravel()
    p = next_serial % r
    for i in range(m):
        _ahead(flat, keys, i, m)
        k = keys[i]
        prev = state[k, LAST]
        if prev >= consumed:
            ring_next[prev % r] = j
        else:
            state[k, RANK] = j
            s = state[k, SLOT]
            if s >= 0:
                slot_rank[s] = j
        ring_ids[p] = k
        ring_next[p] = INF
        state[k, LAST] = next_serial + i
        p += 1
        if p == r:
            p = 0


@njit(cache=True, nogil=True)
def announce_dedup(ids, state, ring_ids, ring_next, slot_rank, consumed, next_serial, j, uniq, inv):
    """:func:`announce` of batch ``j``'s raw ``ids`` (repeats allowed) with the deduplication in
    the same pass: an id whose last announced serial is already this batch's (``>=
    next_serial``) is a repeat. Writes the distinct ids in order of first occurrence to ``uniq``
    and each id's position among them to ``inv``; returns ``(count, had_repeats)``.

    The per-key body repeats :func:`announce`'s on purpose: the same body as an inlined helper
    measured 37 % slower (14.1 against 10.3 ms of management per batch, syn21, 10 % cache)."""
    r = ring_ids.shape[0]
    n = ids.shape[0]
    flat = state.ravel()
    p = next_serial % r
    u = 0
    repeats = False
    for i in range(n):
        _ahead(flat, ids, i, n)
        k = ids[i]
        prev = state[k, LAST]
        if prev >= next_serial:  # announced earlier in this batch
            inv[i] = prev - next_serial
            repeats = True
            continue
        if prev >= consumed:
            ring_next[prev % r] = j
        else:
            state[k, RANK] = j
            s = state[k, SLOT]
            if s >= 0:
                slot_rank[s] = j
        ring_ids[p] = k
        ring_next[p] = INF
        state[k, LAST] = next_serial + u
        uniq[u] = k
        inv[i] = u
        u += 1
        p += 1
        if p == r:
            p = 0
    return u, repeats


@njit(cache=True, nogil=True)
def begin_batch(keys, state, ring_ids, ring_next, a, slot_rank, slots):
    """Serve the announced batch at serials ``a ..``: False (nothing changed) unless ``keys`` are
    exactly its ids; else count each key (its fallback rank's frequency field, down by one until
    0), set its rank to its next use in the window, or to its fallback, and write its cache slot
    (-1: not cached) to ``slots`` (the lookup, from the same cache line)."""
    r = ring_ids.shape[0]
    m = keys.shape[0]
    p = a % r
    for i in range(m):
        if ring_ids[p] != keys[i]:
            return False
        p += 1
        if p == r:
            p = 0
    flat = state.ravel()
    p = a % r
    for i in range(m):
        _ahead(flat, keys, i, m)
        k = keys[i]
        fb = state[k, FALLBACK]
        if ((fb - BEYOND) >> 1) & FREQ_MAX:
            fb -= 2
            state[k, FALLBACK] = fb
        nxt = ring_next[p]
        rank = nxt if nxt < INF else fb
        state[k, RANK] = rank
        s = state[k, SLOT]
        slots[i] = s
        if s >= 0:
            slot_rank[s] = rank
        p += 1
        if p == r:
            p = 0
    return True


@njit(cache=True, nogil=True)
def missed_ranks(state, missed, out):
    """``out[i]`` = rank of ``missed[i]``, odd where beyond the window (a missed key ranks after a
    cached one with the same fallback)."""
    flat = state.ravel()
    q = missed.shape[0]
    for i in range(q):
        _ahead(flat, missed, i, q)
        v = state[missed[i], RANK]
        out[i] = v + 1 if v >= BEYOND else v
