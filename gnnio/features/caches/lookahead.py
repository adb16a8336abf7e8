"""A cache policy that sees the next batches: Belady's MIN over a window of K announced batches
(``lookahead``), and MIN with the whole trace announced, the offline optimum (``optimal``).

Why it can beat every policy of the papers: static, FIFO, LRU and LFU guess the future from the
past, but a loader that samples ahead already *knows* the input nodes of its next batches. The
loader (or a benchmark) calls :meth:`LookaheadPolicy.announce` with each upcoming batch's unique
ids, in order, before the cache serves it (:meth:`gnnio.features.caches.cache.FeatureCache.announce`);
:meth:`LookaheadPolicy.begin_batch` then consumes the oldest announced batch when the cache serves
it. A batch served without an announcement is announced and consumed at once (``K = 0``).

The batch model (that of :mod:`gnnio.features.caches.cache`): batch ``t`` reads its unique ids ``U_t``
(hits: those cached before ``t``); afterwards the cache may hold any ``capacity`` ids of the ones
it held and ``U_t``. The hits of a whole trace are maximized by keeping, after every batch, the
ids whose next use is soonest (ids never used again last) -- Belady's MIN with bypass, at batch
granularity (ids tied on the next batch they are read in are re-read there, so the choice among
them does not matter); ``tests/test_lookahead.py`` checks this against an exhaustive search.

Ranking after batch ``t``, over the cached ids and the misses of ``t`` (smaller keeps):

1. ids used again inside the window, by the batch of their next use (MIN);
2. then the others by a fallback estimate of how soon they are used again: the hotness rank of
   ``hot_keys`` when given (a score such as WRPR estimates each row's access probability; on the
   2^21 graph and Facebook it predicted reuse beyond the window better than the history count:
   21.7 k against 23.5 k rows fetched per batch at a 20 % cache, docs/benchmarks.md), ties -- and
   every id without ``hot_keys`` -- by the number of batches the id appeared in so far (frequency
   over the whole history, not only while cached), then cached before missed (no churn between
   equals);
3. remaining ties by position: cached ids in slot order, then the misses in first-occurrence
   order, the earlier kept (:func:`kept_smallest`; a stable sort on the sync-free path, so both
   paths keep the same ids).

So a missed row not reused inside the window is admitted only into a free slot or in place of a
cached row that is also not reused inside the window and has a lower fallback estimate; with a
full window (``optimal``) it never displaces anything useful. With ``static_capacity`` the first
slots hold the top ``hot_keys`` for good (the static hot part) and the ranking runs over the rest;
with ``hot_keys`` the other slots start with the next hottest keys (a warm start, like a static
cache's; without it a short trace measures mostly the fill-up).

Cost per batch, all vectorized (no Python per id): ``announce`` O(batch) (on the CPU
:meth:`LookaheadPolicy.announce_ids` also deduplicates the raw ids in that pass); ``begin_batch`` O(batch);
``admit`` one gather of the cached ids' ranks and one selection (``kthvalue``) over the cached ids
plus the misses (LRU does one over the cached ids). On a GPU the whole batch runs without a host
synchronisation (:mod:`gnnio.features.caches.nosync_lookahead`). The rank of every key is kept current in one
array (``rank_of``: the next use while announced, else the fallback, updated where the next use or
the frequency changes: the announced and the served ids), so ranking reads one value per key.
State: dense per-key arrays (rank, last announced position, the fallback's static base: int64;
frequency: int32) next to the cache's own ``slot_of`` map, and a ring of the announced ids with the
position of each one's next use -- two int64 per id of the window: memory grows with K batches of
ids, never with rows.

Threads: the window is one stream of batches, served in the order announced, so one thread
announces and gathers them (the loader's gather thread does both). Batches of two threads
interleaved are refused when one is served out of turn (``ValueError`` from
:meth:`LookaheadPolicy.begin_batch`), never served as wrong rows
(``tests/test_cache_threads.py``).
"""

from __future__ import annotations

from collections import deque

import numpy as np
import torch

from . import _lookahead_kernels as _K
from .policy import POLICIES as BASE_POLICIES
from .policy import CachePolicy, hot_key_array, make_policy

__all__ = ["LOOKAHEAD_POLICIES", "POLICIES", "LookaheadPolicy", "make_any_policy"]

#: the policies of this module: a window of K batches, and the whole trace (offline optimum)
LOOKAHEAD_POLICIES = ("lookahead", "optimal")
#: every policy name :class:`~gnnio.features.caches.cache.FeatureCache` accepts (SIEVE and S3-FIFO:
#: :mod:`gnnio.features.caches.sieve`, host caches only)
POLICIES = (*BASE_POLICIES, *LOOKAHEAD_POLICIES, "sieve", "s3fifo")

_INF = 1 << 62  # "no next use known"
_BEYOND = 1 << 61  # ranks of ids not reused inside the window start here
_FREQ_MAX = (1 << 24) - 1  # frequencies are clamped to this in the ranking


class LookaheadPolicy(CachePolicy):
    """Belady's MIN over the announced batches, frequency/hotness beyond them (module docstring).

    Args:
        capacity, num_keys, device: as :class:`~gnnio.features.caches.policy.CachePolicy`.
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
        # per key: [rank, last announced serial, fallback rank, slot] (one cache line; the
        # kernels); ``slot_of`` becomes a view of the last column. One sentinel row (key
        # ``num_keys``) and one sentinel slot past the end take the sync-free path's masked-off
        # writes (:mod:`gnnio.features.caches.nosync_lookahead`)
        self._ks_ext = torch.empty((num_keys + 1, 4), dtype=torch.int64, device=dev)
        self.keystate = self._ks_ext[:num_keys]
        self.keystate[:, _K.SLOT] = -1
        self._key_ext = torch.full((self.capacity + 1,), -1, dtype=torch.int64, device=dev)
        self.key_of = self._key_ext[:-1]
        self.slot_of = self.keystate[:, _K.SLOT]
        self.last_serial.fill_(-1)
        # fallback = _BEYOND + 2 * ((hotness position << 24) + FREQ_MAX - frequency): hotter
        # first, then more frequent; the lowest bit stays free for "missed"
        fb = self.fallback_of
        fb.fill_(_BEYOND + 2 * _FREQ_MAX)
        hot = None
        if hot_keys is not None:
            hot = torch.as_tensor(np.asarray(hot_keys, dtype=np.int64).reshape(-1), device=dev)
            pos = torch.arange(hot.numel(), dtype=torch.int64, device=dev)
            fb.fill_(_BEYOND + 2 * ((hot.numel() << 24) + _FREQ_MAX))  # not in hot_keys: last
            fb.index_copy_(0, hot, _BEYOND + 2 * ((pos << 24) + _FREQ_MAX))
        self.rank_of.copy_(fb)  # nothing announced
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
        # (batch index, first serial, size); the sync-free path's: (.., serial and size as
        # device scalars, the batch's padded length), made ints by sync_cursors()
        self.pending: deque[tuple] = deque()
        #: numba kernels on CPU tensors (one pass per batch); the torch path elsewhere. Set it
        #: before the first batch (``slot_rank`` is kept by the kernels only).
        self.use_kernels = self.device.type == "cpu"
        self.slot_rank = torch.empty(self.capacity, dtype=torch.int64, device=dev)
        self._sync_slot_rank()
        self._served: tuple[torch.Tensor, torch.Tensor] | None = None  # (keys, their slots)
        #: the sync-free path's cursors on the device: [next_serial, consumed, filled]
        self._cur: torch.Tensor | None = None

    def device_cursors(self) -> torch.Tensor:
        """``[next_serial, consumed, filled]`` as an int64 device tensor the sync-free path
        updates in place (its pending batches then hold their first serial and size as device
        scalars); :meth:`sync_cursors` brings them back to the int attributes."""
        if self._cur is None:  # (filled in place: a copy up from the host would wait for it)
            self._cur = torch.empty(3, dtype=torch.int64, device=self.device)
            for i, v in enumerate((self.next_serial, self.consumed, self.filled)):
                self._cur[i].fill_(v)
        return self._cur

    def sync_cursors(self) -> None:
        """The device cursors and the pending batches' device scalars back to ints (one read);
        every host-path entry point calls it first."""
        if self._cur is None:
            return
        dev = [e for e in self.pending if len(e) == 4]
        vals = torch.cat([self._cur, *(torch.stack([e[1], e[2]]) for e in dev)]).tolist()
        self.next_serial, self.consumed, self.filled = vals[:3]
        it = iter(vals[3:])
        self.pending = deque((e[0], next(it), next(it)) if len(e) == 4 else e for e in self.pending)
        self._cur = None

    @property
    def rank_of(self) -> torch.Tensor:
        """Each key's rank (smaller keeps): its next use while announced, else its fallback."""
        return self.keystate[:, _K.RANK]

    @property
    def last_serial(self) -> torch.Tensor:
        """Each key's last announced serial (-1: never)."""
        return self.keystate[:, _K.LAST]

    @property
    def fallback_of(self) -> torch.Tensor:
        """Each key's rank beyond the window (hotness position, then frequency)."""
        return self.keystate[:, _K.FALLBACK]

    # ---- the window ----------------------------------------------------------------------------

    def announce(self, keys: torch.Tensor) -> None:
        """Announce the next batch's unique keys (int64 on ``device``, no repeats)."""
        self.sync_cursors()
        m, dev = int(keys.numel()), self.device
        j = self.announced
        if m == 0:  # an empty batch is served without the cache looking at it
            return
        self._reserve(self.next_serial - self.consumed + m)
        if self.use_kernels:
            _K.announce(
                keys.contiguous().numpy(), self.keystate.numpy(), self.ring_ids.numpy(),
                self.ring_next.numpy(), self.slot_rank.numpy(), self.consumed, self.next_serial, j,
            )  # fmt: skip
            self.pending.append((j, self.next_serial, m))
            self.next_serial += m
            self.announced += 1
            return
        serials = self.next_serial + torch.arange(m, device=dev)
        prev = self.last_serial.index_select(0, keys)
        waiting = prev >= self.consumed  # an earlier occurrence still in the window: link it
        r = self.ring_ids.numel()
        self.ring_next.index_fill_(0, prev[waiting] % r, j)
        fresh = keys[~waiting]  # no pending occurrence: this is their next use
        self.rank_of.index_fill_(0, fresh, j)
        self._ring_put(self.next_serial, keys)
        self.last_serial.index_copy_(0, keys, serials)
        self.pending.append((j, self.next_serial, m))
        self.next_serial += m
        self.announced += 1

    def announce_ids(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """Announce the next batch from its raw ids (int64 on ``device``, repeats allowed),
        deduplicated in the same pass (the CPU kernels): ``(unique, inverse or None)`` as
        :class:`~gnnio.features.batch_ops.FirstOccurrence` returns them. None where the kernels
        do not run (the caller deduplicates and calls :meth:`announce`)."""
        if not self.use_kernels:
            return None
        self.sync_cursors()
        n = int(ids.numel())
        if n == 0:
            return ids, None
        ids = ids.contiguous()
        self._reserve(self.next_serial - self.consumed + n)
        uniq = torch.empty(n, dtype=torch.int64)
        inv = torch.empty(n, dtype=torch.int64)
        m, repeats = _K.announce_dedup(
            ids.numpy(), self.keystate.numpy(), self.ring_ids.numpy(), self.ring_next.numpy(),
            self.slot_rank.numpy(), self.consumed, self.next_serial, self.announced,
            uniq.numpy(), inv.numpy(),
        )  # fmt: skip
        self.pending.append((self.announced, self.next_serial, m))
        self.next_serial += m
        self.announced += 1
        return (uniq[:m], inv) if repeats else (uniq, None)

    def begin_batch(self, keys: torch.Tensor) -> None:
        """The cache serves a batch with unique keys ``keys`` (first-occurrence order): consume the
        oldest announced batch (it must be this one), or announce and consume it at once."""
        self.sync_cursors()
        if not self.pending:
            self.announce(keys)
        _j, a, m = self.pending.popleft()
        if m == keys.numel() and self.use_kernels:
            keys = keys.contiguous()
            slots = torch.empty(m, dtype=torch.int64)
            ok = _K.begin_batch(
                keys.numpy(), self.keystate.numpy(), self.ring_ids.numpy(),
                self.ring_next.numpy(), a, self.slot_rank.numpy(), slots.numpy(),
            )  # fmt: skip
            if ok:
                self.consumed = a + m
                self._served = (keys, slots)
                return
        if m != keys.numel() or not torch.equal(self._ring_get(self.ring_ids, a, m), keys):
            self.pending.appendleft((_j, a, m))
            raise ValueError(
                "lookahead cache: the batch served is not the batch announced next "
                f"({keys.numel()} ids served, {m} announced)"
            )
        nxt = self._ring_get(self.ring_next, a, m)
        self.consumed = a + m
        fb = self.fallback_of.index_select(0, keys)
        fb -= 2 * (((fb - _BEYOND) >> 1) & _FREQ_MAX != 0).long()  # one more use (until 0)
        self.fallback_of.index_copy_(0, keys, fb)
        self.rank_of.index_copy_(0, keys, torch.where(nxt < _INF, nxt, fb))

    def lookup(self, keys: torch.Tensor) -> torch.Tensor:
        """As :meth:`CachePolicy.lookup`; right after :meth:`begin_batch` of the same ``keys``
        the slots its kernel read along with the ranks."""
        served, self._served = self._served, None
        if served is not None and served[0] is keys:
            return served[1]
        return super().lookup(keys)

    def _sync_slot_rank(self) -> None:
        """Recompute ``slot_rank`` from the ranks (after a change made outside the kernels)."""
        f = self.filled
        if f:
            self.slot_rank[:f] = self.rank_of.index_select(0, self.key_of[:f])

    def _fallback(self, keys: torch.Tensor) -> torch.Tensor:
        """Rank of ``keys`` beyond the window (even numbers from ``_BEYOND`` on; smaller keeps)."""
        return self.fallback_of.index_select(0, keys)

    def _ring_get(self, ring: torch.Tensor, a: int, m: int) -> torch.Tensor:
        """The ring entries of serials ``a .. a+m-1`` (a slice unless they wrap around)."""
        r = max(1, ring.numel())
        lo = a % r
        if lo + m <= r:
            return ring[lo : lo + m]
        return ring.index_select(0, (lo + torch.arange(m, device=self.device)) % r)

    def _ring_put(self, a: int, keys: torch.Tensor) -> None:
        """Write ``keys`` at serials ``a ..`` (their next use not known yet)."""
        r, m = self.ring_ids.numel(), int(keys.numel())
        lo = a % r
        if lo + m <= r:
            self.ring_ids[lo : lo + m] = keys
            self.ring_next[lo : lo + m] = _INF
            return
        pos = (lo + torch.arange(m, device=self.device)) % r
        self.ring_ids.index_copy_(0, pos, keys)
        self.ring_next.index_fill_(0, pos, _INF)

    def reset_window(self) -> None:
        """Forget the announced, unserved batches (an epoch stopped early)."""
        self.sync_cursors()
        while self.pending:
            _j, a, m = self.pending.pop()
            ids = self._ring_get(self.ring_ids, a, m)
            self.rank_of.index_copy_(0, ids, self._fallback(ids))
        self.consumed = self.next_serial
        self._sync_slot_rank()

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
        """int64 rank of ``keys`` (smaller keeps): next use inside the window, else the fallback
        (odd for a missed id: cached before missed among equals)."""
        r = self.rank_of.index_select(0, keys)
        return r + (r >= _BEYOND).long() if missed else r

    def admit(
        self, keys: torch.Tensor, ticks: torch.Tensor, check_present: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Insert the misses ``keys`` (unique, int64) that rank among the ``capacity`` best of
        cached ids and misses (module docstring); ``ticks`` are unused. Returns ``(slots, pos,
        evicted)`` as :meth:`CachePolicy.admit`."""
        dev = self.device
        self.sync_cursors()
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
            nres = int(res_keys.numel())
            if self.use_kernels:
                ranks = torch.empty(nres + m, dtype=torch.int64)
                ranks[:nres] = self.slot_rank[s0 : self.filled]
                _K.missed_ranks(
                    self.keystate.numpy(), keys.contiguous().numpy(), ranks[nres:].numpy()
                )
            else:
                ranks = torch.cat([self._rank(res_keys, False), self._rank(keys, True)])
            kept = kept_smallest(ranks, cap - s0)
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
        if self.use_kernels:
            self.slot_rank.index_copy_(0, slots, self.rank_of.index_select(0, new_keys))
        self.filled = min(cap, self.filled + int(slots.numel()))
        if keep is not None:
            pos = keep.index_select(0, pos)
        return slots, pos, int(evicted_slots.numel())

    _CURSORS = ("next_serial", "consumed", "announced")

    def state_dict(self) -> dict:
        """As :meth:`CachePolicy.state_dict`, with the window's cursors; batches announced and not
        served are left out (as after :meth:`reset_window`), and so is the ring."""
        out = super().state_dict()
        for derived in ("ring_ids", "ring_next", "slot_of", "slot_rank"):  # (slot_of: a view)
            out.pop(derived, None)
        for _j, a, m in self.pending:
            ids = self._ring_get(self.ring_ids, a, m)
            out["keystate"][:, _K.RANK].index_copy_(0, ids.cpu(), self._fallback(ids).cpu())
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
        self._served = None
        self._sync_slot_rank()

    def _victims(self, count: int) -> torch.Tensor:  # pragma: no cover - admit() is overridden
        raise AssertionError("LookaheadPolicy chooses victims in admit()")

    def _tensors(self) -> list[torch.Tensor]:
        out = [self.key_of, self.keystate, self.slot_rank]  # (slot_of is a view of keystate)
        return [*out, self.ring_ids, self.ring_next]


def kept_smallest(ranks: torch.Tensor, keep: int) -> torch.Tensor:
    """Mask of the ``keep`` (< ``len(ranks)``) smallest ``ranks``, ties kept in order of position
    (what a stable sort's first ``keep`` are; the sync-free path sorts): O(n), one selection of
    the ``keep``-th smallest value, then the first of the entries equal to it."""
    t = torch.kthvalue(ranks, keep).values
    below = ranks < t
    at = ranks == t
    need = keep - int(below.sum())
    return below | (at & (torch.cumsum(at, 0) <= need))


def make_any_policy(
    policy: str,
    capacity: int,
    num_keys: int,
    device="cpu",
    hot_keys=None,
    lookahead: int | None = 8,
    static_capacity: int = 0,
) -> CachePolicy:
    """:func:`~gnnio.features.caches.policy.make_policy`, plus ``lookahead`` (window
    ``lookahead``) and ``optimal`` (unbounded window: the caller announces the whole trace)."""
    if policy not in POLICIES:  # all of them named, not make_policy's four
        raise ValueError(f"unknown cache policy {policy!r}; choose one of {', '.join(POLICIES)}")
    hot_keys = None if hot_keys is None else hot_key_array(hot_keys)
    if policy == "lookahead":
        return LookaheadPolicy(
            capacity, num_keys, device, int(lookahead or 0), hot_keys, static_capacity
        )
    if policy == "optimal":
        return LookaheadPolicy(capacity, num_keys, device, None, hot_keys, static_capacity)
    if policy in ("sieve", "s3fifo"):
        from .sieve import make_host_policy

        return make_host_policy(policy, capacity, num_keys, device)
    return make_policy(policy, capacity, num_keys, device, hot_keys=hot_keys)
