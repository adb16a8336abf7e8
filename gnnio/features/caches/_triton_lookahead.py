"""The lookahead cache's sync-free bookkeeping as Triton kernels (issue 24, items 2 and 5).

:mod:`gnnio.features.caches.nosync_lookahead` in torch ops dispatches about 140 operations per
batch for the announcement, ``begin_batch`` and the admission; here they are six launches, one
stable sort and two scans, computing exactly what the torch ops compute (the tests replay both;
the rows and the books: :mod:`gnnio.features.caches._triton_lookahead_rows`):

* the padded dedup (``dedup``): FIFO's ``_claim`` (each id's first position), ``_first`` (first
  occurrences flagged), one scan, ``_place`` (unique ids, inverse, padding mask; the scratch
  reset);
* ``_announce``: per unique id of the padded batch (``i < u``), its pending occurrence linked to
  batch ``j`` or its rank set to ``j``, its ring entry and last serial written (the cursors read,
  not written: the caller advances ``next_serial`` after the launch);
* ``_begin``: per unique id, the fallback's frequency counted, the rank set to the next use in the
  ring or the fallback, the slot read (the lookup); program 0 moves ``consumed`` (no program
  reads it);
* admission: ``_ranks`` writes the ``C`` dynamic slots' and the ``n`` padded misses' ranks (an
  empty slot and a non-miss above every real rank), ``torch.sort(stable=True)`` keeps the first
  ``C``; ``_flags`` marks empty and evicted slots (packed in one int64: evicted 32 bits up) and
  admitted misses, one scan each; ``_freed`` lists the freed slots (empty first, then evicted, in
  slot order) and the key each held; ``_admit`` pairs the ``k``-th admitted miss with the ``k``-th
  freed slot, clears the evicted key's slot, writes ``key_of`` and the new key's slot, and program
  0 moves ``filled``. Only ``_admit`` changes the cache, and it runs last: a kernel that fails to
  build leaves the cache as it was (the caller then runs the torch ops). Writes in one launch
  never collide: the keys of one batch are distinct, the evicted keys are cached and the admitted
  ones are not, the freed slots are distinct; no launch reads what it writes.

``TRITON_INTERPRET=1`` (set before the import) runs the kernels on CPU tensors, as the tests do.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["admit", "announce", "begin", "dedup"]

_BLOCK = 1024
INF = tl.constexpr(1 << 62)  # lookahead._INF
BEYOND = tl.constexpr(1 << 61)
FREQ_MAX = tl.constexpr((1 << 24) - 1)
EMPTY = tl.constexpr((1 << 62) + 2)  # nosync_lookahead._EMPTY
NONE = tl.constexpr((1 << 62) + 3)
LOW = tl.constexpr((1 << 32) - 1)


@triton.jit(do_not_specialize=["n"])
def _first(ids, pos, ws, n, BLOCK: tl.constexpr):
    # after _triton_cache._claim: ws[r] = whether r is its id's first occurrence, ws[n + r] = that
    # occurrence's position
    r = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    rm = r < n
    first = tl.load(pos + tl.load(ids + r, mask=rm, other=0), mask=rm, other=0).to(tl.int64)
    tl.store(ws + r, (first == r).to(tl.int64), mask=rm)
    tl.store(ws + n + r, first, mask=rm)


@triton.jit(do_not_specialize=["n"])
def _place(ids, pos, ws, rank, uniq, inv, valid, n, BLOCK: tl.constexpr):
    # rank: the scan of ws[:n]; each id's unique index, the unique ids in first-occurrence order,
    # the padding mask; the dedup scratch left as found
    r = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    rm = r < n
    key = tl.load(ids + r, mask=rm, other=0)
    isf = rm & (tl.load(ws + r, mask=rm, other=0) != 0)
    q = tl.load(rank + tl.load(ws + n + r, mask=rm, other=0), mask=rm, other=1) - 1
    tl.store(inv + r, q, mask=rm)
    tl.store(uniq + q, key, mask=isf)
    tl.store(pos + key, 2147483647, mask=isf)
    tl.store(valid + r, r < tl.load(rank + n - 1), mask=rm)


@triton.jit(do_not_specialize=["n", "j", "r"])
def _announce(uniq, ks, ring_ids, ring_next, cur, u_ptr, n, j, r, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    v = (i < n) & (i < tl.load(u_ptr))
    key = tl.load(uniq + i, mask=v, other=0)
    serial = tl.load(cur) + i
    prev = tl.load(ks + key * 4 + 1, mask=v, other=-1)
    wait = v & (prev >= tl.load(cur + 1))
    jj = key * 0 + j
    tl.store(ring_next + prev % r, jj, mask=wait)
    tl.store(ks + key * 4, jj, mask=v & ~wait)
    p = serial % r
    tl.store(ring_ids + p, key, mask=v)
    tl.store(ring_next + p, key * 0 + INF, mask=v)
    tl.store(ks + key * 4 + 1, serial, mask=v)


@triton.jit(do_not_specialize=["n", "r"])
def _begin(uniq, ks, ring_next, a_ptr, m_ptr, cur, slots, n, r, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    rm = i < n
    a = tl.load(a_ptr)
    m = tl.load(m_ptr)
    v = rm & (i < m)
    key = tl.load(uniq + i, mask=v, other=0)
    nxt = tl.load(ring_next + (a + i) % r, mask=v, other=INF)
    fb = tl.load(ks + key * 4 + 2, mask=v, other=BEYOND)
    fb = fb - 2 * ((((fb - BEYOND) >> 1) & FREQ_MAX) != 0).to(tl.int64)
    tl.store(ks + key * 4 + 2, fb, mask=v)
    tl.store(ks + key * 4, tl.where(nxt < INF, nxt, fb), mask=v)
    tl.store(slots + i, tl.load(ks + key * 4 + 3, mask=v, other=-1), mask=rm)
    if tl.program_id(0) == 0:
        tl.store(cur + 1, a + m)


@triton.jit(do_not_specialize=["c", "n"])
def _ranks(key_res, uniq, slots, u_ptr, ks, out, c, n, BLOCK: tl.constexpr):
    e = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    res = e < c
    ism = (e >= c) & (e - c < n)  # (int64: c + n may pass 2^31)
    kr = tl.load(key_res + e, mask=res, other=-1)
    i = e - c
    s = tl.load(slots + i, mask=ism, other=0)
    miss = ism & (i < tl.load(u_ptr)) & (s < 0)
    key = tl.where(res, kr, tl.load(uniq + i, mask=miss, other=0))
    rk = tl.load(ks + key * 4, mask=(res & (kr >= 0)) | miss, other=0)
    r_res = tl.where(kr >= 0, rk, EMPTY)
    r_miss = tl.where(miss, rk + (rk >= BEYOND).to(tl.int64), NONE)
    tl.store(out + e, tl.where(res, r_res, r_miss), mask=res | ism)


@triton.jit(do_not_specialize=["c", "n"])
def _flags(ranks, kept, key_res, ws, c, n, BLOCK: tl.constexpr):
    # ws[:c]: empty + (evicted << 32) per dynamic slot; ws[c:]: admitted per padded miss
    e = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    valid = e - c < n
    res = e < c
    keep = (tl.load(kept + e, mask=valid, other=0) != 0) & (
        tl.load(ranks + e, mask=valid, other=NONE) < EMPTY
    )
    occ = tl.load(key_res + e, mask=res, other=-1) >= 0
    f_res = (~occ).to(tl.int64) + ((occ & ~keep).to(tl.int64) << 32)
    tl.store(ws + e, tl.where(res, f_res, keep.to(tl.int64)), mask=valid)


@triton.jit(do_not_specialize=["c", "s0"])
def _freed(ws, cs, key_res, freed, old, c, s0, BLOCK: tl.constexpr):
    e = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    res = e < c
    f = tl.load(ws + e, mask=res, other=0)
    x = tl.load(cs + e, mask=res, other=0)
    empty = (f & LOW) != 0
    m = res & (f != 0)
    pos = tl.where(empty, (x & LOW) - 1, (tl.load(cs + c - 1) & LOW) + (x >> 32) - 1)
    tl.store(freed + pos, s0 + e, mask=m)
    tl.store(old + pos, tl.load(key_res + e, mask=m, other=-1), mask=m)


@triton.jit(do_not_specialize=["n", "cap"])
def _admit(uniq, ws_m, cs_m, freed, old, ks, key_of, vslot, cur, n, cap, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    rm = i < n
    adm = rm & (tl.load(ws_m + i, mask=rm, other=0) != 0)
    k = tl.load(cs_m + i, mask=adm, other=1) - 1
    slot = tl.load(freed + k, mask=adm, other=0)
    o = tl.load(old + k, mask=adm, other=-1)
    key = tl.load(uniq + i, mask=adm, other=0)
    tl.store(ks + o * 4 + 3, o * 0 - 1, mask=adm & (o >= 0))
    tl.store(key_of + slot, key, mask=adm)
    tl.store(ks + key * 4 + 3, slot, mask=adm)
    tl.store(vslot + i, tl.where(adm, slot, cap), mask=rm)
    if tl.program_id(0) == 0:
        cnt = tl.load(cs_m + n - 1)
        tl.store(cur + 2, tl.minimum(tl.load(cur + 2) + cnt, cap))


def dedup(pos: torch.Tensor, idx: torch.Tensor) -> tuple:
    """:func:`~gnnio.features.caches.nosync.dedup_padded` of int64 ``idx`` in three launches and
    a scan: ``(unique, inverse, valid, count)``, the same tensors' values. A failure after the
    first launch leaves only this batch's claims in ``pos`` (what the torch dedup claims again)."""
    from ._triton_cache import _claim

    idx = idx.contiguous()
    n, dev = int(idx.numel()), idx.device
    grid = (triton.cdiv(n, _BLOCK),)
    ws = torch.empty(2 * n, dtype=torch.int64, device=dev)
    _claim[grid](idx, pos, n, BLOCK=_BLOCK)
    _first[grid](idx, pos, ws, n, BLOCK=_BLOCK)
    rank = torch.cumsum(ws[:n], 0)
    uniq = torch.zeros(n, dtype=torch.int64, device=dev)
    inv = torch.empty(n, dtype=torch.int64, device=dev)
    valid = torch.empty(n, dtype=torch.bool, device=dev)
    _place[grid](idx, pos, ws, rank, uniq, inv, valid, n, BLOCK=_BLOCK)
    return uniq, inv, valid, rank[-1]


def announce(pol, uniq: torch.Tensor, u: torch.Tensor, n: int, cur: torch.Tensor) -> None:
    """``_announce`` of the padded batch (the ring reserved, the cursors on the device)."""
    grid = (triton.cdiv(n, _BLOCK),)
    _announce[grid](uniq, pol._ks_ext, pol.ring_ids, pol.ring_next, cur, u, n, pol.announced,
                    pol.ring_ids.numel(), BLOCK=_BLOCK)  # fmt: skip


def begin(pol, uniq: torch.Tensor, a: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """``_begin`` of the announced padded batch; its slots (-1 absent or padding)."""
    n = int(uniq.numel())
    slots = torch.empty(n, dtype=torch.int64, device=uniq.device)
    _begin[(triton.cdiv(n, _BLOCK),)](uniq, pol._ks_ext, pol.ring_next, a, m,
                                      pol.device_cursors(), slots, n, pol.ring_ids.numel(),
                                      BLOCK=_BLOCK)  # fmt: skip
    return slots


def admit(pol, uniq: torch.Tensor, slots: torch.Tensor, u: torch.Tensor):
    """The admission of the padded batch's misses (``slots < 0`` among the first ``u``): ``(slot
    per entry, capacity where not admitted; number admitted; number evicted)``, device scalars."""
    cap, s0, dev = pol.capacity, pol.static_capacity, pol.device
    c, n = cap - s0, int(uniq.numel())
    key_res = pol.key_of[s0:]
    slots = slots.contiguous()  # (the torch begin's is a column of the keys' state rows)
    ranks = torch.empty(c + n, dtype=torch.int64, device=dev)
    grid = (triton.cdiv(c + n, _BLOCK),)
    _ranks[grid](key_res, uniq, slots, u, pol._ks_ext, ranks, c, n, BLOCK=_BLOCK)
    kept = torch.zeros(c + n, dtype=torch.int8, device=dev)
    kept.index_fill_(0, torch.sort(ranks, stable=True).indices[:c], 1)
    ws = torch.empty(c + n, dtype=torch.int64, device=dev)
    _flags[grid](ranks, kept, key_res, ws, c, n, BLOCK=_BLOCK)
    cs_res, cs_m = torch.cumsum(ws[:c], 0), torch.cumsum(ws[c:], 0)
    # the freed slots and the keys they held (two tensors: the interpreter copies each argument
    # back whole, so two views of one tensor written in one launch would undo each other)
    freed = torch.empty(c, dtype=torch.int64, device=dev)
    old = torch.empty(c, dtype=torch.int64, device=dev)
    _freed[(triton.cdiv(c, _BLOCK),)](ws, cs_res, key_res, freed, old, c, s0, BLOCK=_BLOCK)
    vslot = torch.empty(n, dtype=torch.int64, device=dev)
    _admit[(triton.cdiv(n, _BLOCK),)](uniq, ws[c:], cs_m, freed, old, pol._ks_ext,
                                      pol._key_ext, vslot, pol.device_cursors(), n, cap,
                                      BLOCK=_BLOCK)  # fmt: skip
    return vslot, cs_m[-1], cs_res[-1] >> 32
