"""The caches' batch without a host synchronisation: FIFO and static on a GPU (issue 24).

:class:`~gnnio.features.caches.cache.FeatureCache`'s batch path sizes its arrays on the host: the
dedup's unique ids, the hit and miss positions (``nonzero``), the victims by count. On a GPU each
of those is a host synchronisation -- five or six per batch for FIFO -- and the thread that gathers
waits for the GPU each time. Here every array keeps the batch's length ``n``, with masks where
the host path has data-dependent lengths:

* **dedup** as :class:`~gnnio.features.batch_ops.FirstOccurrence`, but the unique ids padded to
  ``n`` (``valid``: the first ``U`` entries; ``U`` stays a device scalar);
* **serve**: hit rows from the buffer and missed rows from the backing by masked row copies
  (:func:`~gnnio.features._gather.copy_masked`: one Triton kernel on a GPU, nothing read for a
  masked-off row); the misses come from the backing in one masked gather
  (:meth:`~gnnio.features.base.FeatureStore.gather_into`) where the backing can do it without a
  sync (rows on the GPU, or a tiered store's zero-copy host rows); otherwise the misses'
  positions are read back once (one sync) and gathered as on the host path;
* **admission** (FIFO): the ``k``-th inserted miss goes to ring slot ``(head + k) mod capacity``
  computed from the misses' running count; masked-off writes land in one sentinel entry past the
  end of ``slot_of``, ``key_of`` and the buffer; ``head`` and ``filled`` live on the device
  (:meth:`~gnnio.features.caches.policy.FIFOPolicy.device_cursors`);
* **counts**: rows per tier queued in the counters as device tensors
  (:meth:`~gnnio.features.base.TierCounters.add_device`), the cache's hits, misses, insertions and
  evictions in :class:`~gnnio.features.accounting.CacheStats`' device accumulator; both are read
  back when they are read (once per epoch in ``gnnio train``).

Where Triton runs and the backing's rows lie on the cache's device
(:meth:`~gnnio.features.base.FeatureStore.device_rows`: a tiered store with zero-copy cold rows, an
in-memory store), the whole batch is a few Triton kernels instead
(:mod:`gnnio.features.caches._triton_cache`: FIFO 4 launches and a scan, static 2, against 166 and
77 torch ops here); the torch ops below are the fallback (no Triton, another backing, a kernel
that failed), and their admission writes only the inserted rows into the buffer where Triton
runs (a row scatter with a skip state), else all ``n`` rows (the masked-off ones into the
sentinel row).

The semantics are the host path's exactly (``cache.py``'s module docstring); the tests replay both
paths batch by batch and compare rows, maps, cursors and counts. LRU, LFU and the lookahead policies keep the host path
(their victim choice is a selection of data-dependent size; BGL's point is that FIFO is the policy
a GPU can afford).
"""

from __future__ import annotations

import torch

from ...utils.triton_kernels import kernel_failed, kernel_ran, triton_available
from .._gather import copy_masked, scatter_masked
from ..batch_ops import first_positions

__all__ = ["dedup_padded", "fifo_admit", "gather_fifo", "gather_static"]


def dedup_padded(
    pos: torch.Tensor, idx: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(unique, inverse, valid, count)`` of int64 ``idx`` (length ``n``) without a sync:
    ``unique[:count]`` are the distinct ids in order of first occurrence, the rest padding (0);
    ``valid`` marks the first ``count`` entries; ``unique[inverse] == idx``. ``pos`` is the dense
    int32 scratch of :class:`~gnnio.features.batch_ops.FirstOccurrence` (left all ``2^31-1``)."""
    n = idx.numel()
    first, is_first = first_positions(pos, idx)
    rank = torch.cumsum(is_first, 0) - 1
    inverse = rank.index_select(0, first.long())
    count = is_first.sum()
    unique = torch.zeros(n + 1, dtype=torch.int64, device=idx.device)  # entry n: the sentinel
    unique.index_copy_(0, torch.where(is_first, rank, n), idx)
    valid = torch.arange(n, device=idx.device) < count
    return unique[:n], inverse, valid, count


def fifo_admit(pol, keys: torch.Tensor, miss: torch.Tensor):
    """FIFO admission of the keys where ``miss`` (in order; only the last ``capacity`` of them
    are inserted) without a sync. Returns ``(victim slot per entry, sentinel where not inserted;
    number inserted; number evicted)``, the counts as device scalars."""
    cap, sentinel_key = pol.capacity, pol.num_keys
    cur = pol.device_cursors()
    mrank = torch.cumsum(miss, 0) - 1
    m = miss.sum()
    skip = (m - cap).clamp(min=0)
    ins = miss & (mrank >= skip)
    vslot = torch.where(ins, (cur[0] + mrank - skip) % cap, cap)
    old = pol._key_ext.index_select(0, vslot)
    ev = ins & (old >= 0)
    gone = torch.where(ev, old, sentinel_key)
    pol._slot_ext.index_fill_(0, gone, -1)
    pol._key_ext.index_copy_(0, vslot, keys)
    pol._slot_ext.index_put_((torch.where(ins, keys, sentinel_key),), vslot.to(pol._slot_ext.dtype))
    count = m - skip
    cur.copy_(torch.stack([(cur[0] + count) % cap, torch.clamp(cur[1] + count, max=cap)]))
    return vslot, count, ev.sum()


def _fetch_masked(cache, ids: torch.Tensor, mask: torch.Tensor, out: torch.Tensor) -> None:
    """``out[i] = backing row ids[i]`` where ``mask``: one masked gather where the backing can,
    else the masked positions read back (one sync) and gathered as the host path does."""
    got = cache.backing.gather_into(ids, out, mask)
    if got is not None:
        for tier, rows in got:
            cache.counters.add_device(tier, rows, cache.row_bytes)
        return
    pos = torch.nonzero(mask).flatten()
    if pos.numel():
        rows, below = cache._fetch(ids.index_select(0, pos))
        out.index_copy_(0, pos, rows)
        cache._count(0, below)


def _fused(cache, idx: torch.Tensor, dst: torch.Tensor, timer) -> bool:
    """The batch as Triton kernels (:mod:`gnnio.features.caches._triton_cache`) where they
    apply; False (the cache as it was) otherwise, or after a kernel failed to build or launch."""
    if not triton_available(cache.device, "cache_batch"):
        return False
    src = cache.backing.device_rows()
    if src is None:
        return False
    idx = idx.contiguous()  # (ids already on a GPU pass through as they came)
    try:
        from . import _triton_cache

        run = _triton_cache.fifo_batch if cache.policy.dynamic else _triton_cache.static_batch
        if not run(cache, idx, dst, src, timer):
            return False
    except Exception as e:  # noqa: BLE001 - a Triton that cannot build them: torch ops
        # Nothing to undo: only the last kernel changes the cache; the dedup scratch holds at
        # most this batch's claims, which the torch path below claims and clears again; the
        # kernels' count scratch is not read again (a failed kernel is not tried again).
        kernel_failed("cache_batch", e, "the cache's batch in torch ops instead")
        return False
    kernel_ran("cache", "triton")
    return True


def gather_static(cache, idx: torch.Tensor, dst: torch.Tensor, timer) -> None:
    """A static cache's batch: hit rows from the buffer, the others from the backing (rows,
    repeats included, as the host path counts them)."""
    if _fused(cache, idx, dst, timer):
        return
    kernel_ran("cache", "torch")
    slots = cache.policy.lookup(idx)
    hit = slots >= 0
    manage = timer.lap("manage")
    copy_masked(cache.buffer, slots, dst)
    _fetch_masked(cache, idx, ~hit, dst)
    copy = timer.lap("copy")
    n, h = int(idx.numel()), hit.sum()
    cache.counters.add_device(cache.tier, h, cache.row_bytes)
    cache.stats._record_device(n, n, h, n - h, 0, 0, cache.row_bytes, manage, copy)


def gather_fifo(cache, idx: torch.Tensor, dst: torch.Tensor, timer) -> None:
    """A FIFO cache's batch (``cache.py``'s steps 1-5 without a sync where the backing allows)."""
    if _fused(cache, idx, dst, timer):
        return
    kernel_ran("cache", "torch")
    pol = cache.policy
    n = int(idx.numel())
    uniq, inv, valid, u = dedup_padded(cache._dedup.pos, idx)
    if cache._clock_dev is None:  # the clock advances by the unique ids, as on the host path
        cache._clock_dev = torch.zeros((), dtype=torch.int64, device=cache.device)
    cache._clock_dev.add_(u)
    slots = pol.lookup(uniq)
    hit_u = valid & (slots >= 0)
    miss_u = valid & (slots < 0)
    slot_r = slots.index_select(0, inv)
    hit_r = slot_r >= 0
    manage = timer.lap("manage")

    copy_masked(cache.buffer, slot_r, dst)  # hits
    rows_u = torch.empty((n, cache.dim), dtype=cache.dtype, device=cache.device)
    _fetch_masked(cache, uniq, miss_u, rows_u)  # each missed id once
    copy_masked(rows_u, torch.where(hit_r, -1, inv), dst)  # missed rows and their repeats
    copy = timer.lap("copy")

    m = miss_u.sum()
    if pol.capacity:
        vslot, ins, ev = fifo_admit(pol, uniq, miss_u)
        manage += timer.lap("manage")
        if not scatter_masked(rows_u, torch.where(vslot < pol.capacity, vslot, -1), cache.buffer):
            cache._buffer_ext.index_copy_(0, vslot, rows_u)  # the skipped rows: the sentinel
        copy += timer.lap("copy")
    else:
        ins = ev = torch.zeros((), dtype=torch.int64, device=cache.device)
    cache.counters.add_device(cache.tier, m.neg().add_(n), cache.row_bytes)
    cache.stats._record_device(n, u, hit_u.sum(), m, ins, ev, cache.row_bytes, manage, copy)
