"""A cache policy that sees the next batches: Belady's MIN over a window of K announced batches
(``lookahead``), and MIN with the whole trace announced, the offline optimum (``optimal``).

Why it can beat every policy of the papers: static, FIFO, LRU and LFU guess the future from the
past, but a loader that samples ahead already *knows* the input nodes of its next batches. The
loader (or a benchmark) calls :meth:`LookaheadPolicy.announce` with each upcoming batch's unique
ids, in order, before the cache serves it (:meth:`gnnio.features.cache.FeatureCache.announce`);
:meth:`LookaheadPolicy.begin_batch` then consumes the oldest announced batch when the cache serves
it. A batch served without an announcement is announced and consumed at once (``K = 0``).

The batch model (that of :mod:`gnnio.features.cache`): batch ``t`` reads its unique ids ``U_t``
(hits: those cached before ``t``); afterwards the cache may hold any ``capacity`` ids of the ones
it held and ``U_t``. The hits of a whole trace are maximized by keeping, after every batch, the
ids whose next use is soonest (ids never used again last) -- Belady's MIN with bypass, at batch
granularity (ids tied on the next batch they are read in are re-read there, so the choice among
them does not matter); ``tests/test_lookahead.py`` checks this against an exhaustive search.

Ranking after batch ``t``, over the cached ids and the misses of ``t`` (smaller keeps):

1. ids used again inside the window, by the batch of their next use (MIN);
2. then the others by a fallback estimate: the number of batches an id appeared in so far
   (frequency over the whole history, not only while cached), ties by the hotness rank of
   ``hot_keys`` when given, then cached before missed (no churn between equals).

So a missed row not reused inside the window is admitted only into a free slot or in place of a
cached row that is also not reused inside the window and has a lower fallback estimate; with a
full window (``optimal``) it never displaces anything useful. With ``static_capacity`` the first
slots hold the top ``hot_keys`` for good (the static hot part) and the ranking runs over the rest;
with ``hot_keys`` the other slots start with the next hottest keys (a warm start, like a static
cache's; without it a short trace measures mostly the fill-up).

Cost per batch, all vectorized (no Python per id): ``announce`` O(batch); ``begin_batch`` O(batch);
``admit`` one ``topk`` over the cached ids plus the misses (LRU does one over the cached ids).
State: dense per-key arrays (next use, last announced position: int64; frequency: int32; hotness
rank when ``hot_keys`` is given: int64) next to the cache's own ``slot_of`` map, and a ring of the
announced ids with the position of each one's next use -- two int64 per id of the window: memory
grows with K batches of ids, never with rows.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import torch

from .cache_policy import POLICIES as BASE_POLICIES
from .cache_policy import CachePolicy, make_policy

__all__ = ["LOOKAHEAD_POLICIES", "POLICIES", "LookaheadPolicy", "make_any_policy"]

#: the policies of this module: a window of K batches, and the whole trace (offline optimum)
LOOKAHEAD_POLICIES = ("lookahead", "optimal")
#: every policy name :class:`~gnnio.features.cache.FeatureCache` accepts
POLICIES = (*BASE_POLICIES, *LOOKAHEAD_POLICIES)

_INF = 1 << 62  # "no next use known"
_BEYOND = 1 << 61  # ranks of ids not reused inside the window start here
_FB_MAX = (1 << 59) - 1  # fallback estimates are clamped below this
_HOT_SCALE = 1 << 32  # frequency outranks the hotness rank


class LookaheadPolicy(CachePolicy):
    """Belady's MIN over the announced batches, frequency/hotness beyond them (module docstring).

    Args:
        capacity, num_keys, device: as :class:`~gnnio.features.cache_policy.CachePolicy`.
        lookahead: the window ``K`` (batches announced ahead; what the loader reads); None =
            unbounded (``optimal``: announce the whole trace first). The policy does not enforce
            it -- whoever announces does -- it is stored for the loader.
        hot_keys: optional keys, hottest first: the fallback's tie-break, the static part and
            the warm start.
        static_capacity: slots pinned to the top ``hot_keys`` (never evicted).
        prefill: with ``hot_keys``, start with every slot holding the next hottest keys (as a
            static cache does) instead of empty; MIN evicts them as soon as they rank last.
    """

    uses_ticks = False

    def __init__(
        self,
        capacity: int,
        num_keys: int,
        device: str | torch.device = "cpu",
        lookahead: int | None = 8,
        hot_keys=None,
        static_capacity: int = 0,
        prefill: bool = True,
    ):
        super().__init__(capacity, num_keys, device)
        if lookahead is not None and int(lookahead) < 0:
            raise ValueError(f"lookahead: must be >= 0, got {lookahead}")
        self.lookahead = None if lookahead is None else int(lookahead)
        self.name = "optimal" if lookahead is None else "lookahead"
        dev = self.device
        self.next_use = torch.full((num_keys,), _INF, dtype=torch.int64, device=dev)
        self.last_serial = torch.full((num_keys,), -1, dtype=torch.int64, device=dev)
        self.freq = torch.zeros(num_keys, dtype=torch.int32, device=dev)
        self.hot_rank = None
        hot = None
        if hot_keys is not None:
            hot = torch.as_tensor(np.asarray(hot_keys, dtype=np.int64).reshape(-1), device=dev)
            self.hot_rank = torch.zeros(num_keys, dtype=torch.int64, device=dev)
            self.hot_rank.index_copy_(0, hot, num_keys - torch.arange(hot.numel(), device=dev))
        self.static_capacity = int(min(max(0, static_capacity), self.capacity))
        if self.static_capacity:
            if hot is None or hot.numel() < self.static_capacity:
                raise ValueError("static_capacity: needs at least that many hot_keys")
            keys = hot[: self.static_capacity]
            slots = torch.arange(self.static_capacity, device=dev)
            self.key_of[: self.static_capacity] = keys
            self.slot_of.index_copy_(0, keys, slots.to(self.slot_of.dtype))
            self.filled = self.static_capacity
        if prefill and hot is not None and self.capacity > self.filled:
            keys = hot[self.filled : self.capacity]
            slots = torch.arange(self.filled, self.filled + keys.numel(), device=dev)
            self.key_of.index_copy_(0, slots, keys)
            self.slot_of.index_copy_(0, keys, slots.to(self.slot_of.dtype))
            self.filled += int(keys.numel())
        self.ring_ids = torch.empty(0, dtype=torch.int64, device=dev)
        self.ring_next = torch.empty(0, dtype=torch.int64, device=dev)
        self.next_serial = 0  # serial of the next announced id
        self.consumed = 0  # serials below this belong to consumed batches
        self.announced = 0  # batches announced so far (the next one's index)
        self.pending: deque[tuple[int, int, int]] = deque()  # (batch index, first serial, size)

    # ---- the window ----------------------------------------------------------------------------

    def announce(self, keys: torch.Tensor) -> None:
        """Announce the next batch's unique keys (int64 on ``device``, no repeats)."""
        m, dev = int(keys.numel()), self.device
        j = self.announced
        if m == 0:  # an empty batch is served without the cache looking at it
            return
        self._reserve(self.next_serial - self.consumed + m)
        serials = self.next_serial + torch.arange(m, device=dev)
        prev = self.last_serial.index_select(0, keys)
        waiting = prev >= self.consumed  # an earlier occurrence still in the window: link it
        r = self.ring_ids.numel()
        self.ring_next.index_fill_(0, prev[waiting] % r, j)
        fresh = keys[~waiting]  # no pending occurrence: this is their next use
        self.next_use.index_fill_(0, fresh, j)
        pos = serials % r
        self.ring_ids.index_copy_(0, pos, keys)
        self.ring_next.index_fill_(0, pos, _INF)
        self.last_serial.index_copy_(0, keys, serials)
        self.pending.append((j, self.next_serial, m))
        self.next_serial += m
        self.announced += 1

    def begin_batch(self, keys: torch.Tensor) -> None:
        """The cache serves a batch with unique keys ``keys`` (first-occurrence order): consume the
        oldest announced batch (it must be this one), or announce and consume it at once."""
        if not self.pending:
            self.announce(keys)
        _j, a, m = self.pending.popleft()
        pos = (a + torch.arange(m, device=self.device)) % max(1, self.ring_ids.numel())
        if m != keys.numel() or not torch.equal(self.ring_ids.index_select(0, pos), keys):
            self.pending.appendleft((_j, a, m))
            raise ValueError(
                "lookahead cache: the batch served is not the batch announced next "
                f"({keys.numel()} ids served, {m} announced)"
            )
        self.next_use.index_copy_(0, keys, self.ring_next.index_select(0, pos))
        self.consumed = a + m
        self.freq.index_add_(0, keys, torch.ones_like(keys, dtype=torch.int32))

    def reset_window(self) -> None:
        """Forget the announced, unserved batches (an epoch stopped early)."""
        while self.pending:
            _j, a, m = self.pending.pop()
            pos = (a + torch.arange(m, device=self.device)) % max(1, self.ring_ids.numel())
            self.next_use.index_fill_(0, self.ring_ids.index_select(0, pos), _INF)
        self.consumed = self.next_serial

    @property
    def window(self) -> int:
        """Batches announced and not yet served."""
        return len(self.pending)

    def _reserve(self, live: int) -> None:
        """Make the ring hold ``live`` serials from :attr:`consumed` on (grow and re-place)."""
        r = self.ring_ids.numel()
        if live <= r:
            return
        new_r = max(1024, 2 * live)
        ids = torch.empty(new_r, dtype=torch.int64, device=self.device)
        nxt = torch.full((new_r,), _INF, dtype=torch.int64, device=self.device)
        if r and self.next_serial > self.consumed:
            s = torch.arange(self.consumed, self.next_serial, device=self.device)
            ids.index_copy_(0, s % new_r, self.ring_ids.index_select(0, s % r))
            nxt.index_copy_(0, s % new_r, self.ring_next.index_select(0, s % r))
        self.ring_ids, self.ring_next = ids, nxt

    # ---- ranking and admission -----------------------------------------------------------------

    def _rank(self, keys: torch.Tensor, missed: bool) -> torch.Tensor:
        """int64 rank of ``keys`` (smaller keeps): next use inside the window, else the fallback."""
        nu = self.next_use.index_select(0, keys)
        fb = self.freq.index_select(0, keys).long() * _HOT_SCALE
        if self.hot_rank is not None:
            fb += self.hot_rank.index_select(0, keys)
        beyond = _BEYOND + (_FB_MAX - fb.clamp(max=_FB_MAX)) * 2 + int(missed)
        return torch.where(nu < _INF, nu, beyond)

    def admit(
        self, keys: torch.Tensor, ticks: torch.Tensor, check_present: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Insert the misses ``keys`` (unique, int64) that rank among the ``capacity`` best of
        cached ids and misses (module docstring); ``ticks`` are unused. Returns ``(slots, pos,
        evicted)`` as :meth:`CachePolicy.admit`."""
        dev = self.device
        none = torch.empty(0, dtype=torch.int64, device=dev)
        if check_present and keys.numel():
            keep = torch.nonzero(self.lookup(keys) < 0).flatten()
            keys = keys.index_select(0, keep)
        else:
            keep = None
        m, cap, s0 = int(keys.numel()), self.capacity, self.static_capacity
        if m == 0 or cap - s0 == 0:
            return none, none, 0
        if self.filled + m <= cap:  # room for all: fill free slots
            slots = torch.arange(self.filled, self.filled + m, device=dev)
            pos = torch.arange(m, device=dev)
            evicted_slots = none
        else:
            res_slots = torch.arange(s0, self.filled, device=dev)
            res_keys = self.key_of[s0 : self.filled]
            ranks = torch.cat([self._rank(res_keys, False), self._rank(keys, True)])
            best = torch.topk(ranks, cap - s0, largest=False, sorted=False).indices
            nres = int(res_keys.numel())
            kept = torch.zeros(nres + m, dtype=torch.bool, device=dev)
            kept[best] = True
            pos = torch.nonzero(kept[nres:]).flatten()
            evicted_slots = res_slots[~kept[:nres]]
            free = torch.arange(self.filled, cap, device=dev)
            slots = torch.cat([free, evicted_slots]) if free.numel() else evicted_slots
        if pos.numel() == 0:
            return none, none, 0
        new_keys = keys.index_select(0, pos)
        if evicted_slots.numel():
            self.slot_of.index_fill_(0, self.key_of.index_select(0, evicted_slots), -1)
        self.key_of.index_copy_(0, slots, new_keys)
        self.slot_of.index_copy_(0, new_keys, slots.to(self.slot_of.dtype))
        self.filled = min(cap, self.filled + int(slots.numel()))
        if keep is not None:
            pos = keep.index_select(0, pos)
        return slots, pos, int(evicted_slots.numel())

    _CURSORS = ("next_serial", "consumed", "announced")

    def state_dict(self) -> dict:
        """As :meth:`CachePolicy.state_dict`, with the window's cursors; batches announced and not
        served are left out (as after :meth:`reset_window`), and so is the ring."""
        out = super().state_dict()
        out.pop("ring_ids", None)
        out.pop("ring_next", None)
        r = max(1, self.ring_ids.numel())
        for _j, a, m in self.pending:
            ids = self.ring_ids.index_select(0, (a + torch.arange(m, device=self.device)) % r)
            out["next_use"].index_fill_(0, ids.cpu(), _INF)
        out.update(next_serial=self.next_serial, consumed=self.next_serial)
        out["announced"] = self.announced
        return out

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` (an empty window)."""
        state = dict(state)
        cursors = {k: int(state.pop(k)) for k in self._CURSORS if k in state}
        super().load_state_dict(state)
        for k, v in cursors.items():
            setattr(self, k, v)
        self.pending.clear()

    def _victims(self, count: int) -> torch.Tensor:  # pragma: no cover - admit() is overridden
        raise AssertionError("LookaheadPolicy chooses victims in admit()")

    def _tensors(self) -> list[torch.Tensor]:
        out = [*super()._tensors(), self.next_use, self.last_serial, self.freq]
        out += [self.ring_ids, self.ring_next]
        return out + ([self.hot_rank] if self.hot_rank is not None else [])


def make_any_policy(
    policy: str,
    capacity: int,
    num_keys: int,
    device="cpu",
    hot_keys=None,
    lookahead: int | None = 8,
    static_capacity: int = 0,
) -> CachePolicy:
    """:func:`~gnnio.features.cache_policy.make_policy`, plus ``lookahead`` (window
    ``lookahead``) and ``optimal`` (unbounded window: the caller announces the whole trace)."""
    if policy == "lookahead":
        return LookaheadPolicy(
            capacity, num_keys, device, int(lookahead or 0), hot_keys, static_capacity
        )
    if policy == "optimal":
        return LookaheadPolicy(capacity, num_keys, device, None, hot_keys, static_capacity)
    return make_policy(policy, capacity, num_keys, device, hot_keys=hot_keys)
