"""Feature caches: wrappers over any :class:`~gnnio.features.base.FeatureStore` that keep some rows
on the cache's device, with the policies static, FIFO, LRU and LFU (BGL §3.2.1, PaGraph).

A cache is a feature store (composition, as GraphBolt's ``GPUCachedFeature(fallback, cache)``):
``FeatureCache(backing, capacity, policy)`` serves the rows it holds from its buffer and fetches
the others from ``backing`` in *one* ``gather``. Caches stack: a GPU cache over a CPU cache over a
memory-mapped store is ``FeatureCache(FeatureCache(mmap, c2, "fifo"), c1, "fifo", device="cuda")``
(:func:`two_level_cache`); a static hot part in front of a dynamic one is
:func:`static_plus_dynamic`. The multi-GPU cache sharded by ``id mod #GPUs`` is in
:mod:`gnnio.features.caches.multi`.

Where the parts live: the policies' bookkeeping (slots, victims) in
:mod:`gnnio.features.caches.policy`, :class:`CacheStats` and the phase timer in
:mod:`gnnio.features.accounting`, the batch dedup and row copies in :mod:`gnnio.features.batch_ops`
(their public names are re-exported here); this module holds the cache itself and its stacks.

Data structures (BGL footnote 3: "a contiguous 1D array as a HashMap"). Keys are global node ids
``[0, N)``. ``slot_of`` is a dense int array of length ``N`` (``-1`` = not cached), ``key_of`` its
inverse over the ``capacity`` buffer slots, ``buffer`` the ``[capacity, dim]`` rows. All of them are
torch tensors on the cache's device; every per-batch step is a handful of vectorized tensor ops
(no Python loop over ids), so the same code runs on a GPU.

Batch semantics (exact; :func:`tests.test_cache.reference_simulation` replays them id by id):

1. **Dedup.** The batch's ids (any order, repeats allowed) are reduced to their unique ids ``u_0 ..
   u_{U-1}`` in order of first occurrence. ``u_i`` gets the tick ``T + i``; ``T`` (the cache's
   clock) then advances by ``U``. A static cache skips this step: it neither admits nor tracks
   recency, and looks up every requested row (its hit/miss counts are rows, repeats included).
2. **Lookup.** Every unique id is looked up *before* anything changes: ``hits`` are the ids present.
3. **Hit bookkeeping.** LRU: a hit's recency becomes its tick (recency at batch granularity, ties
   inside a batch broken by first-occurrence position). LFU: a hit's frequency grows by one (once
   per batch, however often the id repeats in it) and its recency becomes its tick. FIFO and
   static: nothing.
4. **Serve.** Hit rows are read from the buffer; the misses are fetched from ``backing`` in one
   ``gather`` (unique ids, first-occurrence order) and written to the output. Rows are always
   correct, whatever the capacity.
5. **Admission.** The misses are inserted in order. If there are more misses than ``capacity``
   only the *last* ``capacity`` of them are inserted (the cache still makes progress when one
   batch needs more rows than it holds -- DGL's GraphBolt deadlocked there, dgl#7646). Victims are
   chosen among the entries present before this batch's insertions (entries inserted in the same
   batch never evict each other); empty slots are used first (lowest slot first), then:

   * FIFO: the slots after the ring head, in ring order (oldest insertion first; hits do not
     refresh an entry); the head advances by the number inserted;
   * LRU: the entries with the smallest recency tick;
   * LFU: the smallest ``(frequency, recency tick)`` pairs -- least frequently used, ties broken
     by least recently used. Frequencies count batches while the id is cached (in-cache LFU): an
     inserted id starts at 1, an evicted id forgets its count;
   * static: nothing is ever inserted or evicted.

   The ``k``-th admitted id goes into the ``k``-th victim slot; ``evictions`` counts the victims
   that held an entry.

Counters. ``counters`` (:class:`~gnnio.features.base.TierCounters`) counts every requested row:
the rows served from the buffer under ``tier`` (e.g. ``"gpu_cache"``), the unique misses under the
tiers ``backing`` served them from (so stacked caches report every level). A repeat of a missed id
inside one batch is not fetched twice: it is counted under ``tier`` (it is served from the row
already brought to the cache's device). ``stats`` (:class:`CacheStats`) counts queries, unique
queries, hits, misses, insertions, evictions, bytes fetched from the backing store, and times the
*cache management* (dedup, lookup, bookkeeping, victim selection) apart from the *data movement*
(reading hit rows, the backing gather, writing output and buffer rows). On a CUDA device the two
phases are timed with CUDA events on the current stream (no device-wide synchronisation, so the
loader's copies and training keep overlapping; see :class:`~gnnio.features.accounting.EventLaps`).

Threads: ``gather`` calls take turns (a lock; on a GPU from one CUDA stream); lookahead: one thread.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import cast

import numpy as np
import torch

from ...utils.devices import resolve_device
from .._gather import output_rows
from ..accounting import CacheStats, _Timer
from ..base import BatchCount, FeatureStore
from ..batch_ops import FirstOccurrence, ids_on, move_rows
from . import nosync, nosync_lookahead
from .lookahead import LookaheadPolicy, make_any_policy
from .policy import (
    POLICIES,
    CachePolicy,
    FIFOPolicy,
    LFUPolicy,
    LRUPolicy,
    StaticPolicy,
    make_policy,
)

__all__ = [
    "POLICIES", "CachePolicy", "CacheStats", "FIFOPolicy", "FeatureCache", "LFUPolicy",
    "LRUPolicy", "LookaheadPolicy", "StaticPolicy", "capacity_rows", "make_policy", "move_rows",
    "static_plus_dynamic", "two_level_cache",
]  # fmt: skip


def capacity_rows(size: float | int, num_rows: int) -> int:
    """Cache capacity in rows: ``size`` < 1 (a float) is a fraction of ``num_rows``, converted by
    :func:`gnnio.utils.counts.top_count` (nearest count, halves up, at least 1 for a positive
    fraction), otherwise a row count; the result is clipped to ``[0, num_rows]``."""
    if isinstance(size, float) and not 0.0 <= size < float("inf"):  # (NaN too)
        raise ValueError(f"cache size must be >= 0 and finite, got {size}")
    if isinstance(size, float) and size < 1.0:
        from ...utils.counts import top_count

        rows = top_count(size, num_rows)
    else:
        rows = int(size)
        if rows < 0:
            raise ValueError(f"cache size must be >= 0, got {size}")
    return min(rows, int(num_rows))


def _host_ids(ids, idx: torch.Tensor) -> bool:
    """``ids`` a host tensor that :func:`ids_on` gave as another tensor ``idx`` (a device copy,
    or on the CPU a view of the same memory: comparing the two cannot show an in-place change)."""
    return isinstance(ids, torch.Tensor) and ids.device.type == "cpu" and idx is not ids


# ---- the cache -------------------------------------------------------------------------------


class FeatureCache(FeatureStore):
    """A cache of ``capacity`` feature rows on ``device`` in front of ``backing``.

    Args:
        backing: the store the misses come from (any :class:`FeatureStore`, also another cache).
        capacity: rows the cache holds (clipped to ``[0, backing.num_rows]``); see
            :func:`capacity_rows` for fractions.
        policy: ``"static"``, ``"fifo"``, ``"lru"``, ``"lfu"`` (see module docstring), or
            ``"lookahead"`` / ``"optimal"`` (:mod:`gnnio.features.caches.lookahead`: Belady's MIN
            over the batches announced with :meth:`announce`).
        hot_ids: for ``"static"``: global ids, hottest first (e.g. ``np.argsort(-score)``); the
            first ``capacity`` are loaded once from the bottom store of the stack at construction.
            For ``"lookahead"`` / ``"optimal"``: the fallback's tie-break and the static part.
        lookahead: ``"lookahead"``'s window K, in batches (the loader announces that many ahead).
        static_capacity: ``"lookahead"`` / ``"optimal"``: rows pinned to the top ``hot_ids``.
        device: where the buffer, the maps and the returned rows live (default: ``backing.device``).
        tier: the counter name of rows served from the buffer (default ``"gpu_cache"`` on a GPU,
            else ``"cache"``).
        timing: measure management and copy time per batch (CUDA events on a GPU).
        sync_free: run the batch without host synchronisations
            (:mod:`gnnio.features.caches.nosync`: FIFO and static;
            :mod:`gnnio.features.caches.nosync_lookahead`: lookahead and optimal). Default: on a
            GPU.
    """

    def __init__(
        self,
        backing: FeatureStore,
        capacity: int,
        policy: str = "fifo",
        hot_ids=None,
        device: str | torch.device | None = None,
        tier: str | None = None,
        timing: bool = True,
        lookahead: int = 8,
        static_capacity: int = 0,
        sync_free: bool | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(backing, FeatureStore):
            raise TypeError(f"backing must be a FeatureStore, got {type(backing).__name__}")
        self.backing = backing
        self.num_rows, self.dim, self.dtype = backing.num_rows, backing.dim, backing.dtype
        self.device = resolve_device(device) if device is not None else backing.device
        self.tier = tier or ("gpu_cache" if self.device.type == "cuda" else "cache")
        self.timing = bool(timing)
        cap = capacity_rows(capacity, self.num_rows) if capacity else 0
        self.policy = make_any_policy(
            policy, cap, self.num_rows, self.device, hot_ids, lookahead, static_capacity
        )
        self.capacity = self.policy.capacity
        # one sentinel row past the end takes the sync-free path's masked-off writes
        self._buffer_ext = torch.empty(
            (self.capacity + 1, self.dim), dtype=self.dtype, device=self.device
        )
        self.buffer = self._buffer_ext[: self.capacity]
        nosync_ok = self.policy.name in ("fifo", "static", "lookahead", "optimal")
        if sync_free and not nosync_ok:
            raise ValueError(f"sync_free: FIFO, static, lookahead caches, not {self.policy.name}")
        self.sync_free = nosync_ok if sync_free is None and self.device.type == "cuda" else bool(
            sync_free
        )  # fmt: skip
        if self.sync_free and isinstance(self.policy, LookaheadPolicy):
            self.policy.use_kernels = False  # (the kernels' slot ranks are not kept there)
        self.stats = CacheStats()
        self._dedup = FirstOccurrence(self.num_rows, self.device) if self.policy.dynamic else None
        self._clock = 0
        self._clock_dev: torch.Tensor | None = None  # the sync-free path's ticks, on the device
        # the Triton batch's scratch counts and a view of one of them (_triton_cache)
        self._fused_scr: torch.Tensor | None = None
        self._fused_dummy: torch.Tensor | None = None
        self._row_bytes = super().row_bytes
        self._lock = threading.Lock()
        # announced batches not served yet: (the ids object, validated ids, unique, inverse)
        self._announced: deque[tuple] = deque()
        if self.policy.filled:  # a static set, or a lookahead cache's static part / warm start
            f = self.policy.filled
            rows = self.root.gather(self.policy.key_of[:f].cpu())
            self.buffer[:f].copy_(rows.to(self.device))

    @property
    def row_bytes(self) -> int:
        return self._row_bytes  # (read several times a batch: computed once)

    @property
    def root(self) -> FeatureStore:
        """The store at the bottom of the stack (what a static part is loaded from)."""
        s: FeatureStore = self.backing
        while isinstance(s, FeatureCache):
            s = s.backing
        return s

    def __repr__(self) -> str:
        return (
            f"FeatureCache({self.policy.name}, capacity={self.capacity}/{self.num_rows}, "
            f"device={self.device}, tier={self.tier!r}, backing={self.backing!r})"
        )

    def nbytes(self) -> int:
        """Bytes held by the cache (buffer, maps, policy arrays, dedup scratch)."""
        n = self.buffer.numel() * self.buffer.element_size() + self.policy.nbytes()
        return n + (self._dedup.nbytes() if self._dedup is not None else 0)

    def reset_stats(self) -> None:
        """Zero ``stats`` and ``counters`` (not the cache contents)."""
        self.stats.reset()
        self.counters.reset()

    def state_dict(self) -> dict:
        """The contents that change results (hits, so bytes per tier) of a *dynamic* cache: the
        policy's maps and cursors and the clock; the rows themselves are not saved, they are read
        back from the bottom store on load. Empty for a static cache (it never changes)."""
        if not self.policy.dynamic:
            return {}
        with self._lock:
            self._fold_clock()
            return {"policy": self.policy.name, "clock": int(self._clock),
                    "maps": self.policy.state_dict()}  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`; the cached rows are gathered again from :attr:`root`."""
        if not state:
            return
        if state.get("policy") != self.policy.name:
            raise ValueError(
                f"cache state: a {state.get('policy')} cache's, this cache is {self.policy.name}"
            )
        with self._lock:
            self.policy.load_state_dict(state["maps"])
            self._clock, self._clock_dev = int(state["clock"]), None
            slots = torch.nonzero(self.policy.key_of >= 0).flatten()
            if slots.numel():
                keys = self.policy.key_of.index_select(0, slots)
                rows = self.root.gather(keys.to(self.root.device)).to(self.device)
                self.buffer.index_copy_(0, slots.to(self.device), rows)

    def _fold_clock(self) -> None:
        if self._clock_dev is not None:
            self._clock += int(self._clock_dev)
            self._clock_dev = None

    @property
    def lookahead(self) -> int:
        """Batches the loader should :meth:`announce` ahead (0 unless the policy looks ahead)."""
        pol = self.policy
        return int(pol.lookahead or 0) if isinstance(pol, LookaheadPolicy) else 0

    def announce(self, ids) -> None:
        """Tell a ``lookahead`` / ``optimal`` cache the ids of the next batch it will serve not
        yet announced (any order, repeats allowed; batches in serving order). Ignored by the
        other policies."""
        if not isinstance(self.policy, LookaheadPolicy):
            return
        idx = ids_on(self, ids, self.device)
        # host ids: gather() checks them against a copy (idx: on a GPU a read back; CPU: shared)
        ref = ids.clone() if _host_ids(ids, idx) else None
        with self._lock:
            if self.sync_free:  # padded: the unique count stays on the device
                pre = nosync_lookahead.dedup_and_announce(self, idx)
                self._announced.append((ids, idx, pre, ref))
                return
            fused = self.policy.announce_ids(idx)  # CPU kernels: dedup in the same pass
            if fused is None:
                uniq, inv = cast(FirstOccurrence, self._dedup)(idx)  # (a dynamic policy's)
                self.policy.announce(uniq)
            else:
                uniq, inv = fused
            # kept for gather() of the same ids: validated and deduplicated once, not twice
            self._announced.append((ids, idx, (uniq, inv), ref))

    def reset_window(self) -> None:
        """Forget announced batches that will not be served (an epoch closed early)."""
        if isinstance(self.policy, LookaheadPolicy):
            with self._lock:
                self.policy.reset_window()
                self._announced.clear()

    def _take_announced(self, ids) -> tuple | None:
        """``(idx, dedup)`` computed when ``ids`` (this very object, unchanged) was announced as
        the next batch (``dedup``: ``(unique, inverse)``, or the sync-free path's padded dedup);
        None otherwise. Drops the oldest announcement either way
        (it is this batch's, or the policy refuses the batch)."""
        if not self._announced:
            return None
        obj, idx, dedup, ref = self._announced.popleft()
        if obj is not ids or not isinstance(ids, torch.Tensor) or ids.dtype != idx.dtype:
            return None
        if idx is ids:  # (ids on the device as they came: the same tensor, nothing to compare)
            return idx, dedup
        if ref is not None:  # host ids: compared on the host with their copy at announce()
            return (idx, dedup) if torch.equal(ids, ref) else None
        if ids.device != idx.device or not torch.equal(ids, idx):  # changed in place since
            return None
        return idx, dedup

    def cached_ids(self) -> torch.Tensor:
        """The global ids cached now (int64, slot order)."""
        k = self.policy.key_of
        return k[k >= 0]

    def gather(self, ids, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rows ``ids`` (global ids, any order, repeats allowed) as ``[len(ids), dim]`` on
        ``self.device``; see the module docstring for what changes in the cache."""
        pre = None
        if self._announced:
            with self._lock:
                pre = self._take_announced(ids)
        idx = ids_on(self, ids, self.device) if pre is None else pre[0]
        n = int(idx.numel())
        dst = output_rows(out, n, self.dim, self.dtype, self.device)
        if n == 0:
            return dst
        with self._lock:
            if self.sync_free:
                timer = _Timer(self.device, self.timing, self.stats.laps)
                if isinstance(self.policy, LookaheadPolicy):
                    nosync_lookahead.gather_lookahead(self, idx, dst, timer, pre and pre[1])
                else:
                    run = nosync.gather_fifo if self.policy.dynamic else nosync.gather_static
                    run(self, idx, dst, timer)
            elif self.policy.dynamic:
                self._gather_dynamic(idx, dst, None if pre is None else pre[1])
            else:
                self._gather_static(idx, dst)
        return dst

    def _fetch(self, miss_ids: torch.Tensor) -> tuple[torch.Tensor, BatchCount]:
        """One backing gather of ``miss_ids``; rows on this device and rows per backing tier."""
        with self.backing.counters.counting() as below:  # this thread's rows only; no device wait
            rows = self.backing.gather(miss_ids.to(self.backing.device))
        return rows.to(self.device), below

    def _count(self, served_here: int, below: BatchCount | None) -> None:
        if served_here:
            self.counters.add(self.tier, served_here, self.row_bytes)
        if below is not None:
            self.counters.add_count(below, self.row_bytes)

    def _gather_static(self, idx: torch.Tensor, dst: torch.Tensor) -> None:
        timer = _Timer(self.device, self.timing, self.stats.laps)
        slots = self.policy.lookup(idx)
        hit = slots >= 0
        hit_pos = torch.nonzero(hit).flatten()
        miss_pos = torch.nonzero(~hit).flatten()
        manage = timer.lap("manage")
        move_rows(self.buffer, slots.index_select(0, hit_pos), dst, hit_pos)
        below = None
        if miss_pos.numel():
            rows, below = self._fetch(idx.index_select(0, miss_pos))
            move_rows(rows, torch.arange(rows.shape[0], device=self.device), dst, miss_pos)
        copy = timer.lap("copy")
        n, h = int(idx.numel()), int(hit_pos.numel())
        self._count(h, below)
        self.stats._record(n, n, h, n - h, 0, 0, self.row_bytes, manage, copy)

    def _gather_dynamic(self, idx: torch.Tensor, dst: torch.Tensor, dedup=None) -> None:
        timer = _Timer(self.device, self.timing, self.stats.laps)
        pol = self.policy
        uniq, inv = cast(FirstOccurrence, self._dedup)(idx) if dedup is None else dedup
        u = int(uniq.numel())
        if isinstance(pol, LookaheadPolicy):
            pol.begin_batch(uniq)
        slots = pol.lookup(uniq)
        hit = slots >= 0
        hit_u = torch.nonzero(hit).flatten()
        miss_u = torch.nonzero(~hit).flatten()
        if pol.uses_ticks:
            ticks = self._clock + torch.arange(u, device=self.device)
            pol.touch(slots.index_select(0, hit_u), ticks.index_select(0, hit_u))
            miss_ticks = ticks.index_select(0, miss_u)
        else:
            miss_ticks = miss_u  # unused by the policy
        self._clock += u
        if inv is None:  # no repeats: output row i is unique id i
            hit_rows, miss_rows, miss_src = hit_u, miss_u, None
            hit_slots = slots.index_select(0, hit_u)
        else:
            slot_r = slots.index_select(0, inv)
            hit_rows = torch.nonzero(slot_r >= 0).flatten()
            miss_rows = torch.nonzero(slot_r < 0).flatten()
            hit_slots = slot_r.index_select(0, hit_rows)
            miss_index = torch.full((u,), -1, dtype=torch.int64, device=self.device)
            miss_index.index_copy_(0, miss_u, torch.arange(miss_u.numel(), device=self.device))
            miss_src = miss_index.index_select(0, inv.index_select(0, miss_rows))
        miss_ids = uniq.index_select(0, miss_u)
        manage = timer.lap("manage")

        move_rows(self.buffer, hit_slots, dst, hit_rows)
        m = int(miss_ids.numel())
        below = fetched = None
        if m:
            fetched, below = self._fetch(miss_ids)
            src = torch.arange(m, device=self.device) if miss_src is None else miss_src
            move_rows(fetched, src, dst, miss_rows)
        copy = timer.lap("copy")

        slots_w, pos_w, evicted = pol.admit(miss_ids, miss_ticks)
        manage += timer.lap("manage")
        if slots_w.numel():  # (rows admitted: some missed, m > 0, fetched is set)
            if slots_w.numel() == m and self.device.type != "cpu":
                self.buffer.index_copy_(0, slots_w, cast(torch.Tensor, fetched))
            else:
                move_rows(cast(torch.Tensor, fetched), pos_w, self.buffer, slots_w)
        copy += timer.lap("copy")

        n, h = int(idx.numel()), int(hit_u.numel())
        self._count(n - m, below)
        self.stats._record(n, u, h, m, int(slots_w.numel()), evicted, self.row_bytes, manage, copy)


# ---- compositions ----------------------------------------------------------------------------


def static_plus_dynamic(
    backing: FeatureStore,
    static_capacity: int,
    dynamic_capacity: int,
    hot_ids,
    policy: str = "fifo",
    device: str | torch.device | None = None,
    timing: bool = True,
) -> FeatureCache:
    """A static hot part in front of a dynamic cache: ``FeatureCache(static)`` over
    ``FeatureCache(policy)`` over ``backing``. The dynamic part only ever sees the ids the static
    part does not hold, so no row is cached twice. Tiers: ``"static_cache"``, ``"dynamic_cache"``."""
    dyn = FeatureCache(
        backing, dynamic_capacity, policy, device=device, tier="dynamic_cache", timing=timing
    )
    return FeatureCache(
        dyn,
        static_capacity,
        "static",
        hot_ids=hot_ids,
        device=device,
        tier="static_cache",
        timing=timing,
    )


def two_level_cache(
    backing: FeatureStore,
    gpu_capacity: int,
    cpu_capacity: int,
    policy: str = "fifo",
    gpu_device: str | torch.device | None = None,
    hot_ids=None,
    timing: bool = True,
) -> FeatureCache:
    """BGL's two-level cache: a cache on the GPU (``gpu_device``; None = simulated, in CPU memory)
    over a cache in host memory over ``backing``; both use ``policy`` ("the CPU cache uses the
    same cache policy as the GPU cache", BGL §3.2.3). Tiers: ``"gpu_cache"``, ``"cpu_cache"``.
    With ``policy="static"`` the GPU keeps the hottest ``gpu_capacity`` of ``hot_ids`` and the CPU
    the next ``cpu_capacity`` (no row twice)."""
    cpu_hot = hot_ids
    if policy == "static" and hot_ids is not None:
        cpu_hot = np.asarray(hot_ids)[capacity_rows(gpu_capacity, backing.num_rows) :]
    cpu = FeatureCache(
        backing,
        cpu_capacity,
        policy,
        hot_ids=cpu_hot,
        device="cpu",
        tier="cpu_cache",
        timing=timing,
    )
    return FeatureCache(
        cpu,
        gpu_capacity,
        policy,
        hot_ids=hot_ids,
        device=gpu_device or "cpu",
        tier="gpu_cache",
        timing=timing,
    )
