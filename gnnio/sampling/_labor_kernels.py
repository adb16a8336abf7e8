"""Numba CPU kernels of the LABOR-0 sampler (used through :mod:`gnnio.sampling.labor`).

Per-part kernels in the scheme of :mod:`gnnio.sampling._kernels` (a hop's destination rows cut into
contiguous parts, one per thread; part 0 numbers its new nodes, the others leave placeholders that a
serial merge resolves): :func:`count_part` and :func:`sample_part` replace the uniform sampler's
kernels of the same names; :func:`~gnnio.sampling._kernels.merge_part` and
:func:`~gnnio.sampling._kernels.write_part` are shared unchanged.

The one random variate per *source* vertex, ``r_t`` (Balın & Çatalyürek's LABOR), is counter-based:
``r_t = splitmix64 output t + 1 of the seed rkey`` (:func:`vertex_rank`, a uint64 read as a
fraction of 2^64), where ``rkey`` mixes the sampler seed, the call key and (unless layers share
it) the hop. Every destination that reaches ``t`` in the same hop of the same batch sees the same
``r_t``, whichever thread samples it.

Two designs per row with degree ``d > k`` (fanout ``k``; ``k < 0`` or ``d <= k`` takes the row):

* ``poisson`` (the paper's §3, LABOR-0): keep neighbour ``t`` iff ``r_t < k / d``; the row's
  count is random with mean ``k``;
* fixed size (the paper's Appendix A.3, "sequential Poisson", GraphBolt's default): keep the
  ``k`` neighbours with the smallest ``r_t``. With equal ``pi_t`` (LABOR-0) the ``k`` smallest of
  ``d`` i.i.d. uniforms are a uniform ``k``-subset, so every row is *exactly* uniform sampling
  without replacement -- the marginals ``k / d`` of :class:`~gnnio.sampling.UniformSampler` --
  while rows that share neighbours pick them together.

Both need every neighbour's id (``r_t`` depends on it), so a row costs ``O(d)`` sequential reads of
``indices`` instead of ``O(k)`` random ones; the rows' starts are software-prefetched.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..utils.prefetch import prefetch
from ._kernels import _GAMMA, mix64, relabel_part

__all__ = ["vertex_rank", "count_part", "sample_part"]

_PF_ROWS = 8  # rows ahead whose first neighbours are prefetched
_INV_2_53 = 1.0 / 9007199254740992.0
_MISMATCH = (
    "LABOR-0 (poisson): a row kept another number of neighbours than count_part counted (offs "
    "from another call key or another graph)"
)


@njit(cache=True, nogil=True, inline="always")
def vertex_rank(rkey, t):
    """``r_t`` as a uint64 (uniform on ``[0, 2^64)``): SplitMix64's output ``t + 1`` of seed
    ``rkey``."""
    return mix64(rkey + (np.uint64(t) + np.uint64(1)) * _GAMMA)


@njit(cache=True, nogil=True, inline="always")
def _below(rank, p):
    """``r_t < p`` with ``r_t`` = the top 53 bits of ``rank`` as a fraction (``P = p`` to 2^-53)."""
    return np.float64(rank >> np.uint64(11)) * _INV_2_53 < p


@njit(cache=True, nogil=True)
def count_part(indptr, indices, dst_nodes, lo, hi, fanout, rkey, poisson, rows, offs):
    """Rows ``lo <= i < hi`` of one hop: ``rows[0, r]`` the CSR start, ``rows[1, r]`` the degree
    (``r = i - lo``), and ``offs[0..n]`` the prefix sums of each row's sample size -- ``min(d, k)``
    for the fixed design, the number of neighbours with ``r_t < k / d`` for ``poisson`` (which
    reads the rows). Returns the part's edge count."""
    n = hi - lo
    offs[0] = 0
    acc = np.int64(0)
    for r in range(n):
        if r + 16 < n:
            prefetch(indptr, dst_nodes[lo + r + 16])
        v = dst_nodes[lo + r]
        start = indptr[v]
        d = indptr[v + 1] - start
        rows[0, r] = start
        rows[1, r] = d
        if fanout < 0 or d <= fanout:
            k = d
        elif not poisson:
            k = fanout
        else:
            p = fanout / d
            k = 0
            for q in range(start, start + d):
                if _below(vertex_rank(rkey, indices[q]), p):
                    k += 1
        acc += k
        offs[r + 1] = acc
    return acc


@njit(cache=True, nogil=True)
def sample_part(
    indices, n, rows, offs, fanout, rkey, poisson, src, loc, off, seen, first, base, new
):  # fmt: skip
    """Sample the part's ``n`` rows (after :func:`count_part`) into ``src[:offs[n]]`` and relabel
    them (:func:`~gnnio.sampling._kernels.relabel_part`; same outputs and return value as
    :func:`gnnio.sampling._kernels.sample_part`). Fixed design: each row's neighbours with the
    ``k`` smallest ``r_t``, in increasing ``r_t``; ``poisson``: those with ``r_t < k / d``, in CSR
    order, and ValueError where a row's count differs from ``offs`` (offs not from
    :func:`count_part` with the same ``rkey`` and rows)."""
    kmax = max(fanout, 1)
    keys = np.empty(kmax, dtype=np.uint64)
    vals = np.empty(kmax, dtype=np.int64)
    for r in range(n):
        if r + _PF_ROWS < n:
            prefetch(indices, rows[0, r + _PF_ROWS])
        start = rows[0, r]
        d = rows[1, r]
        o = offs[r]
        k = offs[r + 1] - o
        if k == 0:
            continue
        if fanout < 0 or d <= fanout:  # the whole row
            for q in range(d):
                src[o + q] = indices[start + q]
        elif poisson:
            p = fanout / d
            j = o
            for q in range(start, start + d):
                t = indices[q]
                if _below(vertex_rank(rkey, t), p):
                    if j == o + k:  # (never with count_part's own offs; else a clear error, not
                        raise ValueError(_MISMATCH)  # a write into the next row's slots)
                    src[j] = t
                    j += 1
            if j != o + k:  # (and not relabel's read of unwritten slots: a segfault)
                raise ValueError(_MISMATCH)
        else:  # the k smallest ranks: insertion into a sorted list of k (ties: earlier stays)
            m = 0
            for q in range(start, start + d):
                t = indices[q]
                x = vertex_rank(rkey, t)
                if m < k:
                    i = m
                    m += 1
                elif x < keys[k - 1]:
                    i = k - 1
                else:
                    continue
                while i > 0 and keys[i - 1] > x:
                    keys[i] = keys[i - 1]
                    vals[i] = vals[i - 1]
                    i -= 1
                keys[i] = x
                vals[i] = t
            for j in range(k):
                src[o + j] = vals[j]
    return relabel_part(src, offs[n], loc, off, seen, first, base, new)
