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

All kernels are serial and ``nogil``. :class:`~gnnio.sampling.uniform.UniformSampler` uses the
per-part kernels (:func:`count_part`, :func:`sample_part`, :func:`merge_part`, :func:`write_part`,
:func:`insert_seeds_at`; see the comment above them); :func:`count_rows`, :func:`sample_rows`,
:func:`relabel`, :func:`insert_seeds` and :func:`reset_range` are the earlier serial-relabel
kernels, kept with their signatures for other samplers and as the tests' reference (the
locality-aware sampler's kernels, :mod:`gnnio.sampling._las_kernels`, share the random stream, the
Floyd draws, :func:`insert_seeds` and :func:`relabel_into`).
Parallelism comes from the caller running kernels on disjoint row ranges in several Python threads,
not from ``prange``: numba's OpenMP layer shares
torch's libgomp, whose spin-waiting barriers made a 2-thread ``prange`` version 5-20x *slower* on a
loaded 2-core machine (every fork/join waits for a descheduled spinning thread), and
``OMP_WAIT_POLICY`` can only be set before torch is imported. Plain threads blocking on a queue do
not spin, so the sampler degrades gracefully when it shares cores with training.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..utils.prefetch import prefetch

__all__ = [
    "count_rows",
    "sample_rows",
    "split_rows",
    "relabel",
    "relabel_into",
    "insert_seeds",
    "reset_range",
    "mix64",
    "prefetch",
    "count_part",
    "sample_part",
    "merge_part",
    "write_part",
    "insert_seeds_at",
    "relabel_part",
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
    """Write ``k`` distinct positions in ``[0, d)`` to ``out[off:off+k]`` (small ``k``); returns
    the new state."""
    cnt = 0
    for j in range(d - k, d):
        t, state = _bounded(state, j + 1)
        for q in range(off, off + cnt):
            if out[q] == t:
                t = j
                break
        out[off + cnt] = t
        cnt += 1
    return state


@njit(cache=True, nogil=True)
def _floyd_hashed(out, off, d, k, state):
    """Floyd's algorithm with an open-addressing hash set (large ``k``); returns the new state."""
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
    return state


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
        if i + _PF_ROWS < n:
            prefetch(indptr, dst_nodes[i + _PF_ROWS])
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
    e = offs[hi]
    for q in range(offs[lo], e):
        if q + _PF_EDGES < e:
            prefetch(indices, src[q + _PF_EDGES])
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
    new = np.empty(src.shape[0], dtype=np.int64)
    return new[: relabel_into(src, loc, base, new)].copy()


@njit(cache=True, nogil=True)
def relabel_into(src, loc, base, new):
    """:func:`relabel` into a caller buffer: the new nodes are appended to ``new`` (room for
    ``len(src)``); returns how many were new."""
    cnt = 0
    for q in range(src.shape[0]):
        g = src[q]
        lid = np.int64(loc[g])
        if lid < 0:
            lid = base + cnt
            loc[g] = lid
            new[cnt] = g
            cnt += 1
        src[q] = lid
    return cnt


@njit(cache=True, nogil=True)
def reset_range(nodes, lo, hi, loc):
    """Set ``loc[nodes[lo:hi]] = -1``."""
    for i in range(lo, hi):
        loc[nodes[i]] = -1


# ---- software prefetch -------------------------------------------------------------------------

_PF_ROWS = 16  # rows ahead whose indptr entry is prefetched (count)
_PF_EDGES = 32  # edges ahead whose indices / loc entry is prefetched (gather, relabel)
# (:func:`prefetch` is :func:`gnnio.utils.prefetch.prefetch`, re-exported here)


# ---- per-part kernels of a parallel hop (count + sample + relabel split over threads) ----------
#
# A hop with enough rows is cut into ``P`` contiguous row ranges ("parts"), one per thread. Part
# ``p`` runs :func:`count_part` then :func:`sample_part` into its own buffers; the caller then runs
# :func:`merge_part` for parts 1.. in order on one thread, and finally every part copies its edges
# into the hop's ``[2, E]`` array with :func:`write_part`. Local ids come out exactly as with the
# serial :func:`relabel` over the whole hop (first appearance in edge order), without atomics.
#
# The map is versioned instead of reset: a call numbers node ``g`` by writing ``loc[g] = off +
# local id``, and any entry below the call's ``off`` means "unseen". The next call on the same map
# uses ``off + (nodes of this call)``, so the old entries go stale without being touched; only
# when ``off`` would overflow the map's integer type is it refilled with -1 and ``off`` restarts
# at 0 (every ~2^31 / batch-size nodes with an int32 map).
#
# * part 0 numbers its new nodes directly in the shared ``loc`` map (``base, base + 1, ...``):
#   the first appearance of a node in part 0's range is its first appearance in the hop;
# * part ``p >= 1`` only *reads* ``loc``. An edge to a node ``g`` that ``loc`` does not know
#   becomes the placeholder ``-1 - g``, and the first such edge per node appends ``g`` to the
#   part's list of unseen nodes, deduplicated by a private bitmap (``num_nodes`` bits, all clear
#   between calls: 256 KiB for 2^21 nodes, so it stays in L2). A ``loc`` entry that part 0 writes
#   concurrently is already final, so reading it before or after that write gives the same edges;
# * :func:`merge_part` (serial, after all parts finished, parts 1.. in order) numbers the unseen
#   nodes that no earlier part numbered; then every placeholder resolves to ``loc[g]``.


@njit(cache=True, nogil=True)
def count_part(indptr, dst_nodes, lo, hi, fanout, rows, offs):
    """:func:`count_rows` for rows ``lo <= i < hi`` into caller buffers (local row ``r = i - lo``).

    Writes ``rows[0, r]`` = CSR start, ``rows[1, r]`` = degree and the prefix sums ``offs[0..n]``
    (``offs[0] = 0``) of ``min(deg, fanout)`` (``n = hi - lo``); returns ``offs[n]``, the part's
    edge count.
    """
    n = hi - lo
    offs[0] = 0
    acc = np.int64(0)
    for r in range(n):
        if r + _PF_ROWS < n:
            prefetch(indptr, dst_nodes[lo + r + _PF_ROWS])
        v = dst_nodes[lo + r]
        start = indptr[v]
        d = indptr[v + 1] - start
        rows[0, r] = start
        rows[1, r] = d
        acc += d if (fanout < 0 or d <= fanout) else fanout
        offs[r + 1] = acc
    return acc


@njit(cache=True, nogil=True)
def relabel_part(src, e, loc, off, seen, first, base, new):
    """Step 3 of :func:`sample_part` (also used by other samplers' per-part kernels): relabel the
    global ids ``src[:e]`` in place -- a local id when ``loc`` knows the node, else (parts >= 1)
    the placeholder ``-1 - g``; ``new[:cnt]`` gets the part's unseen nodes in first-appearance
    order (``seen`` dedups them for parts >= 1; with ``first`` they are numbered ``base + j`` in
    ``loc`` at once). Returns ``cnt``."""
    cnt = 0
    if first:
        for q in range(e):
            if q + _PF_EDGES < e:
                prefetch(loc, src[q + _PF_EDGES])
            g = src[q]
            lid = np.int64(loc[g]) - off
            if lid < 0:
                lid = base + cnt
                loc[g] = off + lid
                new[cnt] = g
                cnt += 1
            src[q] = lid
    else:
        for q in range(e):
            if q + _PF_EDGES < e:
                prefetch(loc, src[q + _PF_EDGES])
            g = src[q]
            lid = np.int64(loc[g]) - off
            if lid < 0:
                w = g >> 3
                bit = np.uint8(1) << np.uint8(g & 7)
                if not (seen[w] & bit):
                    seen[w] |= bit
                    new[cnt] = g
                    cnt += 1
                lid = -1 - g
            src[q] = lid
    return cnt


@njit(cache=True, nogil=True)
def sample_part(
    indices, dst_nodes, lo, n, rows, offs, hop_key, src, loc, off, seen, first, base, new
):
    """Sample the part's ``n`` rows (after :func:`count_part`) into ``src[:offs[n]]``, relabelled.

    Random streams are those of :func:`sample_rows` (keyed by the destination's global id), so
    the neighbours drawn do not depend on the split. Afterwards ``src[q]`` is a local id (``>= 0``)
    when ``loc`` knows the node, else the placeholder ``-1 - g`` (``g`` its global id), and
    ``new[:cnt]`` lists the part's unseen nodes in first-appearance order (``seen``: the part's
    uint8 bitmap of them, clear on entry). With ``first`` (part 0) unseen nodes are numbered
    ``base + j`` in ``loc`` at once, so no placeholders remain and ``seen`` is unused. Returns
    ``cnt``.
    """
    e = offs[n]
    for r in range(n):  # 1) chosen CSR positions (branchy, touches no big array)
        start = rows[0, r]
        d = rows[1, r]
        o = offs[r]
        k = offs[r + 1] - o
        if k == d:
            for q in range(k):
                src[o + q] = start + q
        elif k > 0:
            state = mix64(hop_key ^ (np.uint64(dst_nodes[lo + r]) * _GAMMA))
            if k <= _LINEAR_MAX_K:
                _floyd_linear(src, o, d, k, state)
            else:
                _floyd_hashed(src, o, d, k, state)
            for q in range(o, o + k):
                src[q] += start
    for q in range(e):  # 2) tight gather of the neighbour ids (see sample_rows)
        if q + _PF_EDGES < e:
            prefetch(indices, src[q + _PF_EDGES])
        src[q] = indices[src[q]]
    return relabel_part(src, e, loc, off, seen, first, base, new)  # 3) relabel


@njit(cache=True, nogil=True)
def merge_part(new, cnt, loc, off, next_id, out, out_pos):
    """Number a part's unseen nodes ``new[:cnt]`` that no earlier part numbered (serial, parts
    1.. in order): ``loc[g] = next_id, next_id + 1, ...``, each also appended to ``out`` from
    ``out_pos`` on. Returns the next free id."""
    for j in range(cnt):
        if j + _PF_EDGES < cnt:
            prefetch(loc, new[j + _PF_EDGES])
        g = new[j]
        if loc[g] < off:
            loc[g] = off + next_id
            out[out_pos] = g
            out_pos += 1
            next_id += 1
    return next_id


@njit(cache=True, nogil=True)
def write_part(src, offs, n, lo, loc, off, placeholders, edges, ebase, seen, new, cnt):
    """Copy a part's edges into ``edges[:, ebase:ebase + offs[n]]``: sources with placeholders
    ``-1 - g`` resolved to ``loc[g]``, destinations = local row ``lo + r``; then clear the part's
    ``seen`` bits (those of ``new[:cnt]``) when it used placeholders."""
    e = offs[n]
    s_out = edges[0]
    d_out = edges[1]
    for r in range(n):
        for q in range(ebase + offs[r], ebase + offs[r + 1]):
            d_out[q] = lo + r
    if placeholders:
        for q in range(e):
            if q + _PF_EDGES < e:
                v2 = src[q + _PF_EDGES]
                if v2 < 0:
                    prefetch(loc, -1 - v2)
            v = src[q]
            if v < 0:
                v = np.int64(loc[-1 - v]) - off
            s_out[ebase + q] = v
        for j in range(cnt):
            seen[new[j] >> 3] = 0
    else:
        for q in range(e):
            s_out[ebase + q] = src[q]


@njit(cache=True, nogil=True)
def insert_seeds_at(seeds, loc, off):
    """:func:`insert_seeds` for an offset map: ``loc[seeds[i]] = off + i``; an entry below ``off``
    means "unseen". Returns -1, or the index of the first repeated seed (the entries written so far
    stay, below the next call's offset)."""
    for i in range(seeds.shape[0]):
        g = seeds[i]
        if loc[g] >= off:
            return i
        loc[g] = off + i
    return -1
