"""BGL's multi-GPU feature cache (§3.2.3): one cache per GPU, node ``v`` cached only by GPU
``v mod S``, peers read over NVLink; misses come from the store below (e.g. a CPU cache).

Each of the ``S`` *shards* is a cache map + buffer managed by one policy
(:mod:`gnnio.features.caches.cache`; BGL uses FIFO). Shard ``k`` owns the ids ``v`` with ``v % S == k``
and keys them by ``v // S``, so its dense map has ``ceil(N / S)`` entries. Because only the owner
ever inserts ``v``, **a row is never stored twice across shards** (BGL: "no duplicated entries
among all GPU cache buffers").

One :class:`ShardedFeatureCache` serves one reading GPU; :meth:`ShardedFeatureCache.for_reader`
makes the stores of the other GPUs, sharing the shards (data-parallel training runs one per GPU).
Readers run concurrently; concurrent ``gather`` calls on one reader are serialized by its lock.
A batch (see :mod:`gnnio.features.caches.cache` for the per-shard batch semantics):

1. dedup (first occurrence), split the unique ids by owner (BGL's dispatching threads, "mod
   operation");
2. per shard, under that shard's lock: look up, update the policy for hits, read the hit rows
   (tier ``"local"`` for the reader's own shard, ``"peer"`` for the others);
3. fetch every shard's misses from ``backing`` in one ``gather`` (counted under its tiers: the
   rows this reader's thread fetched, :meth:`~gnnio.features.base.TierCounters.counting`, so
   readers fetch at once and each books only its own rows);
4. per shard, under its lock: admit its own misses (ids another reader inserted meanwhile are
   skipped -- BGL queues all operations of one GPU cache on one thread for the same reason).

The shards share one clock, so a policy's recency ticks are comparable across readers.

Deviations from BGL's text: BGL orders "all the operations towards a given GPU cache" through one
queue polled by one thread; here a lock per shard orders the same operations (a batch's lookup +
hit read, later its admission + write), so a miss another reader admits between the two counts as
a miss, not a hit, and is not admitted twice. A hit is a unique id of the batch found in any shard
(BGL §3.2.1: "hit nodes in total number of nodes in a batch"), for ``static`` too (a single
:class:`~gnnio.features.caches.cache.FeatureCache` with ``static`` counts rows, repeats included).

Simulated devices: with ``devices=None`` every shard lives in CPU memory; the routing, copies and
counting are the same, only no bytes cross real links (turn counted bytes per link into modeled
time with a :class:`~gnnio.placement.topology.Topology`). With real devices, shard ``k`` lives on
``devices[k]`` and peer rows are copied device to device.
"""

from __future__ import annotations

import threading

import torch

from ...utils.devices import resolve_device
from .._gather import output_rows
from ..accounting import CacheStats, _Timer
from ..base import FeatureStore, TierCounters
from ..batch_ops import FirstOccurrence, ids_on, move_rows
from .cache import FeatureCache, capacity_rows
from .policy import hot_key_array, make_policy

__all__ = ["ShardedFeatureCache"]


class _Shard:
    """One GPU's cache: a policy over local keys ``id // S`` and its row buffer."""

    def __init__(self, k, num_shards, num_rows, capacity, policy, hot_ids, device, dim, dtype):
        self.k = k
        self.device = device
        nkeys = (num_rows - k + num_shards - 1) // num_shards
        hot = None
        if hot_ids is not None:
            h = hot_key_array(hot_ids)
            bad = h[(h < 0) | (h >= num_rows)]
            if bad.size:  # (a shard's key ``id // S`` would name no id the caller passed)
                raise ValueError(f"hot_ids: node id {int(bad[0])} out of [0, {num_rows})")
            hot = h[h % num_shards == k] // num_shards
        self.policy = make_policy(policy, capacity, nkeys, device, hot_keys=hot)
        self.buffer = torch.empty((self.policy.capacity, dim), dtype=dtype, device=device)
        self.lock = threading.Lock()

    def global_ids(self, num_shards: int) -> torch.Tensor:
        keys = self.policy.key_of
        return keys[keys >= 0] * num_shards + self.k


class _Shared:
    def __init__(self, backing, num_shards, capacity, policy, hot_ids, devices):
        self.num_shards = num_shards
        self.devices = devices
        self.shards = [
            _Shard(
                k,
                num_shards,
                backing.num_rows,
                capacity,
                policy,
                hot_ids,
                devices[k],
                backing.dim,
                backing.dtype,
            )
            for k in range(num_shards)
        ]
        self.clock = 0
        self.clock_lock = threading.Lock()
        if not self.shards[0].policy.dynamic:  # static: load every shard's rows once
            root = backing
            while isinstance(root, FeatureCache):
                root = root.backing
            for sh in self.shards:
                if sh.policy.capacity:
                    rows = root.gather(sh.global_ids(num_shards).cpu())
                    sh.buffer.copy_(rows.to(sh.device))

    def ticks(self, count: int, device) -> torch.Tensor:
        with self.clock_lock:
            t0 = self.clock
            self.clock += count
        return t0 + torch.arange(count, device=device)


class ShardedFeatureCache(FeatureStore):
    """A cache sharded over ``num_shards`` GPUs by ``id mod num_shards`` (module docstring).

    Args:
        backing: the store below (host memory, a CPU cache, ...), shared by all readers.
        num_shards: number of GPUs S.
        capacity: rows per shard (an int, or a float < 1 = fraction of ``num_rows`` per shard).
        policy: one of ``static``, ``fifo``, ``lru``, ``lfu``.
        hot_ids: for ``static``: global ids, hottest first; shard ``k`` keeps the first
            ``capacity`` of those it owns.
        reader: the GPU this store gathers for.
        devices: one torch device per shard; None = simulated (all in CPU memory).
        timing: time management apart from data movement (CUDA events on a GPU).

    Attributes:
        counters: rows/bytes per tier: ``"local"``, ``"peer"`` and the tiers of ``backing``.
        shard_counters: rows/bytes per shard read (``"gpu0"``, ``"gpu1"``, ...).
        stats: a :class:`~gnnio.features.caches.cache.CacheStats` of this reader (all shards together).
    """

    def __init__(
        self,
        backing: FeatureStore,
        num_shards: int,
        capacity: int | float,
        policy: str = "fifo",
        hot_ids=None,
        reader: int = 0,
        devices: list[str | torch.device] | None = None,
        timing: bool = True,
        _shared: _Shared | None = None,
    ) -> None:
        super().__init__()
        if int(num_shards) < 1:
            raise ValueError(f"num_shards must be >= 1, got {num_shards}")
        if not 0 <= int(reader) < int(num_shards):
            raise ValueError(f"reader {reader} out of range [0, {num_shards})")
        if _shared is None:
            devs = (
                [torch.device("cpu")] * int(num_shards)
                if devices is None
                else [resolve_device(d) for d in devices]
            )
            if len(devs) != int(num_shards):
                raise ValueError(f"devices: need {num_shards} devices, got {len(devs)}")
            cap = capacity_rows(capacity, backing.num_rows) if capacity else 0
            _shared = _Shared(backing, int(num_shards), cap, policy, hot_ids, devs)
        self._s = _shared
        self.backing = backing
        self.num_shards = int(num_shards)
        self.reader = int(reader)
        self.device = _shared.devices[self.reader]
        self.num_rows, self.dim, self.dtype = backing.num_rows, backing.dim, backing.dtype
        self.timing = bool(timing)
        self.shard_counters = TierCounters()
        self.stats = CacheStats()
        self._dedup = FirstOccurrence(self.num_rows, self.device)
        # one gather of this reader at a time (its dedup scratch, stats and counters are its own;
        # two threads sharing one reader got wrong rows); other readers are not held up
        self._lock = threading.Lock()

    def for_reader(self, reader: int) -> ShardedFeatureCache:
        """The store of another GPU, sharing the shards (own counters, stats and dedup array)."""
        return ShardedFeatureCache(
            self.backing, self.num_shards, 0, reader=reader, timing=self.timing, _shared=self._s
        )

    @property
    def shards(self) -> list[_Shard]:
        return self._s.shards

    def cached_ids(self) -> list[torch.Tensor]:
        """Global ids held by each shard (int64, slot order)."""
        return [sh.global_ids(self.num_shards) for sh in self._s.shards]

    def reset_stats(self) -> None:
        self.stats.reset()
        self.counters.reset()
        self.shard_counters.reset()

    def __repr__(self) -> str:
        sh = self._s.shards[0]
        return (
            f"ShardedFeatureCache({sh.policy.name}, shards={self.num_shards}, "
            f"capacity/shard={sh.policy.capacity}, reader={self.reader}, backing={self.backing!r})"
        )

    def gather(self, ids, out: torch.Tensor | None = None) -> torch.Tensor:
        idx = ids_on(self, ids, self.device)
        n = int(idx.numel())
        dst = output_rows(out, n, self.dim, self.dtype, self.device)
        if n:
            with self._lock:
                self._gather(idx, dst)
        return dst

    def _gather(self, idx: torch.Tensor, dst: torch.Tensor) -> None:
        timer = _Timer(self.device, self.timing, self.stats.laps)
        s, rb = self.num_shards, self.row_bytes
        uniq, inv = self._dedup(idx)
        u = int(uniq.numel())
        rows_u = (
            dst if inv is None else torch.empty((u, self.dim), dtype=self.dtype, device=self.device)
        )
        ticks = self._s.ticks(u, self.device)
        owner = uniq % s
        local = uniq // s
        manage = timer.lap("manage")
        copy = 0.0
        miss_parts, hits_by_shard = [], []
        for k, sh in enumerate(self._s.shards):
            t = _Timer(self.device, self.timing, self.stats.laps)
            sel = torch.nonzero(owner == k).flatten()
            keys = local.index_select(0, sel).to(sh.device)
            with sh.lock:
                slots = sh.policy.lookup(keys)
                hit = slots >= 0
                hit_i = torch.nonzero(hit).flatten()
                if sh.policy.dynamic and hit_i.numel():
                    sh.policy.touch(
                        slots.index_select(0, hit_i),
                        ticks.index_select(0, sel.index_select(0, hit_i.to(sel.device))).to(
                            sh.device
                        ),
                    )
                manage += t.lap("manage")
                move_rows(
                    sh.buffer,
                    slots.index_select(0, hit_i),
                    rows_u,
                    sel.index_select(0, hit_i.to(sel.device)),
                )
                copy += t.lap("copy")
            miss_parts.append(sel[~hit.to(sel.device)])
            hits_by_shard.append(int(hit_i.numel()))
        miss_pos = torch.cat(miss_parts) if miss_parts else uniq[:0]
        miss_ids = uniq.index_select(0, miss_pos)
        m = int(miss_ids.numel())
        t = _Timer(self.device, self.timing, self.stats.laps)
        below = None
        fetched = None
        if m:
            with self.backing.counters.counting() as below:  # this reader's rows only, no wait
                fetched = self.backing.gather(miss_ids.to(self.backing.device))
            fetched = fetched.to(self.device)
            move_rows(fetched, torch.arange(m, device=self.device), rows_u, miss_pos)
        copy += t.lap("copy")
        ins = ev = 0
        if m:
            miss_owner = owner.index_select(0, miss_pos)
            for k, sh in enumerate(self._s.shards):
                if not sh.policy.dynamic or sh.policy.capacity == 0:
                    continue
                t = _Timer(self.device, self.timing, self.stats.laps)
                part = torch.nonzero(miss_owner == k).flatten()
                if part.numel() == 0:
                    continue
                keys = (miss_ids.index_select(0, part) // s).to(sh.device)
                kt = ticks.index_select(0, miss_pos.index_select(0, part)).to(sh.device)
                with sh.lock:
                    slots_w, pos_w, evicted = sh.policy.admit(keys, kt, check_present=True)
                    manage += t.lap("manage")
                    src = part.index_select(0, pos_w.to(part.device))
                    assert fetched is not None  # (a shard's misses: some rows were fetched)
                    move_rows(fetched, src, sh.buffer, slots_w)
                    copy += t.lap("copy")
                ins += int(slots_w.numel())
                ev += evicted
        t = _Timer(self.device, self.timing, self.stats.laps)
        if inv is not None:
            move_rows(rows_u, inv, dst, None)
        copy += t.lap("copy")

        n = int(idx.numel())
        h_local = hits_by_shard[self.reader]
        h_peer = sum(hits_by_shard) - h_local
        if n - m - h_peer:  # local hits + repeats served on this device
            self.counters.add("local", n - m - h_peer, rb)
        if h_peer:
            self.counters.add("peer", h_peer, rb)
        if below is not None:
            self.counters.add_count(below, rb)
        for k, h in enumerate(hits_by_shard):
            if h:
                self.shard_counters.add(f"gpu{k}", h, rb)
        self.stats._record(n, u, u - m, m, ins, ev, rb, manage, copy)
