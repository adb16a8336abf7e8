"""Numba CPU kernels of the layer-wise LADIES sampler (used through :mod:`gnnio.sampling.ladies`).

One hop is three serial, ``nogil`` kernels over the destination rows ``nodes`` (every node of the
batch so far; ``loc[g] >= 0`` exactly for them, holding their local id):

1. :func:`layer_candidates` -- the candidates (in-neighbours of the rows that are not rows
   themselves) in first-appearance order, each with its LADIES weight
   ``p_j = sum_i P_ij^2 = sum_{rows i with j in N(i)} 1 / (d_i + 1)^2`` (``P = D~^-1 (A + I)``, the
   row-normalised adjacency with self-loops of the LADIES reference code), times ``s`` for members
   of the layer's locality set when one is given (Song & Jiang's Eq. 8);
2. :func:`solve_budget` -- inclusion probabilities ``pi_j = min(1, c p_j)`` with ``c`` such that
   ``sum_j pi_j = min(K, #candidates)`` (capped proportional-to-size; a fixed-point iteration on
   the capped set that only grows, so it ends after at most as many steps as there are capped
   candidates, usually 1-3); then :func:`accept` keeps candidate ``j`` iff ``u_j < pi_j`` (Poisson
   sampling), ``u_j`` a counter-based uniform of ``(hop key, j)``, and numbers the kept ones;
3. :func:`layer_edges` -- every graph edge ``j -> i`` from a row ``i`` whose source is a row or a
   kept candidate, with weight ``1 / pi_j`` (rows: ``pi = 1``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..utils.prefetch import prefetch
from ._kernels import _GAMMA, mix64

__all__ = ["layer_candidates", "solve_budget", "accept", "layer_edges", "reset_candidates"]

_INV_2_53 = 1.0 / 9007199254740992.0
_PF = 16  # neighbours ahead whose map entries are prefetched (hub rows dominate a hop)
W_HT, W_HT_MEAN, W_NONE = 0, 1, 2


@njit(cache=True, nogil=True)
def layer_candidates(indptr, indices, nodes, loc, cand, qmask, use_q, scale, cand_ids, p):
    """Pass 1 (module docstring). ``cand``: int64 ``[N]`` map global -> candidate slot (-1 =
    none; the caller resets it with :func:`reset_candidates`); ``cand_ids`` / ``p`` get the
    candidates and their weights (room for every neighbour of the rows). ``qmask`` (uint8 ``[N]``,
    read when ``use_q``) marks the locality set whose weights are multiplied by ``scale``.
    Returns the number of candidates."""
    nc = 0
    for i in range(nodes.shape[0]):
        v = nodes[i]
        start = indptr[v]
        d = indptr[v + 1] - start
        c = 1.0 / ((d + 1.0) * (d + 1.0))
        end = start + d
        for q in range(start, end):
            if q + _PF < end:
                ja = indices[q + _PF]
                prefetch(loc, ja)
                prefetch(cand, ja)
            j = indices[q]
            if loc[j] >= 0:  # a row already: in the layer for free
                continue
            slot = cand[j]
            if slot < 0:
                slot = nc
                cand[j] = slot
                cand_ids[slot] = j
                p[slot] = 0.0
                nc += 1
            p[slot] += c
    if use_q and scale != 1.0:
        for slot in range(nc):
            if qmask[cand_ids[slot]]:
                p[slot] *= scale
    return nc


@njit(cache=True, nogil=True)
def solve_budget(p, nc, budget, pi):
    """``pi[:nc] = min(1, c p)`` with ``sum pi = min(budget, nc)`` (all ``p > 0``); returns ``c``
    (``inf`` when every candidate is taken). Where the capped set reaches the budget (the others'
    ``p`` below an ulp of its sum, e.g. Eq. 8 at a huge ``s``), the capped get 1, the others 0."""
    target = min(budget, nc)
    if target >= nc:
        for j in range(nc):
            pi[j] = 1.0
        return np.inf
    total = 0.0
    for j in range(nc):
        total += p[j]
    c = target / total
    m_prev = -1
    while True:  # capped set grows each step; f(c) = sum min(1, c p) <= target throughout
        m = 0
        rest = 0.0
        for j in range(nc):
            if c * p[j] >= 1.0:
                m += 1
            else:
                rest += p[j]
        if m <= m_prev or rest <= 0.0:  # (rounding can shrink it at a tie: stop, not cycle)
            break
        if m >= target:  # (the rest's share is below an ulp of the capped p: not c = 0 for all)
            for j in range(nc):
                pi[j] = 1.0 if c * p[j] >= 1.0 else 0.0
            return c
        m_prev = m
        c = (target - m) / rest
    for j in range(nc):
        pi[j] = min(1.0, c * p[j])
    return c


@njit(cache=True, nogil=True)
def accept(cand_ids, pi, nc, hop_key, loc, base, new):
    """Keep candidate ``j`` iff ``u_j < pi_j`` (``u_j`` from SplitMix64 output ``j + 1`` of seed
    ``hop_key``); kept ones get local ids ``base, base + 1, ...`` in candidate order (``loc``) and
    are appended to ``new``. Returns how many were kept."""
    cnt = 0
    for slot in range(nc):
        j = cand_ids[slot]
        x = pi[slot]
        if x < 1.0:
            u = (
                np.float64(mix64(hop_key + (np.uint64(j) + np.uint64(1)) * _GAMMA) >> np.uint64(11))
                * _INV_2_53
            )
            if u >= x:
                continue
        loc[j] = base + cnt
        new[cnt] = j
        cnt += 1
    return cnt


@njit(cache=True, nogil=True)
def layer_edges(indptr, indices, nodes, loc, cand, pi, wmode):
    """Pass 3: ``(edges [2, E] local ids, weights [E] float32)`` of every edge ``j -> i`` (``i`` a
    row, in row order; ``j`` in CSR order) whose source has a local id; weight ``1 / pi_j``
    (``wmode`` 0), ``1 / (d_i pi_j)`` (1) or none (2, empty array); rows have ``pi = 1``."""
    n = nodes.shape[0]
    e = 0
    for i in range(n):
        v = nodes[i]
        end = indptr[v + 1]
        for q in range(indptr[v], end):
            if q + _PF < end:
                prefetch(loc, indices[q + _PF])
            if loc[indices[q]] >= 0:
                e += 1
    edges = np.empty((2, e), dtype=np.int64)
    w = np.empty(e if wmode != W_NONE else 0, dtype=np.float32)
    k = 0
    for i in range(n):
        v = nodes[i]
        start = indptr[v]
        d = indptr[v + 1] - start
        for q in range(start, start + d):
            j = indices[q]
            lj = loc[j]
            if lj < 0:
                continue
            edges[0, k] = lj
            edges[1, k] = i
            if wmode != W_NONE:
                slot = cand[j]
                x = 1.0 if slot < 0 else 1.0 / pi[slot]
                w[k] = x / d if wmode == W_HT_MEAN else x
            k += 1
    return edges, w


@njit(cache=True, nogil=True)
def reset_candidates(cand_ids, nc, cand):
    """``cand[cand_ids[:nc]] = -1``."""
    for slot in range(nc):
        cand[cand_ids[slot]] = -1
