"""One LABOR-0 hop as Triton kernels, written straight into the bounded batch's CSR positions
(:mod:`gnnio.sampling.labor_torch`; the uniform hop's counterpart is :mod:`._triton_hop`).

Each program takes ``BLOCK`` destination rows of the batch's node buffer (the first ``cnt[0]``
real, the rest padding: masked, and a program of padding rows only returns at once). Every
neighbour ``t`` of a row has the variate ``r_t = splitmix64(rkey + (t + 1) * GAMMA)`` (uint64;
:func:`gnnio.sampling._labor_kernels.vertex_rank`), and a row of degree ``d`` and fanout ``k``:

* ``d <= k``: keeps the whole row in CSR order (both designs);
* fixed design, ``d > k``: keeps its ``k`` smallest ``(r_t, position)`` pairs in increasing order
  -- the CPU kernel's insertion list, whose ties keep the earlier position first. Pass ``i``
  scans the row in chunks of ``CHUNK`` for the smallest pair above pass ``i - 1``'s: ``O(k d)``
  rank computations per row, no per-row state beyond the last pair;
* Poisson design, ``d > k``: keeps ``t`` iff ``(r_t >> 11) * 2^-53 < k / d`` (float64, the
  division correctly rounded as NumPy's), in CSR order: :func:`count_triton` counts each row's
  kept neighbours first (the caller turns the counts into offsets by a cumsum), then
  :func:`select_triton` writes them at their row's offset plus a running count.

Output position ``row_off[r] + j`` gets the ``j``-th kept neighbour of row ``r`` and ``r``
itself; nothing at or past ``cap``. With ``CLAIM`` the kernel makes the relabelling's first step
(:mod:`._triton_relabel`'s ``_claim``: ``atomic_min(first[t], position)`` for every source not
numbered yet), as the uniform hop kernel does. The key comes as three int32 arguments, or with
``KEY_PTR`` from an int64 ``[1]`` device tensor (:mod:`gnnio.sampling.gpu_graphed`: a CUDA
graph's replay samples with the key the tensor holds then). Bit-identical to
:func:`gnnio.sampling.labor_torch.labor_hop_torch` and the numba kernels; ``TRITON_INTERPRET=1``
runs the kernels on CPU tensors (the tests).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._triton_hop import _key, _mix64

__all__ = ["count_triton", "select_triton"]

_BLOCK = 16  # rows per program (a row far above the fanout makes its block scan that far)
_CHUNK = 32  # neighbours per row per step of a scan
_M22 = (1 << 22) - 1


@triton.jit
def _rows(dst, indptr, cnt, n, BLOCK: tl.constexpr):
    """The program's rows: ids ``r``, real mask, CSR start and degree."""
    r = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    rm = (r < n) & (r < tl.load(cnt))
    g = tl.load(dst + r, mask=rm, other=0)
    start = tl.load(indptr + g, mask=rm, other=0)
    deg = tl.load(indptr + g + 1, mask=rm, other=0) - start
    return r, rm, start, deg


@triton.jit
def _chunk(indices, start, deg, live, c, key, CHUNK: tl.constexpr):
    """Positions ``c .. c + CHUNK - 1`` of the live rows: ``(pos, mask, t, r_t)``."""
    pos = c + tl.arange(0, CHUNK).to(tl.int64)
    m = live[:, None] & (pos[None, :] < deg[:, None])
    t = tl.load(indices + start[:, None] + pos[None, :], mask=m, other=0).to(tl.int64)
    rank = _mix64(key + (t.to(tl.uint64) + 1) * 0x9E3779B97F4A7C15)
    return pos, m, t, rank


@triton.jit
def _below(rank, deg, fanout):
    """Poisson's test ``(r_t >> 11) * 2^-53 < fanout / d`` per cell (rows of degree > 0)."""
    d = deg.to(tl.float64)
    p = (tl.zeros_like(d) + fanout) / d  # float64 ``/``: div.rn.f64, correctly rounded
    return (rank >> 11).to(tl.float64) * (1.0 / 9007199254740992.0) < p[:, None]


@triton.jit
def _put(out_src, out_row, loc, first, dest, nb, row, m, CLAIM: tl.constexpr):
    tl.store(out_src + dest, nb, mask=m)
    tl.store(out_row + dest, row, mask=m)
    if CLAIM:  # the relabelling's first step (_triton_relabel._claim), here: no extra launch
        unknown = m & (tl.load(loc + nb, mask=m, other=0) < 0)
        tl.atomic_min(first + nb, dest, mask=unknown)


@triton.jit(do_not_specialize=["n", "fanout", "k0", "k1", "k2"])
def _count(indptr, indices, dst, cnt, kout, n, fanout, k0, k1, k2, kp, BLOCK: tl.constexpr,
           CHUNK: tl.constexpr, KEY_PTR: tl.constexpr = False):  # fmt: skip
    r, rm, start, deg = _rows(dst, indptr, cnt, n, BLOCK)
    key = _key(k0, k1, k2, kp, KEY_PTR)
    live = rm & (deg > fanout)
    safe = tl.where(live, deg, 1)
    kept = tl.zeros([BLOCK], dtype=tl.int64)
    for c in range(0, tl.max(tl.where(live, deg, 0), 0), CHUNK):
        pos, m, t, rank = _chunk(indices, start, safe, live, c, key, CHUNK)
        kept += tl.sum((m & _below(rank, safe, fanout)).to(tl.int64), 1)
    k = tl.where(live, kept, tl.where(rm, deg, 0))  # short rows: all; padding rows: none
    tl.store(kout + r, k, mask=r < n)


@triton.jit(do_not_specialize=["n", "cap", "k0", "k1", "k2"])
def _select(indptr, indices, dst, row_off, out_src, out_row, n, cnt, cap, k0, k1, k2, kp, loc,
            first, fanout: tl.constexpr, FP: tl.constexpr, BLOCK: tl.constexpr,
            CHUNK: tl.constexpr, POISSON: tl.constexpr, CLAIM: tl.constexpr,
            KEY_PTR: tl.constexpr = False):  # fmt: skip
    if tl.program_id(0).to(tl.int64) * BLOCK >= tl.load(cnt):
        return  # a program of padding rows only: nothing to select or write
    r, rm, start, deg = _rows(dst, indptr, cnt, n, BLOCK)
    key = _key(k0, k1, k2, kp, KEY_PTR)
    off = tl.load(row_off + r, mask=rm, other=0)
    col = tl.arange(0, FP).to(tl.int64)
    short = rm & (deg <= fanout)  # the whole row, in CSR order
    whole = off[:, None] + col[None, :]
    wm = short[:, None] & (col[None, :] < deg[:, None]) & (whole < cap)
    nb = tl.load(indices + start[:, None] + col[None, :], mask=wm, other=0).to(tl.int64)
    _put(out_src, out_row, loc, first, whole, nb, r[:, None] + 0 * whole, wm, CLAIM)
    live = rm & (deg > fanout)
    safe = tl.where(live, deg, 1)
    top = tl.max(tl.where(live, deg, 0), 0)
    if POISSON:  # r_t < k / d, in CSR order, at the row's offset plus the kept so far
        run = tl.zeros([BLOCK], dtype=tl.int64)
        for c in range(0, top, CHUNK):
            pos, m, t, rank = _chunk(indices, start, safe, live, c, key, CHUNK)
            keep = (m & _below(rank, safe, fanout)).to(tl.int64)
            dest = off[:, None] + run[:, None] + tl.cumsum(keep, 1) - keep
            w = (keep != 0) & (dest < cap)
            _put(out_src, out_row, loc, first, dest, t, r[:, None] + 0 * dest, w, CLAIM)
            run += tl.sum(keep, 1)
    else:  # pass i: the smallest (r_t, position) above pass i-1's (the first pass: any)
        big = 0x7FFFFFFFFFFFFFFF
        prev_r = tl.zeros([BLOCK], dtype=tl.uint64)
        prev_p = tl.full([BLOCK], -1, tl.int64)
        for i in range(0, fanout):
            best_r = tl.full([BLOCK], 0xFFFFFFFFFFFFFFFF, tl.uint64)
            best_p = tl.full([BLOCK], big, tl.int64)
            for c in range(0, top, CHUNK):
                pos, m, t, rank = _chunk(indices, start, safe, live, c, key, CHUNK)
                above = (rank > prev_r[:, None]) | (
                    (rank == prev_r[:, None]) & (pos[None, :] > prev_p[:, None])
                )
                cand = m & above
                rk = tl.where(cand, rank, 0xFFFFFFFFFFFFFFFF)
                low = tl.min(rk, 1)
                at = tl.min(tl.where(cand & (rk == low[:, None]), pos[None, :], big), 1)
                better = (low < best_r) | ((low == best_r) & (at < best_p))
                best_r = tl.where(better, low, best_r)
                best_p = tl.where(better, at, best_p)
            prev_r, prev_p = best_r, best_p
            d1 = off + i
            w = live & (d1 < cap)
            pick = tl.load(indices + start + best_p, mask=w, other=0).to(tl.int64)
            _put(out_src, out_row, loc, first, d1, pick, r, w, CLAIM)


def _key_args(rkey, placeholder) -> tuple:
    """The kernels' key arguments ``(k0, k1, k2, kp)`` and ``KEY_PTR`` for ``rkey``: an int, or
    an int64 ``[1]`` device tensor of its bits (``placeholder``: an unread pointer for ``kp``)."""
    if isinstance(rkey, torch.Tensor):
        return (0, 0, 0, rkey), True
    key = rkey & ((1 << 64) - 1)
    return (key & _M22, (key >> 22) & _M22, key >> 44, placeholder), False


def count_triton(indptr, indices, nodes, count, k, rows: int, fanout: int, rkey) -> None:
    """Poisson design: ``k[r]`` = how many neighbours row ``r`` keeps, for the first ``rows``
    entries of ``nodes`` (real up to ``count``, int64 ``[1]`` on the device; padding rows 0).
    ``rkey``: the hop's LABOR key, an int or an int64 ``[1]`` device tensor of its bits
    (:func:`gnnio.sampling.gpu_hop._s64`; read there by the kernel: a captured launch samples
    with the key the tensor holds when it is replayed)."""
    if rows:
        args, key_ptr = _key_args(rkey, count)
        _count[(triton.cdiv(rows, _BLOCK),)](indptr, indices, nodes, count, k, rows, fanout,
                                             *args, BLOCK=_BLOCK, CHUNK=_CHUNK,
                                             KEY_PTR=key_ptr)  # fmt: skip


def select_triton(indptr, indices, nodes, fanout: int, rkey, count, row_off, out, claim,
                  rows: int, poisson: bool) -> None:  # fmt: skip
    """Write the hop (``fanout >= 1``) into ``out = (src, row)`` (module docstring): rows
    ``nodes[:rows]``, real up to ``count``, row ``r``'s entries from ``row_off[r]``; ``claim``:
    ``(loc, first)`` for the relabelling's claims, or None. ``rkey``: as :func:`count_triton`'s."""
    src, row = out
    cap = int(src.shape[0])
    if cap == 0 or rows == 0:
        return
    loc, first = claim if claim is not None else (src, src)  # (unread without a claim)
    fp = max(2, 1 << (fanout - 1).bit_length())
    args, key_ptr = _key_args(rkey, count)
    _select[(triton.cdiv(rows, _BLOCK),)](indptr, indices, nodes, row_off, src, row, rows, count,
                                          cap, *args, loc, first, fanout=fanout, FP=fp,
                                          BLOCK=_BLOCK, CHUNK=_CHUNK, POISSON=poisson,
                                          CLAIM=claim is not None, KEY_PTR=key_ptr)  # fmt: skip
