"""Numba CPU kernels of LABOR-i, importance sampling on top of LABOR-0 (used through
:class:`gnnio.sampling.labor.LaborSampler` with ``importance_sampling=i > 0``).

Balın & Çatalyürek's LABOR keeps edge ``t -> s`` iff ``r_t <= c_s pi_t``: ``r_t`` the one uniform
variate per source vertex of the hop (:func:`~gnnio.sampling._labor_kernels.vertex_rank`, shared
by every destination), ``pi_t`` an importance per candidate source and ``c_s`` a constant per
destination. LABOR-0 is ``pi_t = 1``, ``c_s = k / d_s``. LABOR-i starts there and runs ``i``
fixed-point steps that raise the importance of sources many destinations reach (so they keep the
*same* ones more often and the hop touches fewer distinct sources):

1. ``pi_t <- pi_t * max_{s: t in N(s)} c_s`` (DGL's ``compute_importance_sampling_probabilities``,
   the paper's update of ``pi``; ``pi`` is then rescaled to max 1, which changes no ``c_s pi_t``);
2. every ``c_s`` solved again for the new ``pi``.

Before each step the hop's expected number of distinct sources, ``sum_t min(1, max_s c_s pi_t)``
(what the steps lower), is computed; once a step lowered it by less than a fraction ``1e-4`` the
steps stop, as DGL's do -- so ``i`` bounds the steps, and a large ``i`` is LABOR-* (iterated to
convergence) at the cost of the steps it takes.

**The constraint on c_s** (the paper's, and DGL's ``dgl.sampling.sample_labors``): ``c_s`` solves
``sum_{t in N(s)} 1 / min(1, c_s pi_t) = d_s^2 / k``, so the Horvitz-Thompson estimate of the
neighbour mean keeps neighbour sampling's variance (``1/k - 1/d_s`` for unit-variance neighbours),
LABOR's design rule; LABOR-0's ``c_s = k / d_s`` meets it. With non-uniform ``pi`` a row then keeps
*more* than ``k`` neighbours in expectation (``sum_t min(1, c_s pi_t) >= k``, by the harmonic /
arithmetic mean inequality) -- fewer distinct sources per hop, more edges. (A first version of
this module solved the count target ``sum_t min(1, c_s pi_t) = k`` instead, fewer edges at a
higher variance; docs/benchmarks.md keeps its numbers beside the paper's.) The solve is exact:
with ``J`` the neighbours saturated (``c pi_t >= 1``), ``c = (sum_{t not in J} 1/pi_t) / (d_s^2/k -
|J|)``, started from ``J`` empty and repeated until ``J`` stops growing (each step stays below the
root, as the left side decreases in ``c``: a few steps). Rows taken whole (``k < 0`` or
``d <= k``) keep every neighbour (``p = 1``) and take ``c_s = (k / d_s) / min_t pi_t`` (DGL's first ``c_s = k / d_s``, which exceeds 1 there,
made scale-free): their neighbours are kept anyway, so the update raises them, by ``k / d_s``,
above the rest and the other rows prefer them (with ``c_s = 1 / min_t pi_t``, the smallest that
keeps the row, no ``c_s pi_t`` ever exceeds 1, and one step on docs/benchmarks.md's 131,072-node
graph read 30 % more rows per batch under the count target: 11,678 against 8,929 over 50 batches).

The hop runs serially here, before the per-part count / sample kernels
(:func:`count_part`, :func:`sample_part`): :func:`hop_probabilities` numbers the hop's distinct
sources (``cmap``: a ``[num_nodes]`` map, -1 everywhere between calls), iterates, and stores per
neighbour *position* ``q`` of the hop (rows in order, CSR order within a row) the inclusion
probability ``p[q] = min(1, c_s pi_t)`` and whether ``r_t < p[q]``; the part kernels read those.
The Horvitz-Thompson weight of a kept edge is ``1 / p[q]`` (:func:`kept_weights`).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ._kernels import relabel_part
from ._labor_kernels import _below, vertex_rank

__all__ = ["hop_probabilities", "solve_c", "count_part", "sample_part", "kept_weights"]

_EPS = 1e-4  # the steps stop once one cuts the expected distinct sources by less (as DGL's)


@njit(cache=True, nogil=True)
def solve_c(pi, cid, lo, hi, k):
    """The ``c`` with ``sum_{lo <= q < hi} 1 / min(1, c pi[cid[q]]) = d^2 / k`` (``d = hi - lo``,
    ``0 < k < d``, all ``pi > 0``): the paper's variance target. Newton from below on the
    saturated set ``J`` (module docstring), one pass per step: ``c = S / (d^2/k - |J|)`` with ``S``
    the sum of ``1 / pi`` outside ``J``; done when no unsaturated ``pi`` reaches ``1 / c``
    (usually after the first). ``d^2/k > d >= |J|``, so the denominator stays positive."""
    d = hi - lo
    target = d * (d / k)
    c = 0.0
    for _ in range(d + 1):
        j = 0
        rest = 0.0
        top = 0.0  # the largest unsaturated pi
        for q in range(lo, hi):
            x = pi[cid[q]]
            if c * x >= 1.0:
                j += 1
            else:
                rest += 1.0 / x
                top = max(top, x)
        if rest <= 0.0:  # (every neighbour saturated: cannot happen while target > d)
            break
        c = rest / (target - j)
        if c * top < 1.0:  # the saturated set stays: c is exact
            break
    return c


@njit(cache=True, nogil=True)
def _solve_all(pi, cid, pos, deg, fanout, c):
    n = deg.shape[0]
    for i in range(n):
        d = deg[i]
        lo, hi = pos[i], pos[i + 1]
        if d == 0 or fanout == 0:  # (a fanout of 0 keeps nothing)
            c[i] = 0.0
        elif fanout < 0 or d <= fanout:  # taken whole: every c pi_t >= k / d >= 1
            m = pi[cid[lo]]
            for q in range(lo + 1, hi):
                m = min(m, pi[cid[q]])
            c[i] = (max(fanout, d) / d) / m
        else:
            c[i] = solve_c(pi, cid, lo, hi, fanout)


@njit(cache=True, nogil=True)
def hop_probabilities(indptr, indices, dst_nodes, fanout, iters, rkey, cmap):
    """One hop's inclusion probabilities for destinations ``dst_nodes`` after ``iters``
    fixed-point steps (module docstring). Returns ``(pos, p, keep, counts, steps)``: ``pos[i]`` the
    first position of row ``i`` (``[n + 1]``), ``p[q]`` and ``keep[q]`` (uint8: ``r_t < p[q]``) per
    position, ``counts[i]`` the row's kept edges, ``steps`` the steps taken (``<= iters``).
    ``cmap`` (int64 ``[num_nodes]``, all -1) is all -1 again on return."""
    n = dst_nodes.shape[0]
    pos = np.empty(n + 1, dtype=np.int64)
    deg = np.empty(n, dtype=np.int64)
    pos[0] = 0
    for i in range(n):
        v = dst_nodes[i]
        deg[i] = indptr[v + 1] - indptr[v]
        pos[i + 1] = pos[i] + deg[i]
    total = pos[n]
    cid = np.empty(total, dtype=np.int64)
    uniq = np.empty(total, dtype=np.int64)
    u = 0
    for i in range(n):
        start = indptr[dst_nodes[i]]
        for j in range(deg[i]):
            t = indices[start + j]
            if cmap[t] < 0:
                cmap[t] = u
                uniq[u] = t
                u += 1
            cid[pos[i] + j] = cmap[t]
    for j in range(u):
        cmap[uniq[j]] = -1
    pi = np.ones(u, dtype=np.float64)
    c = np.empty(n, dtype=np.float64)
    _solve_all(pi, cid, pos, deg, fanout, c)
    acc = np.empty(u, dtype=np.float64)
    prev = np.inf
    steps = 0
    for _ in range(iters if fanout != 0 else 0):  # (a fanout of 0 keeps nothing: no pi to weigh)
        acc[:] = 0.0
        for i in range(n):
            for q in range(pos[i], pos[i + 1]):
                if c[i] > acc[cid[q]]:
                    acc[cid[q]] = c[i]
        expect = 0.0  # the hop's expected distinct sources now: sum_t min(1, max_s c_s pi_t)
        for j in range(u):
            expect += min(1.0, acc[j] * pi[j])
        if expect >= (1.0 - _EPS) * prev:  # converged (DGL's test): no step left to gain
            break
        prev = expect
        steps += 1
        top = 0.0
        for j in range(u):
            pi[j] *= acc[j]
            top = max(top, pi[j])
        if top > 0.0:
            for j in range(u):
                pi[j] /= top
        _solve_all(pi, cid, pos, deg, fanout, c)
    p = np.empty(total, dtype=np.float64)
    keep = np.empty(total, dtype=np.uint8)
    counts = np.empty(n, dtype=np.int64)
    for i in range(n):
        full = fanout < 0 or deg[i] <= fanout
        start = indptr[dst_nodes[i]]
        kept = 0
        for j in range(deg[i]):
            q = pos[i] + j
            x = 1.0 if full else min(1.0, c[i] * pi[cid[q]])
            p[q] = x
            b = 1 if _below(vertex_rank(rkey, indices[start + j]), x) else 0
            keep[q] = b
            kept += b
        counts[i] = kept
    return pos, p, keep, counts, steps


@njit(cache=True, nogil=True)
def count_part(indptr, dst_nodes, lo, hi, counts, rows, offs):
    """Rows ``lo <= i < hi``: ``rows[0, r]`` the CSR start, ``rows[1, r]`` the degree and ``offs``
    the prefix sums of the kept counts from :func:`hop_probabilities`. Returns the part's edge
    count."""
    offs[0] = 0
    acc = np.int64(0)
    for r in range(hi - lo):
        v = dst_nodes[lo + r]
        rows[0, r] = indptr[v]
        rows[1, r] = indptr[v + 1] - indptr[v]
        acc += counts[lo + r]
        offs[r + 1] = acc
    return acc


@njit(cache=True, nogil=True)
def sample_part(indices, lo, n, rows, offs, pos, keep, src, loc, off, seen, first, base, new):
    """Write the kept neighbours of the part's ``n`` rows (global rows ``lo..``), in CSR order, into
    ``src[:offs[n]]`` and relabel them (as :func:`gnnio.sampling._labor_kernels.sample_part`)."""
    for r in range(n):
        start = rows[0, r]
        q0 = pos[lo + r]
        j = offs[r]
        for q in range(rows[1, r]):
            if keep[q0 + q]:
                src[j] = indices[start + q]
                j += 1
    return relabel_part(src, offs[n], loc, off, seen, first, base, new)


@njit(cache=True, nogil=True)
def kept_weights(pos, p, keep, mean):
    """float32 weights of the kept edges in block order (rows in order, CSR order): ``1 / p``, or
    with ``mean`` ``1 / (d_s p)`` (the unbiased neighbour *mean*)."""
    n = pos.shape[0] - 1
    m = 0
    for q in range(pos[n]):
        m += keep[q]
    out = np.empty(m, dtype=np.float32)
    j = 0
    for i in range(n):
        d = pos[i + 1] - pos[i]
        for q in range(pos[i], pos[i + 1]):
            if keep[q]:
                out[j] = 1.0 / (p[q] * d) if mean else 1.0 / p[q]
                j += 1
    return out
