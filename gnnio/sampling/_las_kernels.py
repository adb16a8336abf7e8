"""Numba CPU kernels of the locality-aware sampler (used through :mod:`gnnio.sampling.locality`).

All kernels are serial and ``nogil``; the sampler runs :func:`sample_rows` on disjoint row ranges
in several Python threads (as :class:`gnnio.sampling.UniformSampler` does, for the same reason:
numba's OpenMP layer shares torch's spinning libgomp).

Randomness is counter-based: the stream of a destination row is ``splitmix64(hop_key ^ g * GAMMA)``
stepped by ``GAMMA`` (``g`` = the destination's global id), so results never depend on how rows are
split over threads. Random integers in ``[0, n)`` use Lemire's multiply-shift with rejection
(exactly uniform); uniform reals use the top 53 bits. The stream (:func:`mix64`, ``_bounded``), the
Floyd draws, :func:`insert_seeds` and :func:`relabel` (``_kernels.relabel_into``) are those of
:mod:`gnnio.sampling._kernels`, imported from there.

Per-row scheme (documented in full in :mod:`gnnio.sampling.locality`): a row (or its pruned
window) of ``L`` neighbours, ``a`` of them in the layer's set Q', fanout ``k < L``:

* ``a == 0``, ``a == L`` or ``s == 1``: ``k`` distinct positions uniformly (Floyd's algorithm);
* otherwise the target inclusion probabilities ``(q_in, q_out)`` come from Eq. 8 with capping
  (:func:`cap_probs`), the number ``m`` of Q' members taken is drawn from the Fisher noncentral
  hypergeometric law whose mean is ``a * q_in`` (:func:`solve_nch`), then ``m`` members and
  ``k - m`` non-members are drawn uniformly without replacement from their classes.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ._kernels import (
    _GAMMA,
    _LINEAR_MAX_K,
    _bounded,
    _floyd_hashed,
    _floyd_linear,
    insert_seeds,
    mix64,
)
from ._kernels import relabel_into as relabel

__all__ = [
    "mix64",
    "cap_probs",
    "solve_nch",
    "count_rows",
    "sample_rows",
    "insert_seeds",
    "relabel",
    "reset_nodes",
    "row_sums",
    "member_counts",
    "member_fill",
    "window_starts",
]

_NCH_TOL = 1e-12  # |E[m] - a * q_in| after solving, relative to max(1, a * q_in)
_NCH_MAX_ITER = 200
_CACHE_N = 128  # rows (windows) shorter than this share solved laws of m within a call
_SWEEP_PER_PICK = 16  # map non-member ranks by a linear sweep when a <= this * picks
_CACHE_FLOATS = 1 << 19  # at most this many cached CDF values (4 MiB) per call

#: per-edge weight modes of :func:`sample_rows`
W_HT = 0  # 1 / pi_j  (Horvitz-Thompson weight of the neighbour *sum*)
W_HT_MEAN = 1  # 1 / (deg * pi_j)  (of the neighbour *mean*)
W_NONE = 2  # no weights written


@njit(cache=True, nogil=True, inline="always")
def _uniform01(state):
    """Uniform float64 in ``[0, 1)``; returns ``(value, new_state)``."""
    state = state + _GAMMA
    return np.float64(mix64(state) >> np.uint64(11)) * (1.0 / 9007199254740992.0), state


@njit(cache=True, nogil=True)
def _choose(n, t, out, off, state):
    """``t`` distinct integers of ``[0, n)``, uniformly (every t-subset equally likely), into
    ``out[off:off + t]`` by Floyd's algorithm; returns the new state."""
    if t <= 0:
        return state
    if t >= n:
        for j in range(n):
            out[off + j] = j
        return state
    if t <= _LINEAR_MAX_K:
        return _floyd_linear(out, off, n, t, state)
    return _floyd_hashed(out, off, n, t, state)


@njit(cache=True, nogil=True)
def cap_probs(n, a, k, s):
    """Inclusion probabilities ``(q_in, q_out)`` of one row (Eq. 8 with capping at 1).

    ``n`` neighbours (or window positions), ``a`` of them in Q' (``0 < a < n``), fanout
    ``0 < k < n``, scale ``s > 0``. The uniform probabilities ``k / n`` of Q' members are
    multiplied by ``s`` and all are renormalised to sum to ``k`` (Eq. 8): ``q_in = c s``,
    ``q_out = c`` with ``c = k / (a s + n - a)``. If that makes a probability exceed 1 (Eq. 8 is
    then not a valid design) it is set to 1 and the rest of the ``k`` is spread over the other
    class, which keeps ``a q_in + (n - a) q_out = k``.
    """
    b = n - a
    c = k / (a * s + b)
    if s >= 1.0:
        if c * s <= 1.0:
            return c * s, c
        return 1.0, (k - a) / b
    if c <= 1.0:
        return c * s, c
    return (k - b) / a, 1.0


@njit(cache=True, nogil=True)
def _nch_pmf(lo, hi, ratio, omega, pmf):
    """Unnormalised Fisher noncentral hypergeometric weights ``C(a,m) C(b,k-m) omega^m`` for
    ``m = lo..hi`` into ``pmf[0:hi-lo+1]``, from the central ratios ``ratio[j]`` =
    ``P(lo+j+1) / P(lo+j)`` at ``omega = 1`` (rescaled as they grow, so no overflow); returns
    ``(total, mean, var)``."""
    f = 1.0
    pmf[0] = 1.0
    for j in range(hi - lo):
        f = f * ratio[j] * omega
        if f > 1e200:
            for i in range(j + 1):
                pmf[i] *= 1e-200
            f *= 1e-200
        pmf[j + 1] = f
    tot = 0.0
    s1 = 0.0
    s2 = 0.0
    for j in range(hi - lo + 1):
        x = pmf[j]
        tot += x
        s1 += x * j
        s2 += x * j * j
    mean = s1 / tot
    var = s2 / tot - mean * mean
    return tot, lo + mean, max(var, 0.0)


@njit(cache=True, nogil=True)
def solve_nch(a, b, k, q_in, q_out, pmf):
    """The law of ``m`` (Q' members taken) with ``E[m] = a * q_in``, into ``pmf``.

    The design is conditional Poisson sampling of size ``k`` (the maximum-entropy fixed-size
    design): ``P(sample) ∝ prod_j p_j / (1 - p_j)``; with two classes that is Fisher's noncentral
    hypergeometric law of ``m`` with odds ratio ``omega``, and uniform subsets within each class.
    ``omega`` is solved by safeguarded Newton steps on ``log omega`` (``d E[m] / d log omega =
    Var[m]``) until ``|E[m] - a q_in| <= 1e-12 max(1, a q_in)``; ``omega = 1`` (``s = 1``) is the
    ordinary hypergeometric law, i.e. uniform sampling without replacement.

    ``pmf`` needs room for ``2 (min(a, k) + 1)`` values (the second half is scratch).
    Returns ``(lo, hi, total)``: ``pmf[m - lo] / total`` is ``P(m)`` for ``lo <= m <= hi``; when the
    law is a point mass ``hi == lo`` and ``pmf[0] = total = 1``.
    """
    lo = max(0, k - b)
    hi = min(a, k)
    mu = a * q_in
    tol = _NCH_TOL * max(1.0, mu)
    if hi <= lo or mu >= hi - tol:
        pmf[0] = 1.0
        return hi, hi, 1.0
    if mu <= lo + tol:
        pmf[0] = 1.0
        return lo, lo, 1.0
    qi = min(max(q_in, 1e-300), 1.0 - 1e-16)
    qo = min(max(q_out, 1e-300), 1.0 - 1e-16)
    t = math.log(qi / (1.0 - qi)) - math.log(qo / (1.0 - qo))  # large-population odds ratio
    ratio = pmf[hi - lo + 1 :]  # the tail of the buffer (pmf has room for 2 (k + 1) values)
    for m in range(lo, hi):
        ratio[m - lo] = ((a - m) * (k - m)) / ((m + 1.0) * (b - k + m + 1.0))
    t_lo = -np.inf
    t_hi = np.inf
    tot = 1.0
    for _ in range(_NCH_MAX_ITER):
        tot, mean, var = _nch_pmf(lo, hi, ratio, math.exp(min(t, 700.0)), pmf)
        diff = mean - mu
        if abs(diff) <= tol:
            break
        if diff < 0.0:
            t_lo = t
        else:
            t_hi = t
        step = -diff / var if var > 0.0 else (8.0 if diff < 0.0 else -8.0)
        step = min(8.0, max(-8.0, step))
        t_new = t + step
        if not (t_lo < t_new < t_hi):
            if np.isfinite(t_lo) and np.isfinite(t_hi):
                t_new = 0.5 * (t_lo + t_hi)
            elif np.isfinite(t_lo):
                t_new = t_lo + 8.0
            else:
                t_new = t_hi - 8.0
        t = t_new
    return lo, hi, tot


@njit(cache=True, nogil=True)
def count_rows(indptr, nodes, fanout, theta, use_q, qptr, qpos, offs, rows):
    """Per-row sample sizes of one hop, and each row's facts for :func:`sample_rows`.

    ``offs[i + 1] - offs[i]`` = ``min(L, fanout)`` with ``L`` the degree of ``nodes[i]``, or
    ``theta`` when pruning cuts the row (``theta > 0``, ``fanout >= 0`` and degree > ``theta``);
    ``fanout < 0`` takes all. ``offs`` int64 ``[n + 1]`` gets the prefix sums (``offs[0] = 0``);
    ``rows`` int64 ``[4, n]`` the CSR start, the degree and (with ``use_q``) the row's range
    ``qptr[v], qptr[v + 1]`` in ``qpos``. Returns ``(total, checksum)``.

    Reading ``indptr`` / ``qptr`` / the first ``qpos`` entry of every row here, in a tight loop
    whose independent loads overlap, spares the branchy sampling loop those cache misses (the
    checksum keeps the compiler from dropping the ``qpos`` loads).
    """
    offs[0] = 0
    acc = np.int64(0)
    touch = np.int64(0)
    for i in range(nodes.shape[0]):
        v = nodes[i]
        start = indptr[v]
        d = indptr[v + 1] - start
        rows[0, i] = start
        rows[1, i] = d
        n = d
        if fanout >= 0 and theta > 0 and d > theta:
            n = theta
        k = n if (fanout < 0 or n <= fanout) else fanout
        acc += k
        offs[i + 1] = acc
        if use_q:
            qb = qptr[v]
            qe = qptr[v + 1]
            rows[2, i] = qb
            rows[3, i] = qe
            if qe > qb and k < n:
                touch += qpos[qb]
    return acc, touch


@njit(cache=True, nogil=True, inline="always")
def _lower_bound(arr, lo, hi, x):
    """First index in ``[lo, hi)`` with ``arr[idx] >= x`` (``hi`` if none)."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if arr[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True, nogil=True, inline="always")
def _member_r(qpos, j1, n1, qb, st, d, i):
    """Window offset of the ``i``-th Q' member of a (possibly wrapped) window."""
    if i < n1:
        return np.int64(qpos[j1 + i]) - st
    return np.int64(qpos[qb + i - n1]) + d - st


@njit(cache=True, nogil=True)
def sample_rows(
    indices, nodes, lo, hi, offs, rows, hop_key, fanout, theta, scale, use_q, qpos, wmode, src,
    dst, w,
):  # fmt: skip
    """Sample rows ``lo <= i < hi`` of one hop into ``src`` / ``dst`` / ``w`` at ``offs[i]``.

    ``offs`` and ``rows`` come from :func:`count_rows`. Writes the *global* id of each chosen neighbour to
    ``src``, the row ``i`` to ``dst`` and its weight (``wmode``: :data:`W_HT` ``1 / pi``,
    :data:`W_HT_MEAN` ``1 / (deg pi)``, :data:`W_NONE` nothing) to ``w``, where ``pi`` is the
    neighbour's inclusion probability (window probability times within-window probability).
    ``qpos``: the CSR positions (sorted, per row; row ranges in ``rows[2:4]``) of the rows'
    neighbours in this layer's Q' (used when ``use_q``, which the caller sets only for
    ``scale != 1``). ``theta > 0`` prunes rows longer than
    ``theta`` to a circular window of ``theta`` positions from a uniformly random start.
    """
    kmax = max(fanout, 1)
    picks = np.empty(kmax, dtype=np.int64)
    pmf = np.empty(2 * kmax + 2, dtype=np.float64)
    # the law of m depends only on (n, a) within one call (k = min(n, fanout), s fixed): short
    # rows -- most rows -- repeat the same few pairs, so their CDFs are solved once per call
    nc = 1
    if use_q:
        nc = min(_CACHE_N, max(1, int(math.sqrt(_CACHE_FLOATS / (kmax + 1)))))
    c_lo = np.full((nc, nc), -1, dtype=np.int64)
    c_hi = np.empty((nc, nc), dtype=np.int64)
    c_cdf = np.empty((nc, nc, kmax + 1), dtype=np.float64)
    for i in range(lo, hi):
        o = offs[i]
        k = offs[i + 1] - o
        if k == 0:
            continue
        for j in range(o, o + k):
            dst[j] = i
        v = nodes[i]
        start = rows[0, i]
        d = rows[1, i]
        state = mix64(hop_key ^ (np.uint64(v) * _GAMMA))
        st = np.int64(0)
        n = d
        if fanout >= 0 and theta > 0 and d > theta:
            st, state = _bounded(state, d)
            n = theta
        inv_pi1 = d / n  # 1 / P(neighbour in the window)
        wscale = inv_pi1 / d if wmode == W_HT_MEAN else inv_pi1
        if k == n:  # the whole row / window
            for j in range(k):
                p = st + j
                if p >= d:
                    p -= d
                src[o + j] = start + p  # CSR position; gathered below
                if wmode != W_NONE:
                    w[o + j] = wscale
            continue
        a = np.int64(0)
        qb = np.int64(0)
        j1 = np.int64(0)
        n1 = np.int64(0)
        if use_q:
            qb = rows[2, i]
            qe = rows[3, i]
            if qe > qb:
                if n == d:
                    j1 = qb
                    n1 = qe - qb
                    a = n1
                else:
                    end1 = min(d, st + n)
                    j1 = _lower_bound(qpos, qb, qe, st)
                    n1 = _lower_bound(qpos, j1, qe, end1) - j1
                    a = n1
                    if st + n > d:
                        a += _lower_bound(qpos, qb, qe, st + n - d) - qb
        if a == 0 or a == n:
            state = _choose(n, k, picks, 0, state)
            wq = wscale * n / k
            for j in range(k):
                p = st + picks[j]
                if p >= d:
                    p -= d
                src[o + j] = start + p  # CSR position; gathered below
                if wmode != W_NONE:
                    w[o + j] = wq
            continue
        b = n - a
        q_in, q_out = cap_probs(n, a, k, scale)
        cached = n < nc
        if cached and c_lo[n, a] >= 0:
            mlo = c_lo[n, a]
            mhi = c_hi[n, a]
            cdf = c_cdf[n, a]
        else:
            mlo, mhi, tot = solve_nch(a, b, k, q_in, q_out, pmf)
            acc = 0.0
            for j in range(mhi - mlo + 1):
                acc += pmf[j]
                pmf[j] = acc / tot
            cdf = pmf
            if cached:
                c_lo[n, a] = mlo
                c_hi[n, a] = mhi
                for j in range(mhi - mlo + 1):
                    c_cdf[n, a, j] = pmf[j]
        m = mlo
        if mhi > mlo:
            u, state = _uniform01(state)
            m = mhi
            for j in range(mhi - mlo):
                if cdf[j] > u:
                    m = mlo + j
                    break
        state = _choose(a, m, picks, 0, state)
        state = _choose(b, k - m, picks, m, state)
        w_in = wscale / q_in
        w_out = wscale / q_out
        # non-member ranks in ascending order, so one forward sweep over the row's Q' members
        # maps them all (the t-th non-member sits at t + number of members before it)
        for j in range(m + 1, k):
            x = picks[j]
            i2 = j - 1
            while i2 >= m and picks[i2] > x:
                picks[i2 + 1] = picks[i2]
                i2 -= 1
            picks[i2 + 1] = x
        sweep = a <= _SWEEP_PER_PICK * (k - m)
        c = np.int64(0)
        for j in range(k):
            t = picks[j]
            if j < m:  # the t-th Q' member: its qpos index now, its position in the pass below
                src[o + j] = -1 - (j1 + t if t < n1 else qb + t - n1)
            else:
                if sweep:
                    while c < a and _member_r(qpos, j1, n1, qb, st, d, c) - c <= t:
                        c += 1
                else:  # binary search in [c, a) (ranks ascend)
                    hi2 = a
                    while c < hi2:
                        mid = (c + hi2) >> 1
                        if _member_r(qpos, j1, n1, qb, st, d, mid) - mid <= t:
                            c = mid + 1
                        else:
                            hi2 = mid
                p = st + t + c
                if p >= d:
                    p -= d
                src[o + j] = start + p  # CSR position; gathered below
            if wmode != W_NONE:
                w[o + j] = w_in if j < m else w_out
    # Two tight passes whose loads are independent, so their cache misses overlap (the branchy
    # loop above would keep one miss in flight at a time): Q' members' CSR positions from qpos,
    # then the neighbour ids from indices.
    if use_q:
        for q in range(offs[lo], offs[hi]):
            x = src[q]
            if x < 0:
                src[q] = rows[0, dst[q]] + qpos[-1 - x]
    for q in range(offs[lo], offs[hi]):
        src[q] = indices[src[q]]


@njit(cache=True, nogil=True)
def reset_nodes(nodes, loc):
    """``loc[nodes] = -1``."""
    for i in range(nodes.shape[0]):
        loc[nodes[i]] = -1


@njit(cache=True, nogil=True)
def row_sums(indptr, indices, x, out):
    """``out[v] = x[v] + sum of x[u]`` over the in-neighbours ``u != v`` of ``v``: the CSR row sums
    with every node's self-loop, ``(M + I) x`` (a self-loop the CSR stores counts once). Song &
    Jiang's ``A`` carries it (§4's ``v_2 = v_1 A`` on Figure 2a), as a layer reads its own rows."""
    n = indptr.shape[0] - 1
    for v in range(n):
        acc = x[v]
        for e in range(indptr[v], indptr[v + 1]):
            u = indices[e]
            if u != v:
                acc += x[u]
        out[v] = acc


@njit(cache=True, nogil=True)
def member_counts(indptr, indices, mask, qptr):
    """``qptr`` int64 ``[N + 1]``: prefix sums of how many in-neighbours of each row have
    ``mask[u] != 0``."""
    n = indptr.shape[0] - 1
    qptr[0] = 0
    for v in range(n):
        c = 0
        for j in range(indptr[v], indptr[v + 1]):
            if mask[indices[j]]:
                c += 1
        qptr[v + 1] = qptr[v] + c


@njit(cache=True, nogil=True)
def member_fill(indptr, indices, mask, qptr, qpos):
    """``qpos[qptr[v]:qptr[v + 1]]``: the CSR positions (offsets from the row start, ascending)
    of row ``v``'s neighbours with ``mask[u] != 0``."""
    n = indptr.shape[0] - 1
    for v in range(n):
        s = indptr[v]
        q = qptr[v]
        for j in range(s, indptr[v + 1]):
            if mask[indices[j]]:
                qpos[q] = j - s
                q += 1


@njit(cache=True, nogil=True)
def window_starts(nodes, deg, hop_key, theta, out):
    """``out[i]``: the window start :func:`sample_rows` draws for row ``nodes[i]`` of degree
    ``deg[i] > theta`` (the first draw of the row's stream), 0 for the others; lets a reader copy
    only the window of a remote list (:func:`gnnio.distributed.shm.gather_lists`)."""
    for i in range(nodes.shape[0]):
        out[i] = 0
        if deg[i] > theta:
            state = mix64(hop_key ^ (np.uint64(nodes[i]) * _GAMMA))
            out[i], _ = _bounded(state, deg[i])
