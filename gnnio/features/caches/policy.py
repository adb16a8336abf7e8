"""Cache replacement policies: which key occupies which of a cache's slots, and whom to evict.

Bookkeeping only, no feature rows: a policy keeps the dense ``key -> slot`` map (BGL footnote 3: "a
contiguous 1D array as a HashMap") and its inverse, and chooses victims for static, FIFO, LRU and
LFU (BGL §3.2.1, PaGraph). The batch semantics the methods implement are those of
:mod:`gnnio.features.caches.cache` (its module docstring, steps 2, 3 and 5); the row buffer that goes with
the slots is the cache's (:class:`~gnnio.features.caches.cache.FeatureCache`, or one shard of
:class:`~gnnio.features.caches.multi.ShardedFeatureCache`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ...utils.devices import resolve_device

__all__ = [
    "POLICIES",
    "CachePolicy",
    "FIFOPolicy",
    "LFUPolicy",
    "LRUPolicy",
    "StaticPolicy",
    "make_policy",
]

#: policy names accepted by :class:`~gnnio.features.caches.cache.FeatureCache` and :func:`make_policy`
POLICIES = ("static", "fifo", "lru", "lfu")

_I32_MAX = 2**31 - 1


def _map_dtype(n: int) -> torch.dtype:
    return torch.int32 if n < _I32_MAX else torch.int64


class CachePolicy(ABC):
    """Which keys occupy the ``capacity`` slots of a cache, and whom to evict.

    Keys are ints in ``[0, num_keys)`` (global ids for a :class:`~gnnio.features.caches.cache.FeatureCache`; ``id // S`` in shard
    ``id % S`` of a sharded cache). Tensors live on ``device``. See :mod:`gnnio.features.caches.cache`
    for the batch semantics the methods implement.

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
        self.device = resolve_device(device)
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
        self.sync_cursors()
        return self.filled

    def nbytes(self) -> int:
        """Bytes held by the policy's tensors (constant after construction)."""
        return sum(t.numel() * t.element_size() for t in self._tensors())

    def _tensors(self) -> list[torch.Tensor]:
        return [self.slot_of, self.key_of]

    def state_dict(self) -> dict:
        """What decides the next victims and hits: every tensor attribute and the int cursors
        (``filled``, FIFO's ``head``), as CPU tensors and ints (a checkpoint saves this)."""
        out: dict = {}
        self.sync_cursors()
        for k, v in vars(self).items():
            if k.startswith("_"):  # working copies (sentinel-extended arrays, device cursors)
                continue
            if isinstance(v, torch.Tensor):
                out[k] = v.detach().cpu().clone()
            elif k in ("filled", "head"):
                out[k] = int(v)
        return out

    def sync_cursors(self) -> None:  # noqa: B027 - no-op default
        """Bring int cursors kept on the device by a sync-free path back to the host."""

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` (same policy, capacity and key count, else ValueError)."""
        self.sync_cursors()
        for k, v in state.items():
            cur = getattr(self, k, None)
            if isinstance(cur, torch.Tensor):
                if not isinstance(v, torch.Tensor) or v.shape != cur.shape:
                    raise ValueError(f"cache state: '{k}' does not fit this cache")
                cur.copy_(v.to(cur.device, cur.dtype))
            elif k in ("filled", "head") and cur is not None:
                setattr(self, k, int(v))
            else:
                raise ValueError(f"cache state: unknown entry '{k}' for a {self.name} cache")


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
    was there. O(1) bookkeeping per id, no recency updates on hits. BGL writes the ``k``-th
    insertion to slot ``(tail + 1) % size``; starting at slot 0 instead only renames the slots
    (same hits, same victims)."""

    name = "fifo"

    def __init__(self, capacity: int, num_keys: int, device: str | torch.device = "cpu"):
        super().__init__(capacity, num_keys, device)
        self.head = 0
        # the maps with one sentinel entry at the end, for the sync-free path's masked writes
        # (:mod:`gnnio.features.caches.nosync`): ``slot_of`` and ``key_of`` are views of them
        self._slot_ext = torch.full((self.num_keys + 1,), -1, dtype=self.slot_of.dtype,
                                    device=self.device)  # fmt: skip
        self._key_ext = torch.full((self.capacity + 1,), -1, dtype=torch.int64, device=self.device)
        self.slot_of, self.key_of = self._slot_ext[:-1], self._key_ext[:-1]
        self._cur: torch.Tensor | None = None  # [head, filled] on the device (sync-free path)

    def device_cursors(self) -> torch.Tensor:
        """``[head, filled]`` as an int64 device tensor the sync-free path updates in place; the
        int attributes are brought back by :meth:`sync_cursors` (a checkpoint, :meth:`size`)."""
        if self._cur is None:
            self._cur = torch.tensor([self.head, self.filled], dtype=torch.int64,
                                     device=self.device)  # fmt: skip
        return self._cur

    def sync_cursors(self) -> None:
        if self._cur is not None:
            self.head, self.filled = (int(v) for v in self._cur.tolist())
            self._cur = None  # the ints hold them again; a later batch copies them anew

    def _victims(self, count: int) -> torch.Tensor:
        self.sync_cursors()
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


def hot_key_array(hot_ids) -> np.ndarray:
    """``hot_ids`` (ids, hottest first) as a 1-D int64 array: TypeError for float or bool ids
    (never rounded; a bool mask is not a list of ids), ValueError for a 2-D array."""
    if isinstance(hot_ids, torch.Tensor):
        hot_ids = hot_ids.detach().cpu().numpy()
    a = np.asarray(hot_ids)
    if a.size and a.dtype.kind not in "iu":
        raise TypeError(f"hot_ids: need integer node ids, hottest first, got dtype {a.dtype}")
    if a.ndim != 1:
        raise ValueError(f"hot_ids: need a 1-D array of node ids, got shape {a.shape}")
    return a.astype(np.int64, copy=False)


def make_policy(
    policy: str, capacity: int, num_keys: int, device="cpu", hot_keys=None
) -> CachePolicy:
    """A policy by name (one of :data:`POLICIES`). ``static`` needs ``hot_keys`` (hottest first;
    the first ``capacity`` are kept)."""
    if policy == "static":
        if hot_keys is None:
            raise ValueError("a static cache needs hot_ids (the ids to keep, hottest first)")
        hot = hot_key_array(hot_keys)[: int(min(capacity, num_keys))]
        return StaticPolicy(hot, num_keys, device)
    kinds: dict[str, Callable[[int, int, Any], CachePolicy]] = {
        "fifo": FIFOPolicy, "lru": LRUPolicy, "lfu": LFUPolicy}  # fmt: skip
    cls = kinds.get(policy)
    if cls is None:
        raise ValueError(f"unknown cache policy {policy!r}; choose one of {', '.join(POLICIES)}")
    return cls(capacity, num_keys, device)
