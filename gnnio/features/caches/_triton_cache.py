"""The FIFO and static caches' batch in a few Triton kernels (issue 24, items 2 and 5).

On a GPU the sync-free batch (:mod:`gnnio.features.caches.nosync`) is paced by the host: in torch
ops it dispatched 166 (FIFO) and 77 (static) operations per batch over a zero-copy backing,
each a few to 30 µs of host time. Here the same batch is four launches and a scan (FIFO) or two
launches (static), with the backing's rows read in the same kernels where the backing says where
they lie on the device (:meth:`~gnnio.features.base.FeatureStore.device_rows`: a tiered store's
GPU tier and zero-copy host view, an in-memory store's one tensor).

FIFO, for the batch's ``n`` ids (``cache.py``'s steps 1-5, positions ``r``):

1. ``_claim``: ``pos[id] = min(r)`` over the batch (``atomic_min`` on the dedup scratch, the
   :class:`~gnnio.features.batch_ops.FirstOccurrence` array: the minimum does not depend on the
   order the atomics land in);
2. ``_flags``: per position its first occurrence ``first``, whether it is it, the cached slot
   ``s`` (the lookup, before anything changes) and whether it is a first-occurrence miss;
   one ``torch.cumsum`` of the two flags packed in one int64 (the miss flag 32 bits up) gives
   each unique id's rank and each miss's rank among the misses (first-occurrence order, as the
   host path's);
3. ``_serve``: hit rows from the buffer, first-occurrence misses from the backing (each missed id
   read once, counted per backing tier), the scratch ``pos`` reset, and each inserted miss's ring
   slot ``(head + k - skip) mod capacity`` with whether it evicts (the ``k``-th miss, only the last
   ``capacity`` inserted: ``skip = max(m - capacity, 0)``) and the key it evicts;
4. ``_admit``: repeats of a missed id copied from its first occurrence's output row; each inserted
   id's map update (the victim's ``slot_of`` to -1, ``key_of``, ``slot_of``) and its row into the
   buffer; program 0 books the batch: cursors, clock, the cache's stats and the tier counters of
   the cache and the backing (:func:`_book`). Map writes never collide: the victims' keys are
   cached, the inserted ids are not, and the ring slots of one batch are distinct; and no kernel
   reads an element that it writes (the victims' keys are read by ``_serve``; ``_admit`` reads the
   first occurrences' rows and writes the repeats'), but for the books' scalars, which one
   program reads and then writes (Triton issues a scalar's store and atomic from thread 0 only,
   so the read-then-write is one thread's; the compile test holds this in the PTX), so nothing
   depends on the order of writes within a launch.

Static: ``_static`` does lookup, hit rows, missed rows from the backing and the counts in one
pass; ``_book_static`` books them. Every count is an integer: per program a sum, then one integer
``atomic_add`` into a scratch (a sum is the same in any order); the stats' float64 sums (the hit
ratio) are added by one program, in stream order, so runs are bit-identical (and the hit-ratio
sum is the host path's bit for bit when read once after the stats began; a read takes the
difference of the cumulative device sums, so after a reset or a second read it may differ in
the last bits, as the torch ops' path). Only ``_admit`` (FIFO) and ``_book_static`` change the
cache's state, and they run last: a kernel that fails to build or launch leaves the cache as it
was, and the batch is run again with torch ops (:func:`gnnio.utils.triton_kernels.kernel_failed`
warns once).

``TRITON_INTERPRET=1`` (set before the import) runs the kernels on CPU tensors, as the tests do.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["ROW_DTYPES", "fifo_batch", "static_batch"]

#: feature dtypes the kernels copy as they are (others: the torch path)
ROW_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8,
              torch.uint8, torch.int16, torch.int32, torch.int64)  # fmt: skip
MAX_WIDTH = 8192  # elements per row in one tile
_I32_MAX = 2**31 - 1
# scratch (int64): 0 hits (static), 1 backing hot rows, 2 backing cold rows, 3 evictions (FIFO),
# 4 a dummy counter (a tier booked twice), 5-7 unused
_SCR = 8


@triton.jit
def _backing_rows(hot, cold, table, prefix, key, m, c, cm, W: tl.constexpr, HAS_TABLE: tl.constexpr):  # fmt: skip
    """The backing's rows of ``key`` where ``m`` (:class:`~gnnio.features.base.DeviceRows`):
    ``(tile, read from hot, read from cold)``; nothing read where not ``m``."""
    if HAS_TABLE:
        t = tl.load(table + key, mask=m, other=-1).to(tl.int64)
    else:
        t = tl.where(key < prefix, key, -1)
    bh = m & (t >= 0)
    bc = m & (t < 0)
    vh = tl.load(hot + t[:, None] * W + c[None, :], mask=bh[:, None] & cm[None, :], other=0)
    vc = tl.load(cold + key[:, None] * W + c[None, :], mask=bc[:, None] & cm[None, :], other=0)
    return tl.where(bh[:, None], vh, vc), bh, bc


@triton.jit
def _book(stats, scr, c_tier, c_bh, c_bc, b_bh, b_bc, n, u, hits, ins, rb):
    """One program: the batch's counts into the stats' float64 sums (unique, hits, misses,
    insertions, evictions, hit ratio, fetched bytes, hit bytes) and the tier counters (the cache's
    own tier: the rows not fetched; the backing's tiers in the cache's counters and its own);
    the scratch zeroed for the next batch."""
    bh = tl.load(scr + 1)
    bc = tl.load(scr + 2)
    ev = tl.load(scr + 3)
    misses = u - hits
    ratio = tl.where(u > 0, hits.to(tl.float64) / tl.maximum(u, 1).to(tl.float64), 0.0)
    tl.store(stats + 0, tl.load(stats + 0) + u.to(tl.float64))
    tl.store(stats + 1, tl.load(stats + 1) + hits.to(tl.float64))
    tl.store(stats + 2, tl.load(stats + 2) + misses.to(tl.float64))
    tl.store(stats + 3, tl.load(stats + 3) + ins.to(tl.float64))
    tl.store(stats + 4, tl.load(stats + 4) + ev.to(tl.float64))
    tl.store(stats + 5, tl.load(stats + 5) + ratio)
    tl.store(stats + 6, tl.load(stats + 6) + (misses * rb).to(tl.float64))
    tl.store(stats + 7, tl.load(stats + 7) + (hits * rb).to(tl.float64))
    tl.store(c_tier, tl.load(c_tier) + (n - misses))
    tl.store(c_bh, tl.load(c_bh) + bh)
    tl.store(c_bc, tl.load(c_bc) + bc)
    tl.store(b_bh, tl.load(b_bh) + bh)
    tl.store(b_bc, tl.load(b_bc) + bc)
    for k in tl.static_range(4):
        tl.store(scr + k, 0)


@triton.jit(do_not_specialize=["n"])
def _static(ids, slot_of, buf, hot, cold, table, prefix, dst, scr, n, W: tl.constexpr,
            WP: tl.constexpr, BR: tl.constexpr, HAS_TABLE: tl.constexpr):  # fmt: skip
    r = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    rm = r < n
    key = tl.load(ids + r, mask=rm, other=0)
    s = tl.load(slot_of + key, mask=rm, other=-1).to(tl.int64)
    hit = rm & (s >= 0)
    c = tl.arange(0, WP)
    cm = c < W
    vb = tl.load(buf + s[:, None] * W + c[None, :], mask=hit[:, None] & cm[None, :], other=0)
    vm, bh, bc = _backing_rows(hot, cold, table, prefix, key, rm & (s < 0), c, cm, W, HAS_TABLE)
    tl.store(dst + r[:, None] * W + c[None, :], tl.where(hit[:, None], vb, vm),
             mask=rm[:, None] & cm[None, :])  # fmt: skip
    tl.atomic_add(scr + 0, tl.sum(hit.to(tl.int64), 0))
    tl.atomic_add(scr + 1, tl.sum(bh.to(tl.int64), 0))
    tl.atomic_add(scr + 2, tl.sum(bc.to(tl.int64), 0))


@triton.jit(do_not_specialize=["n"])
def _book_static(stats, scr, c_tier, c_bh, c_bc, b_bh, b_bc, n, rb):
    hits = tl.load(scr + 0)
    nn = hits * 0 + n  # (n as an int64 scalar)
    _book(stats, scr, c_tier, c_bh, c_bc, b_bh, b_bc, nn, nn, hits, hits * 0, rb)


@triton.jit(do_not_specialize=["n"])
def _claim(ids, pos, n, BLOCK: tl.constexpr):
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    rm = r < n
    key = tl.load(ids + r, mask=rm, other=0)
    tl.atomic_min(pos + key, r, mask=rm)


@triton.jit(do_not_specialize=["n"])
def _flags(ids, pos, slot_of, ws, n, BLOCK: tl.constexpr):
    # ws (int64 [5, n]): 0 first occurrence? + (first-occurrence miss? << 32), scanned in one
    # pass for both ranks; 1 first position; 2 cached slot (-1 absent); _serve's: 3 the ring slot
    # of an inserted id (-1 otherwise), 4 the key it evicts (-1 none)
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    rm = r < n
    key = tl.load(ids + r, mask=rm, other=0)
    first = tl.load(pos + key, mask=rm, other=0)
    s = tl.load(slot_of + key, mask=rm, other=-1).to(tl.int64)
    isf = first == r
    tl.store(ws + r, isf.to(tl.int64) + ((isf & (s < 0)).to(tl.int64) << 32), mask=rm)
    tl.store(ws + n + r, first.to(tl.int64), mask=rm)
    tl.store(ws + 2 * n + r, s, mask=rm)


@triton.jit(do_not_specialize=["n"])
def _serve(ids, pos, ws, ranks, key_of, cur, buf, hot, cold, table, prefix, dst, scr, n, cap,
           W: tl.constexpr, WP: tl.constexpr, BR: tl.constexpr, HAS_TABLE: tl.constexpr):  # fmt: skip
    r = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    rm = r < n
    key = tl.load(ids + r, mask=rm, other=0)
    isf = rm & ((tl.load(ws + r, mask=rm, other=0) & 1) != 0)
    s = tl.load(ws + 2 * n + r, mask=rm, other=-1)
    hit = rm & (s >= 0)
    fm = isf & (s < 0)
    c = tl.arange(0, WP)
    cm = c < W
    vb = tl.load(buf + s[:, None] * W + c[None, :], mask=hit[:, None] & cm[None, :], other=0)
    vm, bh, bc = _backing_rows(hot, cold, table, prefix, key, fm, c, cm, W, HAS_TABLE)
    tl.store(dst + r[:, None] * W + c[None, :], tl.where(hit[:, None], vb, vm),
             mask=(hit | fm)[:, None] & cm[None, :])  # fmt: skip
    tl.store(pos + key, 2147483647, mask=isf)  # the dedup scratch left as found
    # admission: the k-th miss (first-occurrence order) goes to ring slot (head + k - skip) % cap
    m = tl.load(ranks + n - 1) >> 32
    skip = tl.maximum(m - cap, 0)
    k = (tl.load(ranks + r, mask=rm, other=0) >> 32) - 1
    ins = fm & (k >= skip)  # (none when cap == 0: then skip == m)
    vslot = (tl.load(cur) + k - skip) % tl.maximum(cap, 1)
    old = tl.load(key_of + vslot, mask=ins, other=-1)
    tl.store(ws + 3 * n + r, tl.where(ins, vslot, -1), mask=rm)
    tl.store(ws + 4 * n + r, old, mask=rm)  # (_admit writes key_of: read here)
    tl.atomic_add(scr + 1, tl.sum(bh.to(tl.int64), 0))
    tl.atomic_add(scr + 2, tl.sum(bc.to(tl.int64), 0))
    tl.atomic_add(scr + 3, tl.sum((ins & (old >= 0)).to(tl.int64), 0))


@triton.jit(do_not_specialize=["n"])
def _admit(ids, ws, ranks, key_of, slot_of, cur, clock, buf, dst, stats, scr, c_tier, c_bh, c_bc,
           b_bh, b_bc, n, cap, rb, W: tl.constexpr, WP: tl.constexpr, BR: tl.constexpr):  # fmt: skip
    r = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    rm = r < n
    key = tl.load(ids + r, mask=rm, other=0)
    isf = (tl.load(ws + r, mask=rm, other=1) & 1) != 0
    s = tl.load(ws + 2 * n + r, mask=rm, other=0)
    vslot = tl.load(ws + 3 * n + r, mask=rm, other=-1)
    rep = rm & ~isf & (s < 0)  # a repeat of a missed id: its first occurrence's row
    first = tl.load(ws + n + r, mask=rep, other=0)
    src = tl.where(rep, first, r)
    ins = rm & (vslot >= 0)
    c = tl.arange(0, WP)
    cm = c < W
    v = tl.load(dst + src[:, None] * W + c[None, :], mask=(rep | ins)[:, None] & cm[None, :])
    tl.store(dst + r[:, None] * W + c[None, :], v, mask=rep[:, None] & cm[None, :])
    tl.store(buf + vslot[:, None] * W + c[None, :], v, mask=ins[:, None] & cm[None, :])
    old = tl.load(ws + 4 * n + r, mask=ins, other=-1)
    tl.store(slot_of + old, -1, mask=ins & (old >= 0))
    tl.store(key_of + vslot, key, mask=ins)
    tl.store(slot_of + key, vslot.to(slot_of.dtype.element_ty), mask=ins)
    if tl.program_id(0) == 0:  # the batch's books (every program reads only ws, never these)
        last = tl.load(ranks + n - 1)
        m = last >> 32
        u = last - (m << 32)
        count = tl.minimum(m, cap)
        if cap > 0:
            tl.store(cur, (tl.load(cur) + count) % cap)
            tl.store(cur + 1, tl.minimum(tl.load(cur + 1) + count, cap))
        tl.store(clock, tl.load(clock) + u)
        _book(stats, scr, c_tier, c_bh, c_bc, b_bh, b_bc, n, u, u - m, count, rb)


def _rows_per_program(wp: int) -> int:
    return max(1, min(64, 4096 // wp))


class _Books:
    """The accumulators a batch is booked into: the stats' sums, the counters' device totals
    (looked up per batch: a counters object may be replaced), the scratch."""

    def __init__(self, cache, src) -> None:
        dev = cache.device
        if cache._fused_scr is None:
            cache._fused_scr = torch.zeros(_SCR, dtype=torch.int64, device=dev)
            cache._fused_dummy = cache._fused_scr[4:5]
        self.scr = cache._fused_scr
        rb = cache.row_bytes
        self.stats = cache.stats._device_sums(dev)
        cc, bc = cache.counters, src.counters
        self.c_tier = cc.device_total(cache.tier, rb, dev)
        self.c_bh = cc.device_total(src.hot_tier, rb, dev)
        self.b_bh = bc.device_total(src.hot_tier, rb, dev)
        same = src.hot_tier == src.cold_tier  # one tier: its cold count (0) goes to the dummy
        dummy = cache._fused_dummy
        self.c_bc = dummy if same else cc.device_total(src.cold_tier, rb, dev)
        self.b_bc = dummy if same else bc.device_total(src.cold_tier, rb, dev)
        self.counters = (cc, bc)

    def args(self) -> tuple:
        return self.c_tier, self.c_bh, self.c_bc, self.b_bh, self.b_bc

    def noted(self, device: torch.device) -> None:
        for c in self.counters:
            c.note_device_add(device)


def _tiling(cache, src) -> tuple[int, int, int] | None:
    """``(row width, padded width, rows per program)``; None where the kernels do not apply."""
    w = int(cache.dim)
    if cache.dtype not in ROW_DTYPES or w == 0 or w > MAX_WIDTH:
        return None
    if cache.tier in (src.hot_tier, src.cold_tier):  # one accumulator booked twice: not here
        return None
    if src.table is not None and src.table.device != cache.device:
        return None
    for t in (src.hot, src.cold):
        if t.device != cache.device or t.dtype != cache.dtype or t.dim() != 2 or t.shape[1] != w:
            return None
        if not t.is_contiguous():
            return None
    wp = 1 << (w - 1).bit_length()
    return w, wp, _rows_per_program(wp)


def static_batch(cache, idx: torch.Tensor, dst: torch.Tensor, src, timer) -> bool:
    """A static cache's batch in two launches (see the module docstring); False where the
    kernels do not apply (nothing done)."""
    tiling = _tiling(cache, src)
    if tiling is None:
        return False
    w, wp, br = tiling
    n, dev = int(idx.shape[0]), cache.device
    books = _Books(cache, src)
    table = src.table if src.table is not None else idx
    _static[(triton.cdiv(n, br),)](idx, cache.policy.slot_of, cache._buffer_ext, src.hot, src.cold,
                                   table, src.prefix, dst, books.scr, n, W=w, WP=wp, BR=br,
                                   HAS_TABLE=src.table is not None)  # fmt: skip
    copy = timer.lap("copy")
    src.on_read()
    _book_static[(1,)](books.stats, books.scr, *books.args(), n, cache.row_bytes)
    books.noted(dev)
    cache.stats._booked_on_device(n, timer.lap("manage"), copy)
    return True


def fifo_batch(cache, idx: torch.Tensor, dst: torch.Tensor, src, timer) -> bool:
    """A FIFO cache's batch in four launches and one scan (see the module docstring); False
    where the kernels do not apply (nothing done)."""
    tiling = _tiling(cache, src)
    if tiling is None or 5 * idx.shape[0] >= _I32_MAX:  # (offsets in ws: int32 arithmetic)
        return False
    w, wp, br = tiling
    pol, n, dev = cache.policy, int(idx.shape[0]), cache.device
    if cache._clock_dev is None:
        cache._clock_dev = torch.zeros((), dtype=torch.int64, device=dev)
    cur = pol.device_cursors()
    books = _Books(cache, src)
    pos = cache._dedup.pos
    block = 1024
    grid = (triton.cdiv(n, block),)
    ws = torch.empty((5, n), dtype=torch.int64, device=dev)
    _claim[grid](idx, pos, n, BLOCK=block)
    _flags[grid](idx, pos, pol._slot_ext, ws, n, BLOCK=block)
    # one 1-D scan (CUB's on a GPU) for both: unique ranks in the low 32 bits, miss ranks above
    ranks = torch.cumsum(ws[0], 0)
    manage = timer.lap("manage")
    rgrid = (triton.cdiv(n, br),)
    has_table = src.table is not None
    table = src.table if has_table else idx
    _serve[rgrid](idx, pos, ws, ranks, pol._key_ext, cur, cache._buffer_ext, src.hot, src.cold,
                  table, src.prefix, dst, books.scr, n, pol.capacity, W=w, WP=wp, BR=br,
                  HAS_TABLE=has_table)  # fmt: skip
    src.on_read()
    copy = timer.lap("copy")
    _admit[rgrid](idx, ws, ranks, pol._key_ext, pol._slot_ext, cur, cache._clock_dev,
                  cache._buffer_ext, dst, books.stats, books.scr, *books.args(), n, pol.capacity,
                  cache.row_bytes, W=w, WP=wp, BR=br)  # fmt: skip
    books.noted(dev)
    copy += timer.lap("copy")
    cache.stats._booked_on_device(n, manage, copy)
    return True
