"""The lookahead cache's rows and books in Triton kernels (issue 24, items 2 and 5): the serving
half of the sync-free batch, as FIFO's fused batch does it (:mod:`gnnio.features.caches._triton_cache`),
where the backing's rows lie on the cache's device (:meth:`~gnnio.features.base.FeatureStore.device_rows`).

* ``_fetch``: per unique id of the padded batch that missed, its row from the backing into a
  ``[n, dim]`` scratch (each missed id read once; rows per backing tier and the misses counted
  into the cache's count scratch);
* ``_out``: per requested id, its row from the buffer (a hit) or from the scratch (a miss or a
  repeat of one) into the output;
* ``_write`` (after the admission, :mod:`gnnio.features.caches._triton_lookahead`): each admitted
  row into its buffer slot; program 0 books the batch (stats, the cache's and the backing's tier
  counters) with :func:`~gnnio.features.caches._triton_cache._book`.

The hits are read (``_out``) before the admission overwrites any slot. ``_fetch`` and ``_out``
change nothing but the output, the scratch and the count scratch; a failure there zeroes the
counts and the torch ops serve the batch; a failure of ``_write`` books the counts in torch ops.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._triton_cache import _backing_rows, _book, _Books, _tiling

__all__ = ["applies", "finish", "serve"]


@triton.jit(do_not_specialize=["n"])
def _fetch(uniq, slots, u_ptr, hot, cold, table, prefix, rows_u, scr, n, W: tl.constexpr,
           WP: tl.constexpr, BR: tl.constexpr, HAS_TABLE: tl.constexpr):  # fmt: skip
    q = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    qm = (q < n) & (q < tl.load(u_ptr))
    miss = qm & (tl.load(slots + q, mask=qm, other=0) < 0)
    key = tl.load(uniq + q, mask=miss, other=0)
    c = tl.arange(0, WP)
    cm = c < W
    vm, bh, bc = _backing_rows(hot, cold, table, prefix, key, miss, c, cm, W, HAS_TABLE)
    tl.store(rows_u + q[:, None] * W + c[None, :], vm, mask=miss[:, None] & cm[None, :])
    tl.atomic_add(scr + 0, tl.sum(miss.to(tl.int64), 0))
    tl.atomic_add(scr + 1, tl.sum(bh.to(tl.int64), 0))
    tl.atomic_add(scr + 2, tl.sum(bc.to(tl.int64), 0))


@triton.jit(do_not_specialize=["n"])
def _out(inv, slots, buf, rows_u, dst, n, W: tl.constexpr, WP: tl.constexpr, BR: tl.constexpr):
    r = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    rm = r < n
    q = tl.load(inv + r, mask=rm, other=0)
    s = tl.load(slots + q, mask=rm, other=-1)
    hit = rm & (s >= 0)
    c = tl.arange(0, WP)
    cm = c < W
    vb = tl.load(buf + s[:, None] * W + c[None, :], mask=hit[:, None] & cm[None, :], other=0)
    vm = tl.load(rows_u + q[:, None] * W + c[None, :], mask=(rm & ~hit)[:, None] & cm[None, :],
                 other=0)  # fmt: skip
    tl.store(dst + r[:, None] * W + c[None, :], tl.where(hit[:, None], vb, vm),
             mask=rm[:, None] & cm[None, :])  # fmt: skip


@triton.jit(do_not_specialize=["n", "cap"])
def _write(rows_u, vslot, buf, stats, scr, c_tier, c_bh, c_bc, b_bh, b_bc, u_ptr, ins_ptr, ev_ptr,
           n, cap, rb, W: tl.constexpr, WP: tl.constexpr, BR: tl.constexpr):  # fmt: skip
    q = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    qm = q < n
    vs = tl.load(vslot + q, mask=qm, other=cap)
    m = qm & (vs < cap)
    c = tl.arange(0, WP)
    cm = c < W
    v = tl.load(rows_u + q[:, None] * W + c[None, :], mask=m[:, None] & cm[None, :])
    tl.store(buf + vs[:, None] * W + c[None, :], v, mask=m[:, None] & cm[None, :])
    if tl.program_id(0) == 0:  # the batch's books (no program reads what these write)
        u = tl.load(u_ptr)
        tl.store(scr + 3, tl.load(ev_ptr))
        nn = u * 0 + n
        _book(stats, scr, c_tier, c_bh, c_bc, b_bh, b_bc, nn, u, u - tl.load(scr + 0),
              tl.load(ins_ptr), rb)  # fmt: skip


def applies(cache):
    """``(rows, tiling)`` where the kernels serve this cache's batch, else None."""
    src = cache.backing.device_rows()
    if src is None:
        return None
    tiling = _tiling(cache, src)
    return None if tiling is None else (src, tiling)


def serve(cache, fused, uniq, inv, slots, u, dst) -> torch.Tensor:
    """``_fetch`` and ``_out``: the batch's rows into ``dst``; returns the missed rows' scratch."""
    src, (w, wp, br) = fused
    n = int(uniq.shape[0])
    _Books(cache, src)  # (the count scratch, made on first use)
    rows_u = torch.empty((n, w), dtype=cache.dtype, device=cache.device)
    grid = (triton.cdiv(n, br),)
    has_table = src.table is not None
    _fetch[grid](uniq, slots, u, src.hot, src.cold, src.table if has_table else uniq, src.prefix,
                 rows_u, cache._fused_scr, n, W=w, WP=wp, BR=br, HAS_TABLE=has_table)  # fmt: skip
    src.on_read()
    _out[grid](inv, slots, cache._buffer_ext, rows_u, dst, n, W=w, WP=wp, BR=br)
    return rows_u


def finish(cache, fused, rows_u, vslot, u, ins, ev) -> None:
    """``_write``: the admitted rows into the buffer and the batch's books."""
    src, (w, wp, br) = fused
    n = int(rows_u.shape[0])
    books = _Books(cache, src)
    _write[(triton.cdiv(n, br),)](rows_u, vslot, cache._buffer_ext, books.stats, books.scr,
                                  *books.args(), u, ins, ev, n, cache.policy.capacity,
                                  cache.row_bytes, W=w, WP=wp, BR=br)  # fmt: skip
    books.noted(cache.device)


def book_in_torch(cache, fused) -> None:
    """The counts ``_fetch`` left in the scratch, booked by torch ops (``_write`` failed): the
    backing's rows per tier in both counters; the scratch zeroed. Returns the misses."""
    src = fused[0]
    scr, rb = cache._fused_scr, cache.row_bytes
    for tier, k in ((src.hot_tier, 1), (src.cold_tier, 2)):
        cache.counters.add_device(tier, scr[k].clone(), rb)
        src.counters.add_device(tier, scr[k].clone(), rb)
    misses = scr[0].clone()
    scr[:4].zero_()
    return misses
