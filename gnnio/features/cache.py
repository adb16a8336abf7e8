"""Feature caches: wrappers over any :class:`~gnnio.features.base.FeatureStore` that keep some rows
on the cache's device, with the policies static, FIFO, LRU and LFU (BGL §3.2.1, PaGraph).

A cache is a feature store (composition, as GraphBolt's ``GPUCachedFeature(fallback, cache)``):
``FeatureCache(backing, capacity, policy)`` serves the rows it holds from its buffer and fetches
the others from ``backing`` in *one* ``gather``. Caches stack: a GPU cache over a CPU cache over a
memory-mapped store is ``FeatureCache(FeatureCache(mmap, c2, "fifo"), c1, "fifo", device="cuda")``
(:func:`two_level_cache`); a static hot part in front of a dynamic one is
:func:`static_plus_dynamic`. The multi-GPU cache sharded by ``id mod #GPUs`` is in
:mod:`gnnio.features.cache_multi`.

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
timers synchronize the device when ``timing=True``.

Not thread-safe per reader; one internal lock serializes concurrent ``gather`` calls.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np
import torch

from ._gather import HAVE_NUMBA, as_index_array, output_rows
from .base import FeatureStore

__all__ = [
    "POLICIES",
    "CachePolicy",
    "CacheStats",
    "FIFOPolicy",
    "FeatureCache",
    "LFUPolicy",
    "LRUPolicy",
    "StaticPolicy",
    "capacity_rows",
    "make_policy",
    "move_rows",
    "static_plus_dynamic",
    "two_level_cache",
]

#: policy names accepted by :class:`FeatureCache` and :func:`make_policy`
POLICIES = ("static", "fifo", "lru", "lfu")

_I32_MAX = 2**31 - 1


def capacity_rows(size: float | int, num_rows: int) -> int:
    """Cache capacity in rows: ``size`` < 1 (a float) is a fraction of ``num_rows``, converted by
    :func:`gnnio.utils.counts.top_count` (nearest count, halves up, at least 1 for a positive
    fraction), otherwise a row count; the result is clipped to ``[0, num_rows]``."""
    if isinstance(size, float) and size < 1.0:
        if size < 0:
            raise ValueError(f"cache size must be >= 0, got {size}")
        from ..utils.counts import top_count

        rows = top_count(size, num_rows)
    else:
        rows = int(size)
        if rows < 0:
            raise ValueError(f"cache size must be >= 0, got {size}")
    return min(rows, int(num_rows))


def _map_dtype(n: int) -> torch.dtype:
    return torch.int32 if n < _I32_MAX else torch.int64


# ---- policies: bookkeeping only (which key lives in which slot), no feature rows ----------------


class CachePolicy(ABC):
    """Which keys occupy the ``capacity`` slots of a cache, and whom to evict.

    Keys are ints in ``[0, num_keys)`` (global ids for :class:`FeatureCache`; ``id // S`` in shard
    ``id % S`` of a sharded cache). Tensors live on ``device``. See the module docstring for the
    batch semantics the methods implement.

    Attributes:
        slot_of: int32/int64 ``[num_keys]``, the slot holding each key or -1 (the dense hash map).
        key_of: int64 ``[capacity]``, the key in each slot or -1 (empty).
        filled: slots ``[0, filled)`` have held a key (slots are never emptied again).
    """

    name = "?"
    dynamic = True
    uses_ticks = False  # whether touch/admit read the ticks (LRU, LFU)

    def __init__(self, capacity: int, num_keys: int, device: str | torch.device = "cpu"):
        if capacity < 0 or num_keys < 0:
            raise ValueError(f"capacity and num_keys must be >= 0, got {capacity}, {num_keys}")
        self.capacity = int(min(capacity, num_keys))
        self.num_keys = int(num_keys)
        self.device = torch.device(device)
        self.slot_of = torch.full((num_keys,), -1, dtype=_map_dtype(self.capacity), device=device)
        self.key_of = torch.full((self.capacity,), -1, dtype=torch.int64, device=device)
        self.filled = 0

    def lookup(self, keys: torch.Tensor) -> torch.Tensor:
        """int64 slots of ``keys`` (int64 on ``device``), -1 where absent."""
        return self.slot_of.index_select(0, keys).long()

    def touch(self, slots: torch.Tensor, ticks: torch.Tensor) -> None:  # noqa: B027 - no-op default
        """Record hits on ``slots`` at ``ticks`` (int64, same length); FIFO and static ignore them."""

    @abstractmethod
    def _victims(self, count: int) -> torch.Tensor:
        """``count`` (<= capacity) slots to fill: empty ones first, then per policy."""

    def _on_insert(self, slots: torch.Tensor, ticks: torch.Tensor) -> None:  # noqa: B027
        """Policy metadata of freshly inserted entries (none for FIFO)."""

    def admit(
        self, keys: torch.Tensor, ticks: torch.Tensor, check_present: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Insert missed ``keys`` (unique, int64, in order) with their ``ticks``.

        Only the last ``capacity`` keys are inserted. With ``check_present`` keys found present
        (another reader inserted them since its lookup) are skipped first.

        Returns:
            ``(slots, pos, evicted)``: ``keys[pos[k]]`` was written to ``slots[k]``; ``evicted`` =
            entries pushed out.
        """
        dev = self.device
        if not self.dynamic or self.capacity == 0 or keys.numel() == 0:
            none = torch.empty(0, dtype=torch.int64, device=dev)
            return none, none, 0
        m = int(keys.numel())
        if check_present:
            pos = torch.nonzero(self.lookup(keys) < 0).flatten()
            if pos.numel() > self.capacity:
                pos = pos[-self.capacity :]
            keys, ticks = keys.index_select(0, pos), ticks.index_select(0, pos)
        else:
            first = max(0, m - self.capacity)
            pos = torch.arange(first, m, device=dev)
            keys, ticks = keys[first:], ticks[first:]
        if keys.numel() == 0:
            return pos, pos, 0
        slots = self._victims(int(keys.numel()))
        old = self.key_of.index_select(0, slots)
        gone = old[old >= 0]
        if gone.numel():
            self.slot_of.index_fill_(0, gone, -1)
        self.key_of.index_copy_(0, slots, keys)
        self.slot_of.index_copy_(0, keys, slots.to(self.slot_of.dtype))
        self._on_insert(slots, ticks)
        return slots, pos, int(gone.numel())

    def _take_empty(self, count: int) -> tuple[torch.Tensor, int]:
        """Up to ``count`` never-used slots (lowest first) and how many more are needed."""
        e = min(count, self.capacity - self.filled)
        slots = torch.arange(self.filled, self.filled + e, device=self.device)
        self.filled += e
        return slots, count - e

    def size(self) -> int:
        """Number of cached keys."""
        return self.filled

    def nbytes(self) -> int:
        """Bytes held by the policy's tensors (constant after construction)."""
        return sum(t.numel() * t.element_size() for t in self._tensors())

    def _tensors(self) -> list[torch.Tensor]:
        return [self.slot_of, self.key_of]


class StaticPolicy(CachePolicy):
    """A fixed set of keys (e.g. the hottest by a score), never replaced (PaGraph's static cache)."""

    name = "static"
    dynamic = False

    def __init__(self, keys, num_keys: int, device: str | torch.device = "cpu"):
        keys = torch.from_numpy(np.array(keys, dtype=np.int64).reshape(-1)).to(device)
        super().__init__(int(keys.numel()), num_keys, device)
        if keys.numel():
            lo, hi = int(keys.min()), int(keys.max())
            if lo < 0 or hi >= num_keys:
                raise ValueError(f"static cache key {lo if lo < 0 else hi} out of [0, {num_keys})")
            if torch.unique(keys).numel() != keys.numel():
                raise ValueError("static cache keys contain duplicates")
        slots = torch.arange(self.capacity, device=self.device)
        self.key_of.copy_(keys)
        self.slot_of.index_copy_(0, keys, slots.to(self.slot_of.dtype))
        self.filled = self.capacity

    def _victims(self, count: int) -> torch.Tensor:  # pragma: no cover - never admits
        raise AssertionError("a static cache admits nothing")


class FIFOPolicy(CachePolicy):
    """First in, first out over a ring of slots (BGL's policy): insert at the head, evict what
    was there. O(1) bookkeeping per id, no recency updates on hits."""

    name = "fifo"

    def __init__(self, capacity: int, num_keys: int, device: str | torch.device = "cpu"):
        super().__init__(capacity, num_keys, device)
        self.head = 0

    def _victims(self, count: int) -> torch.Tensor:
        h, c, dev = self.head, self.capacity, self.device
        if h + count <= c:
            slots = torch.arange(h, h + count, device=dev)
        else:  # wrap around the ring
            slots = torch.cat(
                [torch.arange(h, c, device=dev), torch.arange(0, h + count - c, device=dev)]
            )
        self.head = (h + count) % c
        self.filled = min(self.capacity, self.filled + count)
        return slots


class LRUPolicy(CachePolicy):
    """Least recently used: every slot keeps the tick of its last use; victims are the smallest
    ticks (``torch.topk``, O(capacity) per batch -- a GPU does this in microseconds; a CPU pays
    for it, which is BGL's point about LRU/LFU overhead)."""

    name = "lru"
    uses_ticks = True

    def __init__(self, capacity: int, num_keys: int, device: str | torch.device = "cpu"):
        super().__init__(capacity, num_keys, device)
        self.tick = torch.zeros(self.capacity, dtype=torch.int64, device=self.device)

    def touch(self, slots: torch.Tensor, ticks: torch.Tensor) -> None:
        self.tick.index_copy_(0, slots, ticks)

    def _victims(self, count: int) -> torch.Tensor:
        fresh, rest = self._take_empty(count)
        if rest == 0:
            return fresh
        used = self.tick[: self.filled - fresh.numel()]
        old = _smallest(used, rest)
        return torch.cat([fresh, old]) if fresh.numel() else old

    def _on_insert(self, slots: torch.Tensor, ticks: torch.Tensor) -> None:
        self.tick.index_copy_(0, slots, ticks)

    def _tensors(self) -> list[torch.Tensor]:
        return [*super()._tensors(), self.tick]


class LFUPolicy(LRUPolicy):
    """Least frequently used (in-cache counts), ties broken by least recently used."""

    name = "lfu"

    def __init__(self, capacity: int, num_keys: int, device: str | torch.device = "cpu"):
        super().__init__(capacity, num_keys, device)
        self.freq = torch.zeros(self.capacity, dtype=torch.int64, device=self.device)

    def touch(self, slots: torch.Tensor, ticks: torch.Tensor) -> None:
        self.tick.index_copy_(0, slots, ticks)
        self.freq.index_add_(0, slots, torch.ones_like(slots))

    def _victims(self, count: int) -> torch.Tensor:
        fresh, rest = self._take_empty(count)
        if rest == 0:
            return fresh
        n_used = self.filled - fresh.numel()
        freq, tick = self.freq[:n_used], self.tick[:n_used]
        if rest >= n_used:
            old = torch.arange(n_used, device=self.device)
        else:
            # rest-th smallest frequency f*: every slot below it goes, then the least recently
            # used of the slots at exactly f* (two O(capacity) selections, no composite key)
            fstar = torch.kthvalue(freq, rest).values
            below = torch.nonzero(freq < fstar).flatten()
            ties = torch.nonzero(freq == fstar).flatten()
            need = rest - int(below.numel())
            pick = ties.index_select(0, _smallest(tick.index_select(0, ties), need))
            old = torch.cat([below, pick])
        return torch.cat([fresh, old]) if fresh.numel() else old

    def _on_insert(self, slots: torch.Tensor, ticks: torch.Tensor) -> None:
        self.tick.index_copy_(0, slots, ticks)
        self.freq.index_fill_(0, slots, 1)

    def _tensors(self) -> list[torch.Tensor]:
        return [*super()._tensors(), self.freq]


def _smallest(values: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` smallest entries of ``values`` (distinct values; any order)."""
    if k >= values.numel():
        return torch.arange(values.numel(), device=values.device)
    if k == 0:
        return torch.empty(0, dtype=torch.int64, device=values.device)
    return torch.topk(values, k, largest=False, sorted=False).indices


def make_policy(
    policy: str, capacity: int, num_keys: int, device="cpu", hot_keys=None
) -> CachePolicy:
    """A policy by name (one of :data:`POLICIES`). ``static`` needs ``hot_keys`` (hottest first;
    the first ``capacity`` are kept)."""
    if policy == "static":
        if hot_keys is None:
            raise ValueError("a static cache needs hot_ids (the ids to keep, hottest first)")
        hot = np.asarray(hot_keys, dtype=np.int64)[: int(min(capacity, num_keys))]
        return StaticPolicy(hot, num_keys, device)
    cls = {"fifo": FIFOPolicy, "lru": LRUPolicy, "lfu": LFUPolicy}.get(policy)
    if cls is None:
        raise ValueError(f"unknown cache policy {policy!r}; choose one of {', '.join(POLICIES)}")
    return cls(capacity, num_keys, device)


# ---- row movement ----------------------------------------------------------------------------

if HAVE_NUMBA:
    from numba import njit, prange

    @njit(parallel=True, nogil=True, cache=True)
    def _move_bytes(src, src_idx, dst, dst_idx):  # pragma: no cover - compiled
        for i in prange(src_idx.shape[0]):
            dst[dst_idx[i], :] = src[src_idx[i], :]


def _bytes2d(t: torch.Tensor) -> np.ndarray:
    return t.view(torch.uint8).numpy().reshape(t.shape[0], t.shape[1] * t.element_size())


def move_rows(
    src: torch.Tensor, src_idx: torch.Tensor, dst: torch.Tensor, dst_idx: torch.Tensor | None
) -> None:
    """``dst[dst_idx[i]] = src[src_idx[i]]`` for every ``i`` (``dst_idx=None``: ``dst[i]``).

    On the CPU a parallel numba byte-copy kernel (one pass, no temporary); elsewhere
    ``index_select`` + ``index_copy_``. ``src`` and ``dst`` are contiguous 2-D tensors of the same
    width and dtype; indices int64 on their device.
    """
    if src_idx.numel() == 0:
        return
    cpu = src.device.type == "cpu" and dst.device.type == "cpu"
    if HAVE_NUMBA and cpu and src.is_contiguous() and dst.is_contiguous():
        di = np.arange(src_idx.numel(), dtype=np.int64) if dst_idx is None else dst_idx.numpy()
        _move_bytes(_bytes2d(src), src_idx.numpy(), _bytes2d(dst), di)
        return
    rows = src.index_select(0, src_idx.to(src.device)).to(dst.device)
    if dst_idx is None:
        dst[: rows.shape[0]].copy_(rows)
    else:
        dst.index_copy_(0, dst_idx.to(dst.device), rows)


# ---- statistics ------------------------------------------------------------------------------


@dataclass
class CacheStats:
    """What a cache did since the last :meth:`reset` (counts are per unique id of a batch, except
    for the static policy, which counts rows).

    Attributes:
        batches: non-empty ``gather`` calls.
        queries: rows requested (repeats included).
        unique_queries: distinct ids requested, summed over batches.
        hits, misses: unique ids found / not found in the cache.
        insertions, evictions: entries written / pushed out.
        fetched_bytes: bytes read from the backing store (unique misses x row bytes).
        hit_bytes: bytes read from the cache buffer.
        manage_s: seconds of cache management (dedup, lookup, bookkeeping, victim selection).
        copy_s: seconds of data movement (hit reads, backing gather, output and buffer writes).
        hit_ratio_sum: sum over batches of the batch's ``hits / unique_queries``.
    """

    batches: int = 0
    queries: int = 0
    unique_queries: int = 0
    hits: int = 0
    misses: int = 0
    insertions: int = 0
    evictions: int = 0
    fetched_bytes: int = 0
    hit_bytes: int = 0
    manage_s: float = 0.0
    copy_s: float = 0.0
    hit_ratio_sum: float = 0.0
    last: dict = field(default_factory=dict)

    def reset(self) -> None:
        for k, v in CacheStats().__dict__.items():
            setattr(self, k, v)

    @property
    def hit_ratio(self) -> float:
        """Mean over batches of the per-batch hit ratio (DESIGN: averaged over an epoch)."""
        return self.hit_ratio_sum / self.batches if self.batches else 0.0

    @property
    def manage_ms_per_batch(self) -> float:
        return 1e3 * self.manage_s / self.batches if self.batches else 0.0

    @property
    def copy_ms_per_batch(self) -> float:
        return 1e3 * self.copy_s / self.batches if self.batches else 0.0

    def as_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "last"}
        d.update(
            hit_ratio=self.hit_ratio,
            manage_ms_per_batch=self.manage_ms_per_batch,
            copy_ms_per_batch=self.copy_ms_per_batch,
        )
        return d

    def _record(self, n, unique, hits, misses, ins, ev, row_bytes, manage, copy) -> None:
        self.batches += 1
        self.queries += n
        self.unique_queries += unique
        self.hits += hits
        self.misses += misses
        self.insertions += ins
        self.evictions += ev
        self.fetched_bytes += misses * row_bytes
        self.hit_bytes += hits * row_bytes
        self.manage_s += manage
        self.copy_s += copy
        self.hit_ratio_sum += hits / unique if unique else 0.0
        self.last = dict(
            queries=n,
            unique=unique,
            hits=hits,
            misses=misses,
            insertions=ins,
            evictions=ev,
            manage_s=manage,
            copy_s=copy,
        )


# ---- helpers shared with the sharded cache ---------------------------------------------------


class FirstOccurrence:
    """Vectorized dedup keeping first occurrences, with a dense ``[num_rows]`` int32 scratch array
    (reset after every call, so it costs O(batch), not O(num_rows), per call)."""

    def __init__(self, num_rows: int, device: torch.device):
        self.pos = torch.full((num_rows,), _I32_MAX, dtype=torch.int32, device=device)

    def __call__(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(unique, inverse)``: the distinct ids of int64 ``ids`` in order of first occurrence,
        and ``inverse`` (int64, ``unique[inverse] == ids``), or None when ``ids`` had no repeats
        (then ``unique`` is ``ids`` itself)."""
        n = ids.numel()
        if n >= _I32_MAX:
            raise ValueError(f"a batch of {n} ids is too large (limit {_I32_MAX - 1})")
        ar = torch.arange(n, dtype=torch.int32, device=ids.device)
        self.pos.scatter_reduce_(0, ids, ar, "amin")
        first = self.pos.index_select(0, ids)
        self.pos.index_fill_(0, ids, _I32_MAX)
        is_first = first == ar
        if bool(is_first.all()):
            return ids, None
        uniq = ids[is_first]
        rank = torch.cumsum(is_first, 0) - 1
        return uniq, rank.index_select(0, first.long())

    def nbytes(self) -> int:
        return self.pos.numel() * self.pos.element_size()


class _Timer:
    """Wall-clock phases; synchronizes a CUDA device first when asked."""

    def __init__(self, device: torch.device, enabled: bool):
        self.sync = enabled and device.type == "cuda"
        self.enabled = enabled
        self.t = time.perf_counter()

    def lap(self) -> float:
        if not self.enabled:
            return 0.0
        if self.sync:
            torch.cuda.synchronize()
        now = time.perf_counter()
        d, self.t = now - self.t, now
        return d


def snapshot_rows(counters) -> dict[str, int]:
    return dict(counters.rows)


def counters_delta(before: dict[str, int], counters) -> dict[str, int]:
    """Rows per tier counted by ``counters`` since ``before`` (a :func:`snapshot_rows`)."""
    return {t: r - before.get(t, 0) for t, r in counters.rows.items() if r - before.get(t, 0)}


def ids_on(store: FeatureStore, ids, device: torch.device) -> torch.Tensor:
    """Validated int64 ids on ``device`` (validated on the device when already there)."""
    if isinstance(ids, torch.Tensor) and ids.device == device and device.type != "cpu":
        if ids.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"feature ids must be int32/int64, got a tensor of {ids.dtype}")
        if ids.dim() != 1:
            raise ValueError(f"feature ids must be 1-D, got shape {tuple(ids.shape)}")
        if ids.numel():
            lo, hi = (int(v) for v in torch.aminmax(ids))
            if lo < 0 or hi >= store.num_rows:
                raise IndexError(
                    f"feature id {lo if lo < 0 else hi} out of range [0, {store.num_rows})"
                )
        return ids.long()
    arr = as_index_array(ids, store.num_rows)
    return torch.from_numpy(arr).to(device=device, dtype=torch.int64)


# ---- the cache -------------------------------------------------------------------------------


class FeatureCache(FeatureStore):
    """A cache of ``capacity`` feature rows on ``device`` in front of ``backing``.

    Args:
        backing: the store the misses come from (any :class:`FeatureStore`, also another cache).
        capacity: rows the cache holds (clipped to ``[0, backing.num_rows]``); see
            :func:`capacity_rows` for fractions.
        policy: ``"static"``, ``"fifo"``, ``"lru"``, ``"lfu"`` (see module docstring).
        hot_ids: for ``"static"``: global ids, hottest first (e.g. ``np.argsort(-score)``); the
            first ``capacity`` are loaded once from the bottom store of the stack at construction.
        device: where the buffer, the maps and the returned rows live (default: ``backing.device``).
        tier: the counter name of rows served from the buffer (default ``"gpu_cache"`` on a GPU,
            else ``"cache"``).
        timing: measure management and copy time per batch (synchronizes a CUDA device).
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
    ) -> None:
        super().__init__()
        if not isinstance(backing, FeatureStore):
            raise TypeError(f"backing must be a FeatureStore, got {type(backing).__name__}")
        self.backing = backing
        self.num_rows, self.dim, self.dtype = backing.num_rows, backing.dim, backing.dtype
        self.device = torch.device(device) if device is not None else backing.device
        self.tier = tier or ("gpu_cache" if self.device.type == "cuda" else "cache")
        self.timing = bool(timing)
        cap = capacity_rows(capacity, self.num_rows) if capacity else 0
        self.policy = make_policy(policy, cap, self.num_rows, self.device, hot_keys=hot_ids)
        self.capacity = self.policy.capacity
        self.buffer = torch.empty((self.capacity, self.dim), dtype=self.dtype, device=self.device)
        self.stats = CacheStats()
        self._dedup = FirstOccurrence(self.num_rows, self.device) if self.policy.dynamic else None
        self._clock = 0
        self._lock = threading.Lock()
        if not self.policy.dynamic and self.capacity:
            rows = self.root.gather(self.policy.key_of.cpu())
            self.buffer.copy_(rows.to(self.device))

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

    def cached_ids(self) -> torch.Tensor:
        """The global ids cached now (int64, slot order)."""
        k = self.policy.key_of
        return k[k >= 0]

    def gather(self, ids, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rows ``ids`` (global ids, any order, repeats allowed) as ``[len(ids), dim]`` on
        ``self.device``; see the module docstring for what changes in the cache."""
        idx = ids_on(self, ids, self.device)
        n = int(idx.numel())
        dst = output_rows(out, n, self.dim, self.dtype, self.device)
        if n == 0:
            return dst
        with self._lock:
            if self.policy.dynamic:
                self._gather_dynamic(idx, dst)
            else:
                self._gather_static(idx, dst)
        return dst

    def _fetch(self, miss_ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, int]]:
        """One backing gather of ``miss_ids``; rows on this device and rows per backing tier."""
        before = snapshot_rows(self.backing.counters)
        rows = self.backing.gather(miss_ids.to(self.backing.device))
        return rows.to(self.device), counters_delta(before, self.backing.counters)

    def _count(self, served_here: int, below: dict[str, int]) -> None:
        if served_here:
            self.counters.add(self.tier, served_here, self.row_bytes)
        for t, r in below.items():
            self.counters.add(t, r, self.row_bytes)

    def _gather_static(self, idx: torch.Tensor, dst: torch.Tensor) -> None:
        timer = _Timer(self.device, self.timing)
        slots = self.policy.lookup(idx)
        hit = slots >= 0
        hit_pos = torch.nonzero(hit).flatten()
        miss_pos = torch.nonzero(~hit).flatten()
        manage = timer.lap()
        move_rows(self.buffer, slots.index_select(0, hit_pos), dst, hit_pos)
        below: dict[str, int] = {}
        if miss_pos.numel():
            rows, below = self._fetch(idx.index_select(0, miss_pos))
            move_rows(rows, torch.arange(rows.shape[0], device=self.device), dst, miss_pos)
        copy = timer.lap()
        n, h = int(idx.numel()), int(hit_pos.numel())
        self._count(h, below)
        self.stats._record(n, n, h, n - h, 0, 0, self.row_bytes, manage, copy)

    def _gather_dynamic(self, idx: torch.Tensor, dst: torch.Tensor) -> None:
        timer = _Timer(self.device, self.timing)
        pol = self.policy
        uniq, inv = self._dedup(idx)
        u = int(uniq.numel())
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
        manage = timer.lap()

        move_rows(self.buffer, hit_slots, dst, hit_rows)
        m = int(miss_ids.numel())
        below: dict[str, int] = {}
        fetched = None
        if m:
            fetched, below = self._fetch(miss_ids)
            src = torch.arange(m, device=self.device) if miss_src is None else miss_src
            move_rows(fetched, src, dst, miss_rows)
        copy = timer.lap()

        slots_w, pos_w, evicted = pol.admit(miss_ids, miss_ticks)
        manage += timer.lap()
        if slots_w.numel():
            if slots_w.numel() == m and self.device.type != "cpu":
                self.buffer.index_copy_(0, slots_w, fetched)
            else:
                move_rows(fetched, pos_w, self.buffer, slots_w)
        copy += timer.lap()

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
