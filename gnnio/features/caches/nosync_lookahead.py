"""The lookahead cache's batch without a host synchronisation (``lookahead`` / ``optimal`` on a
GPU; issue 24, items 2 and 5).

:class:`~gnnio.features.caches.lookahead.LookaheadPolicy`'s host path sizes its arrays on the
host: the dedup's unique count, the announce ring's per-batch lengths and cursors, ``nonzero`` of
the hits, misses and kept misses, ``topk`` / ``kthvalue`` of the victims -- on a GPU each is a
host synchronisation. Here, as in :mod:`gnnio.features.caches.nosync` (FIFO), every array keeps a
fixed length (the batch's ``n``, or ``capacity - static_capacity + n``), masks stand where the host
path has data-dependent lengths, masked-off writes go to a sentinel (key ``num_keys`` of the
policy's per-key state, slot ``capacity`` of ``key_of`` and the buffer), and the data-dependent
scalars stay on the device:

* **cursors**: ``[next_serial, consumed, filled]`` in
  :meth:`~gnnio.features.caches.lookahead.LookaheadPolicy.device_cursors`; an announced batch is
  queued with its first serial and unique count as device scalars and its padded length ``n``
  (the ring is sized on the host from the padded lengths, an upper bound of the live serials, so
  the padding's ring entries never reach a live one);
* **announce**: the padded unique ids (:func:`~gnnio.features.caches.nosync.dedup_padded`) linked
  into the ring as the host path links them (masked link writes go to a padding position of this
  very batch, which the batch's own ring write then overwrites);
* **begin_batch**: one gather of the keys' state rows (rank, last serial, fallback, slot: the
  lookup comes with it), the new rank and fallback computed, one row write back;
* **admission**: the ``C = capacity - static_capacity`` dynamic slots and the ``n`` padded misses
  ranked together (an empty slot and a non-miss rank above every real rank), one stable sort, the
  first ``C`` kept -- exactly the host path's choice (:func:`~gnnio.features.caches.lookahead.kept_smallest`:
  ties kept in position order); the freed slots listed empty ones first, then the evicted in slot
  order, and the ``k``-th admitted miss paired with the ``k``-th freed slot by a running count.

The cache's counters and stats are booked as device scalars (read back when read). Where Triton
runs, the bookkeeping is Triton kernels (:mod:`gnnio.features.caches._triton_lookahead`) and,
over a backing whose rows lie on the device, so are the rows and the books
(:mod:`gnnio.features.caches._triton_lookahead_rows`; ``python benchmarks/cache_syncs.py
--interpret``: 33 torch ops and 12 launches per batch against 241 and 4). The host path
stays for CPU caches (numba kernels) and is the fallback; ``tests/test_cache_nosync_lookahead.py``
replays both batch by batch and compares rows, maps, ranks, cursors and counts.
"""

from __future__ import annotations

import torch

from ...utils.triton_kernels import kernel_failed, kernel_ran, triton_available
from .._gather import copy_masked, scatter_masked
from . import _lookahead_kernels as _K
from .nosync import _fetch_masked, dedup_padded

__all__ = ["admit_padded", "announce_padded", "begin_padded", "gather_lookahead"]

_INF = 1 << 62  # lookahead._INF: "no next use known"
_BEYOND = 1 << 61  # lookahead._BEYOND: ranks beyond the window start here
_FREQ_MAX = (1 << 24) - 1
_EMPTY = (1 << 62) + 2  # an empty slot's rank: above every real rank (freed first)
_NONE = (1 << 62) + 3  # a padding entry's or a hit's rank: never kept


def _kernels(pol):
    """:mod:`gnnio.features.caches._triton_lookahead` where its kernels run, else None."""
    if not triton_available(pol.device, "lookahead_batch"):
        return None
    try:
        from . import _triton_lookahead

        return _triton_lookahead
    except Exception as e:  # noqa: BLE001 - a Triton that cannot import them: torch ops
        kernel_failed("lookahead_batch", e, "the lookahead cache's batch in torch ops instead")
        return None


def _launched(run, *args) -> bool:
    """``run(*args)`` (a kernel step that changes nothing unless it completes); False after a
    failure to build or launch it (warned once; the torch ops run instead)."""
    try:
        run(*args)
    except Exception as e:  # noqa: BLE001
        kernel_failed("lookahead_batch", e, "the lookahead cache's batch in torch ops instead")
        return False
    return True


def _reserve(pol, n: int) -> None:
    """Make the ring hold the pending batches' padded lengths plus ``n`` serials; a grown ring
    takes over every old entry at its serial's place (the live ones among them), no sync."""
    bound = n + sum(e[3] if len(e) == 4 else e[2] for e in pol.pending)
    r = pol.ring_ids.numel()
    if bound <= r:
        return
    new_r, dev = max(1024, 2 * bound), pol.device
    ids = torch.zeros(new_r, dtype=torch.int64, device=dev)
    nxt = torch.full((new_r,), _INF, dtype=torch.int64, device=dev)
    if r:
        c = pol.device_cursors()[1]
        serial = c + torch.remainder(torch.arange(r, device=dev) - c, r)  # [c, c + r)
        at = torch.remainder(serial, new_r)
        ids.index_copy_(0, at, pol.ring_ids)
        nxt.index_copy_(0, at, pol.ring_next)
    pol.ring_ids, pol.ring_next = ids, nxt


def announce_padded(pol, uniq: torch.Tensor, valid: torch.Tensor, u: torch.Tensor) -> None:
    """:meth:`~gnnio.features.caches.lookahead.LookaheadPolicy.announce` of the padded unique ids
    (``uniq[:u]`` the batch's, ``valid`` marking them; ``u`` a device scalar)."""
    n = int(uniq.numel())
    if n == 0:  # (u == 0 only here) an empty batch is served without the cache looking at it
        return
    _reserve(pol, n)
    cur = pol.device_cursors()
    j, s0 = pol.announced, cur[0].clone()
    k = _kernels(pol)
    if k is None or not _launched(k.announce, pol, uniq, u, n, cur):
        _announce_torch(pol, uniq, valid, n, cur, s0)
    cur[0].add_(u)
    pol.pending.append((j, s0, u, n))
    pol.announced += 1


def _announce_torch(pol, uniq, valid, n: int, cur, s0) -> None:
    """The announcement in torch ops (the cursors not moved: the caller does)."""
    j, r, nk, dev = pol.announced, pol.ring_ids.numel(), pol.num_keys, pol.device
    ks = pol._ks_ext
    serials = s0 + torch.arange(n, device=dev)
    key = torch.where(valid, uniq, nk)
    prev = ks[:, _K.LAST].index_select(0, key)
    waiting = valid & (prev >= cur[1])  # an earlier occurrence still in the window: link it
    at = torch.remainder(serials, r)
    # masked-off links land on this batch's last ring entry, written again just below
    pol.ring_next.index_fill_(0, torch.where(waiting, torch.remainder(prev, r), at[-1]), j)
    ks[:, _K.RANK].index_fill_(0, torch.where(waiting, nk, key), j)  # fresh: next use is j
    pol.ring_ids.index_copy_(0, at, uniq)
    pol.ring_next.index_fill_(0, at, _INF)
    ks[:, _K.LAST].index_copy_(0, key, serials)


def begin_padded(pol, uniq: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """:meth:`~gnnio.features.caches.lookahead.LookaheadPolicy.begin_batch` of the announced
    batch ``uniq`` (padded, as announced); returns the keys' slots (the lookup, -1 absent)."""
    entry = pol.pending.popleft()
    a, m = entry[1], entry[2]
    k = _kernels(pol) if isinstance(a, torch.Tensor) else None
    if k is not None:
        try:
            return k.begin(pol, uniq, a, m)
        except Exception as e:  # noqa: BLE001 - nothing changed: the torch ops below
            kernel_failed("lookahead_batch", e, "the lookahead cache's batch in torch ops instead")
    n, r, dev = int(uniq.numel()), pol.ring_ids.numel(), pol.device
    cur = pol.device_cursors()
    nxt = pol.ring_next.index_select(0, torch.remainder(a + torch.arange(n, device=dev), r))
    key = torch.where(valid, uniq, pol.num_keys)
    rows = pol._ks_ext.index_select(0, key)
    fb = rows[:, _K.FALLBACK]
    used = torch.bitwise_and(torch.bitwise_right_shift(fb - _BEYOND, 1), _FREQ_MAX) != 0
    fb = fb - 2 * used.long()  # one more use (until 0)
    rank = torch.where(nxt < _INF, nxt, fb)
    slots = rows[:, _K.SLOT].contiguous()  # (the kernels read it as a flat array)
    pol._ks_ext.index_copy_(0, key, torch.stack([rank, rows[:, _K.LAST], fb, slots], 1))
    cur[1].copy_(a + m)
    return slots


def admit_padded(pol, uniq: torch.Tensor, miss: torch.Tensor):
    """:meth:`~gnnio.features.caches.lookahead.LookaheadPolicy.admit` of the keys where ``miss``
    (module docstring). Returns ``(slot per entry, capacity where not admitted; number admitted;
    number evicted)``, the counts as device scalars."""
    cap, s0, nk, dev = pol.capacity, pol.static_capacity, pol.num_keys, pol.device
    c, n = cap - s0, int(uniq.numel())
    cur = pol.device_cursors()
    rank = pol._ks_ext[:, _K.RANK]
    res = pol.key_of[s0:]
    occ = res >= 0
    r_res = torch.where(occ, rank.index_select(0, torch.where(occ, res, nk)), _EMPTY)
    r_miss = rank.index_select(0, torch.where(miss, uniq, nk))
    r_miss = torch.where(miss, r_miss + (r_miss >= _BEYOND).long(), _NONE)
    ranks = torch.cat([r_res, r_miss])
    kept = torch.zeros(c + n, dtype=torch.bool, device=dev)
    kept.index_fill_(0, torch.sort(ranks, stable=True).indices[:c], True)
    kept &= ranks < _EMPTY
    evict = occ & ~kept[:c]
    admit = kept[c:]
    # freed slots, empty ones (a suffix: slot - filled) first, then the evicted in slot order
    empty = ~occ
    order = torch.cumsum(torch.stack([empty.long(), evict.long()]), 1) - 1
    at = torch.where(empty, order[0], order[0, -1] + 1 + order[1])
    freed = torch.empty(c + 1, dtype=torch.int64, device=dev)
    freed.index_copy_(0, torch.where(empty | evict, at, c), s0 + torch.arange(c, device=dev))
    k = torch.cumsum(admit, 0) - 1
    vslot = torch.where(admit, freed.index_select(0, k.clamp(min=0)), cap)
    pol._ks_ext[:, _K.SLOT].index_fill_(0, torch.where(evict, res, nk), -1)
    pol._key_ext.index_copy_(0, vslot, uniq)
    pol._ks_ext[:, _K.SLOT].index_copy_(0, torch.where(admit, uniq, nk), vslot)
    count = k[-1] + 1
    cur[2].copy_(torch.clamp(cur[2] + count, max=cap))
    return vslot, count, evict.sum()


def dedup_and_announce(cache, idx: torch.Tensor) -> tuple:
    """The padded dedup of ``idx`` and its announcement; ``(unique, inverse, valid, count)``."""
    d = _dedup(cache, idx)
    announce_padded(cache.policy, d[0], d[2], d[3])
    return d


def _dedup(cache, idx: torch.Tensor) -> tuple:
    """:func:`~gnnio.features.caches.nosync.dedup_padded`, as Triton kernels where they run."""
    k = _kernels(cache.policy)
    if k is not None and idx.numel():
        try:
            return k.dedup(cache._dedup.pos, idx)
        except Exception as e:  # noqa: BLE001 - the torch dedup claims and clears the scratch
            kernel_failed("lookahead_batch", e, "the lookahead cache's batch in torch ops instead")
    return dedup_padded(cache._dedup.pos, idx)


def _check_next(pol, uniq: torch.Tensor, u: torch.Tensor) -> None:
    """A batch served that was not announced as this object: compare it with the batch announced
    next (syncs; off the loader's protocol only) and refuse it as the host path does."""
    pol.sync_cursors()
    _j, a, m = pol.pending[0]
    if m != int(u) or not torch.equal(pol._ring_get(pol.ring_ids, a, m), uniq[:m]):
        raise ValueError(
            "lookahead cache: the batch served is not the batch announced next "
            f"({int(u)} ids served, {m} announced)"
        )


def gather_lookahead(cache, idx: torch.Tensor, dst: torch.Tensor, timer, pre=None) -> None:
    """A lookahead / optimal cache's batch (``cache.py``'s steps, the policy's ranking) without a
    sync where the backing allows; ``pre``: the padded dedup made when ``idx`` was announced."""
    pol = cache.policy
    n = int(idx.numel())
    if pre is not None:
        uniq, inv, valid, u = pre
    elif pol.pending:
        uniq, inv, valid, u = _dedup(cache, idx)
        _check_next(pol, uniq, u)
    else:  # served unannounced (K = 0): announced and consumed at once
        uniq, inv, valid, u = dedup_and_announce(cache, idx)
    if cache._clock_dev is None:
        cache._clock_dev = torch.zeros((), dtype=torch.int64, device=cache.device)
    cache._clock_dev.add_(u)
    slots = begin_padded(pol, uniq, valid)
    manage = timer.lap("manage")
    rk = _rows_kernels(cache)  # (module, what it needs) where Triton serves the rows
    rows_u = None
    if rk is not None:
        try:
            rows_u = rk[0].serve(cache, rk[1], uniq, inv, slots, u, dst)
        except Exception as e:  # noqa: BLE001 - only the output and the scratch changed
            kernel_failed("lookahead_rows", e, "the lookahead cache's rows in torch ops instead")
            cache._fused_scr[:4].zero_()
            rk = None
    if rk is None:
        kernel_ran("cache", "torch")
        slot_r = slots.index_select(0, inv)
        copy_masked(cache.buffer, slot_r, dst)  # hits
        rows_u = torch.empty((n, cache.dim), dtype=cache.dtype, device=cache.device)
        _fetch_masked(cache, uniq, valid & (slots < 0), rows_u)  # each missed id once
        copy_masked(rows_u, torch.where(slot_r >= 0, -1, inv), dst)  # misses and their repeats
    copy = timer.lap("copy")

    cap = pol.capacity
    if cap > pol.static_capacity:
        vslot, ins, ev = _admit(pol, uniq, valid, slots, u)
        manage += timer.lap("manage")
    else:
        vslot = None
        ins = ev = cache._fused_scr[5] if rk is not None else _zero(cache)
    if rk is not None:
        try:
            vs = vslot if vslot is not None else torch.full((n,), cap, device=cache.device)
            rk[0].finish(cache, rk[1], rows_u, vs, u, ins, ev)
            kernel_ran("cache", "triton")
            cache.stats._booked_on_device(n, manage, copy + timer.lap("copy"))
            return
        except Exception as e:  # noqa: BLE001 - the rows and the books in torch ops below
            kernel_failed("lookahead_rows", e, "the lookahead cache's rows in torch ops instead")
            m = rk[0].book_in_torch(cache, rk[1])
    else:
        m = (valid & (slots < 0)).sum()
    if vslot is not None:
        assert rows_u is not None  # (served or fetched above)
        if not scatter_masked(rows_u, torch.where(vslot < cap, vslot, -1), cache.buffer):
            cache._buffer_ext.index_copy_(0, vslot, rows_u)  # the others: the sentinel row
    copy += timer.lap("copy")
    cache.counters.add_device(cache.tier, m.neg().add_(n), cache.row_bytes)
    cache.stats._record_device(n, u, u - m, m, ins, ev, cache.row_bytes, manage, copy)


def _zero(cache) -> torch.Tensor:
    return torch.zeros((), dtype=torch.int64, device=cache.device)


def _admit(pol, uniq, valid, slots, u):
    """The admission: the Triton kernels where they run, else (or after a failure) torch ops."""
    k = _kernels(pol)
    if k is not None:
        try:
            return k.admit(pol, uniq, slots, u)
        except Exception as e:  # noqa: BLE001 - only its last kernel changes the cache
            kernel_failed("lookahead_batch", e, "the lookahead cache's batch in torch ops instead")
    return admit_padded(pol, uniq, valid & (slots < 0))


def _rows_kernels(cache):
    """``(module, what it needs)`` where Triton serves the batch's rows, else None."""
    if _kernels(cache.policy) is None or not triton_available(cache.device, "lookahead_rows"):
        return None
    try:
        from . import _triton_lookahead_rows as rows
    except Exception as e:  # noqa: BLE001 - a Triton that cannot import them: torch ops
        kernel_failed("lookahead_rows", e, "the lookahead cache's rows in torch ops instead")
        return None
    got = rows.applies(cache)
    return None if got is None else (rows, got)
