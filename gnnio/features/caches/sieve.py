"""SIEVE and S3-FIFO: the host-cache policies over the disk tier (issue 25; GraphBolt's best on
disk). Both are FIFO queues with a few bits per entry, so a hit costs one store and an eviction
walks a queue; no ordering by recency is kept (what makes LRU expensive at scale).

* **SIEVE** (Zhang et al., NSDI'24): one queue, newest at the head; a hit sets the entry's
  ``visited`` bit. To evict, a *hand* walks from where it stopped last toward the head (wrapping to
  the tail), clearing ``visited`` bits, and evicts the first entry without one; new entries go to
  the head (so unvisited newcomers are reached soon: quick demotion) and survivors never move.
* **S3-FIFO** (Yang et al., SOSP'23): a small FIFO ``S`` (10 % of the slots), a main FIFO ``M`` and
  a ghost FIFO ``G`` of keys only (as many as ``M`` may hold). A hit raises the entry's frequency
  (capped at 3). A miss goes to ``S``, or to ``M`` when its key is still in ``G``. Eviction takes
  from ``S`` while ``S`` holds more than its 10 %: an entry of ``S``'s tail hit at least once moves
  to ``M`` with its frequency cleared, one never hit is evicted and its key enters ``G``; else from
  ``M``'s tail: an entry with frequency > 0 is reinserted at the head with frequency - 1, one with 0
  is evicted (libCacheSim's ``S3FIFO.c``).

Batch semantics are those of :mod:`gnnio.features.caches.cache` (its module docstring): the batch's hits
are marked first (``touch``), then the misses are admitted in order, with victims chosen among the
entries present before the batch (empty slots first), and the new entries are queued after every
victim was chosen. The queues are arrays of slots walked by numba kernels (``nogil``); the policies
keep their state on the CPU (they serve a host cache; a GPU cache uses the others).
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from .policy import CachePolicy

__all__ = ["HOST_POLICIES", "S3FIFOPolicy", "SIEVEPolicy", "make_host_policy"]

#: policy names of this module
HOST_POLICIES = ("sieve", "s3fifo")

_FREQ_CAP = 3
_SMALL_SHARE = 0.1


def _cpu_only(name: str, device) -> None:
    if torch.device(device).type != "cpu":
        raise ValueError(f"the {name} policy runs on the CPU (a host cache), not on {device}")


def _np(t: torch.Tensor) -> np.ndarray:
    return t.numpy()


class SIEVEPolicy(CachePolicy):
    """SIEVE (module docstring). ``newer`` / ``older`` link the queue's slots; ``ptr`` holds the
    head (newest), the tail (oldest) and the hand (-1 = start at the tail)."""

    name = "sieve"
    uses_ticks = True  # so the cache reports hits through touch(); the ticks are not read

    def __init__(self, capacity: int, num_keys: int, device: str | torch.device = "cpu"):
        _cpu_only(self.name, device)
        super().__init__(capacity, num_keys, device)
        c = self.capacity
        self.newer = torch.full((c,), -1, dtype=torch.int64)
        self.older = torch.full((c,), -1, dtype=torch.int64)
        self.visited = torch.zeros(c, dtype=torch.uint8)
        self.ptr = torch.full((3,), -1, dtype=torch.int64)  # head, tail, hand

    def touch(self, slots: torch.Tensor, ticks: torch.Tensor) -> None:
        self.visited.index_fill_(0, slots, 1)

    def _victims(self, count: int) -> torch.Tensor:
        fresh, rest = self._take_empty(count)
        if rest == 0:
            return fresh
        out = np.empty(rest, dtype=np.int64)
        _sieve_evict(_np(self.newer), _np(self.older), _np(self.visited), _np(self.ptr), out)
        old = torch.from_numpy(out)
        return torch.cat([fresh, old]) if fresh.numel() else old

    def _on_insert(self, slots: torch.Tensor, ticks: torch.Tensor) -> None:
        _sieve_link(_np(self.newer), _np(self.older), _np(self.visited), _np(self.ptr),
                    slots.numpy())  # fmt: skip

    def _tensors(self) -> list[torch.Tensor]:
        return [*super()._tensors(), self.newer, self.older, self.visited, self.ptr]


@njit(nogil=True, cache=True)
def _sieve_unlink(newer, older, ptr, p):  # pragma: no cover - compiled
    n, o = newer[p], older[p]
    if n != -1:
        older[n] = o
    else:
        ptr[0] = o
    if o != -1:
        newer[o] = n
    else:
        ptr[1] = n
    newer[p] = -1
    older[p] = -1


@njit(nogil=True, cache=True)
def _sieve_evict(newer, older, visited, ptr, out):  # pragma: no cover - compiled
    for k in range(out.shape[0]):
        p = ptr[2] if ptr[2] != -1 else ptr[1]
        while visited[p]:
            visited[p] = 0
            p = newer[p]
            if p == -1:
                p = ptr[1]
        ptr[2] = newer[p]
        _sieve_unlink(newer, older, ptr, p)
        out[k] = p


@njit(nogil=True, cache=True)
def _sieve_link(newer, older, visited, ptr, slots):  # pragma: no cover - compiled
    for s in slots:
        visited[s] = 0
        older[s] = ptr[0]
        newer[s] = -1
        if ptr[0] != -1:
            newer[ptr[0]] = s
        ptr[0] = s
        if ptr[1] == -1:
            ptr[1] = s


class S3FIFOPolicy(CachePolicy):
    """S3-FIFO (module docstring). ``queue`` holds ``S``'s ring (first row) and ``M``'s (second
    row) of slots; ``qstate`` their head / tail / size and the ghost's insert counter; ``ghost``
    the ring of ghost keys and ``ghost_at`` each key's insert count there (-1 = never)."""

    name = "s3fifo"
    uses_ticks = True  # so the cache reports hits through touch(); the ticks are not read

    def __init__(self, capacity: int, num_keys: int, device: str | torch.device = "cpu"):
        _cpu_only(self.name, device)
        super().__init__(capacity, num_keys, device)
        c = self.capacity
        self.small_capacity = max(1, int(round(_SMALL_SHARE * c))) if c else 0
        ghost = max(1, c - self.small_capacity)
        self.freq = torch.zeros(c, dtype=torch.uint8)
        self.queue = torch.full((2, max(1, c)), -1, dtype=torch.int64)
        # S head, S tail, S size, M head, M tail, M size, ghost inserts, small capacity
        self.qstate = torch.tensor([0, 0, 0, 0, 0, 0, 0, self.small_capacity], dtype=torch.int64)
        self.ghost = torch.full((ghost,), -1, dtype=torch.int64)
        self.ghost_at = torch.full((num_keys,), -1, dtype=torch.int64)

    def touch(self, slots: torch.Tensor, ticks: torch.Tensor) -> None:
        f = self.freq.index_select(0, slots)
        self.freq.index_copy_(0, slots, torch.clamp(f + 1, max=_FREQ_CAP).to(torch.uint8))

    def _victims(self, count: int) -> torch.Tensor:
        fresh, rest = self._take_empty(count)
        if rest == 0:
            return fresh
        out = np.empty(rest, dtype=np.int64)
        _s3_evict(_np(self.queue), _np(self.qstate), _np(self.freq), _np(self.key_of),
                  _np(self.ghost), _np(self.ghost_at), out)  # fmt: skip
        old = torch.from_numpy(out)
        return torch.cat([fresh, old]) if fresh.numel() else old

    def _on_insert(self, slots: torch.Tensor, ticks: torch.Tensor) -> None:
        _s3_insert(_np(self.queue), _np(self.qstate), _np(self.freq), _np(self.key_of),
                   _np(self.ghost), _np(self.ghost_at), slots.numpy())  # fmt: skip

    def sizes(self) -> tuple[int, int]:
        """Entries in ``S`` and in ``M``."""
        return int(self.qstate[2]), int(self.qstate[5])

    def _tensors(self) -> list[torch.Tensor]:
        return [*super()._tensors(), self.freq, self.queue, self.qstate, self.ghost,
                self.ghost_at]  # fmt: skip


@njit(nogil=True, cache=True)
def _q_push(queue, st, q, s):  # pragma: no cover - compiled
    c = queue.shape[1]
    queue[q, st[3 * q]] = s
    st[3 * q] = (st[3 * q] + 1) % c
    st[3 * q + 2] += 1


@njit(nogil=True, cache=True)
def _q_pop(queue, st, q):  # pragma: no cover - compiled
    c = queue.shape[1]
    s = queue[q, st[3 * q + 1]]
    st[3 * q + 1] = (st[3 * q + 1] + 1) % c
    st[3 * q + 2] -= 1
    return s


@njit(nogil=True, cache=True)
def _s3_evict(queue, st, freq, key_of, ghost, ghost_at, out):  # pragma: no cover - compiled
    g = ghost.shape[0]
    for k in range(out.shape[0]):
        victim = -1
        while st[2] > st[7] or (st[2] > 0 and st[5] == 0):  # S over its share: evict from S
            t = _q_pop(queue, st, 0)
            if freq[t] >= 1:  # hit while in S: promote to M
                freq[t] = 0
                _q_push(queue, st, 1, t)
            else:
                key = key_of[t]
                ghost[st[6] % g] = key
                ghost_at[key] = st[6]
                st[6] += 1
                victim = t
                break
        while victim == -1:  # from M: second chances, frequency - 1 each
            t = _q_pop(queue, st, 1)
            if freq[t] > 0:
                freq[t] -= 1
                _q_push(queue, st, 1, t)
            else:
                victim = t
        out[k] = victim


@njit(nogil=True, cache=True)
def _s3_insert(queue, st, freq, key_of, ghost, ghost_at, slots):  # pragma: no cover - compiled
    g = ghost.shape[0]
    for s in slots:
        key = key_of[s]
        at = ghost_at[key]
        in_ghost = at >= 0 and st[6] - at <= g and ghost[at % g] == key
        freq[s] = 0
        _q_push(queue, st, 1 if in_ghost else 0, s)


def make_host_policy(policy: str, capacity: int, num_keys: int, device="cpu") -> CachePolicy:
    """A policy of this module by name (one of :data:`HOST_POLICIES`)."""
    cls = {"sieve": SIEVEPolicy, "s3fifo": S3FIFOPolicy}.get(policy)
    if cls is None:
        raise ValueError(f"unknown host cache policy {policy!r}; one of {', '.join(HOST_POLICIES)}")
    return cls(capacity, num_keys, device)
