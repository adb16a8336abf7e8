"""CPU kernels of the lookahead cache (:mod:`gnnio.features.cache_lookahead`): one pass over a
batch's ids instead of a chain of torch index ops.

The per-key state is one ``[num_keys, 3]`` int64 array (rank, last announced serial, fallback
rank), so a key's three values share a cache line: the kernels read the big per-key arrays at
random positions, and one miss per key instead of three is most of their speed. Each key's line
is software-prefetched ``_PF`` keys ahead, as the sampler kernels do.

They compute exactly what the torch path of :class:`~gnnio.features.cache_lookahead.LookaheadPolicy`
computes (``tests/test_lookahead.py`` runs both on the same traces and compares the state); the
policy uses them for CPU tensors and the torch path on a GPU.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..utils.prefetch import prefetch

INF = np.int64(1 << 62)  # "no next use known" (cache_lookahead._INF)
BEYOND = np.int64(1 << 61)  # ranks beyond the window start here (cache_lookahead._BEYOND)
FREQ_MAX = np.int64((1 << 24) - 1)  # the frequency field of a fallback rank (cache_lookahead)
RANK, LAST, FALLBACK = 0, 1, 2  # columns of the per-key state
_PF = 16  # keys prefetched ahead


@njit(cache=True, nogil=True, inline="always")
def _ahead(flat, keys, i, m):
    prefetch(flat, 3 * keys[min(i + _PF, m - 1)])


@njit(cache=True, nogil=True)
def announce(keys, state, ring_ids, ring_next, consumed, next_serial, j):
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
        ring_ids[p] = k
        ring_next[p] = INF
        state[k, LAST] = next_serial + i
        p += 1
        if p == r:
            p = 0


@njit(cache=True, nogil=True)
def begin_batch(keys, state, ring_ids, ring_next, a):
    """Serve the announced batch at serials ``a ..``: False (nothing changed) unless ``keys`` are
    exactly its ids; else count each key (its fallback rank's frequency field, down by one until
    0) and set its rank to its next use in the window, or to its fallback."""
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
        state[k, RANK] = nxt if nxt < INF else fb
        p += 1
        if p == r:
            p = 0
    return True


@njit(cache=True, nogil=True)
def ranks(state, cached, missed, out):
    """``out[:len(cached)]`` = ranks of the cached keys, then those of the missed keys, odd where
    beyond the window (a missed key ranks after a cached one with the same fallback)."""
    flat = state.ravel()
    n = cached.shape[0]
    for i in range(n):
        _ahead(flat, cached, i, n)
        out[i] = state[cached[i], RANK]
    q = missed.shape[0]
    for i in range(q):
        _ahead(flat, missed, i, q)
        v = state[missed[i], RANK]
        out[n + i] = v + 1 if v >= BEYOND else v
