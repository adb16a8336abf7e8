"""The feature-store contract.

A feature store maps global node ids to feature rows. ``gather(ids)`` returns the rows on the
store's target device. Every store counts the rows and bytes it served *per tier* (``"gpu"``,
``"host"``, ``"disk"``, ``"peer"``, ...), so hit ratios and traffic come from the code that moved the
data. Caches and tiered stores are wrappers over another store (composition, as in GraphBolt).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from ..utils.capture import device_sync

__all__ = [
    "BatchCount",
    "DeviceRows",
    "FeatureStore",
    "TierCounters",
    "ids_in_range",
    "ids_vouched",
]


class TierCounters:
    """Rows and bytes served per tier since the last reset.

    Two kinds of counts. :meth:`add` books counts the host knows. :meth:`add_device` queues counts
    that a gather knows only as a device tensor (a kernel routed the rows on the GPU; reading the
    count back per batch would be the host synchronisation the kernel exists to avoid): they are
    booked when ``rows``, ``bytes`` or :meth:`snapshot` are read (one device wait, once per epoch in
    ``gnnio train``). :meth:`mark` and :meth:`since` measure what one batch added, device counts
    included, without any wait, but they take in what other threads added meanwhile: a wrapper
    that books the rows its backing served for one call (a cache's miss fetch, the loader's
    batch) uses :meth:`counting`, which collects only the calling thread's adds (another cache,
    loader or thread reading the same store is not booked). :class:`BatchCount` resolves either
    later. A device accumulator is only ever added to, never reset: a reset queued on another
    stream than the adds could run before an add queued earlier on the host.
    """

    def __init__(self) -> None:
        self._rows: dict[str, int] = defaultdict(int)
        self._bytes: dict[str, int] = defaultdict(int)
        # tier -> [cumulative device count, value booked, row bytes]
        self._dev: dict[str, list] = {}
        self._lock = threading.RLock()  # the loader's thread adds and marks while others read
        self._events: dict[int, Any] = {}  # CUDA stream -> event after its last device add

    def __repr__(self) -> str:
        return f"TierCounters(rows={dict(self._rows)}, pending={sorted(self._dev)})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TierCounters):
            return NotImplemented
        return self.snapshot() == other.snapshot()

    @property
    def rows(self) -> dict[str, int]:
        self.flush()
        return self._rows

    @property
    def bytes(self) -> dict[str, int]:
        self.flush()
        return self._bytes

    def add(self, tier: str, rows: int, row_bytes: int) -> None:
        with self._lock:
            self._rows[tier] += int(rows)
            self._bytes[tier] += int(rows) * int(row_bytes)
        for got in _collecting(self):
            got.rows[tier] = got.rows.get(tier, 0) + int(rows)
            got.bytes[tier] = got.bytes.get(tier, 0) + int(rows) * int(row_bytes)

    @contextmanager
    def counting(self) -> Iterator[BatchCount]:
        """Within this block, what *this thread* adds (host counts, device counts queued by
        :meth:`add_device`) is also summed into the yielded :class:`BatchCount`; adds of other
        threads are not. Like :meth:`since`, it lists every tier counted so far (0 where this
        thread added none) and needs no device wait. Inside the block :meth:`device_total` gives
        this call its own accumulator; what a kernel adds to it joins the shared count (and the
        block's sums) when the block ends."""
        got = BatchCount()
        per = _COLLECT.__dict__.setdefault("by", {})
        mine = per.setdefault(id(self), [])
        mine.append(got)
        try:
            yield got
        finally:
            mine.remove(got)
            if not mine:
                del per[id(self)]
            with self._lock:
                for t in self._rows:
                    got.rows.setdefault(t, 0)
                    got.bytes.setdefault(t, 0)
                for part in got.__dict__.pop("_own_totals", ()):
                    t, own, rb, e, added = part
                    got.dev.append((t, own, rb))
                    if not added:  # (once, by the innermost block of this thread)
                        e[0].add_(own)
                        if own.is_cuda:
                            self._note_stream(own.device)
                        part[4] = True

    def add_device(self, tier: str, rows: torch.Tensor, row_bytes: int) -> None:
        """Queue ``rows`` (a 0-d integer tensor on any device) under ``tier``, without a sync."""
        with self._lock:
            e = self._dev.get(tier)
            if e is None:
                e = self._dev[tier] = [torch.zeros((), dtype=torch.int64, device=rows.device), 0,
                                       int(row_bytes)]  # fmt: skip
            e[0].add_(rows)
            if rows.is_cuda:
                self._note_stream(rows.device)
        for got in _collecting(self):
            got.dev.append((tier, rows.clone(), int(row_bytes)))

    def device_total(self, tier: str, row_bytes: int, device: torch.device) -> torch.Tensor:
        """The int64 0-d device accumulator of ``tier`` (made on first use) for a kernel to add
        rows to, without a sync; call :meth:`note_device_add` after queuing that kernel. Inside
        :meth:`counting` on this thread: an accumulator of this call's own (see there)."""
        with self._lock:
            e = self._dev.get(tier)
            if e is None:
                e = self._dev[tier] = [torch.zeros((), dtype=torch.int64, device=device), 0,
                                       int(row_bytes)]  # fmt: skip
            collecting = _collecting(self)
            if not collecting:
                return e[0]
            # inside counting(): this call's own accumulator, added to the shared one (and booked
            # in the block's sums) when the block ends, so other threads' adds are not taken in
            own = torch.zeros((), dtype=torch.int64, device=device)
            part = [tier, own, int(row_bytes), e, False]  # (False: not added to e[0] yet)
            for got in collecting:
                got.__dict__.setdefault("_own_totals", []).append(part)
            return own

    def note_device_add(self, device: torch.device) -> None:
        """A kernel that adds to :meth:`device_total` accumulators was queued on ``device``'s
        current stream (a flush waits for it)."""
        if device.type == "cuda":
            with self._lock:
                self._note_stream(device)

    def _note_stream(self, device: torch.device) -> None:
        """Record an event after this add on the current stream of ``device``: a flush waits for
        the adds' streams, never for the whole device (which would also wait for training)."""
        stream = torch.cuda.current_stream(device)
        ev = torch.cuda.Event()
        ev.record(stream)
        self._events[stream.cuda_stream] = ev

    def add_count(self, count: BatchCount, row_bytes: int) -> None:
        """Book the rows of ``count`` (another store's :meth:`since`) at ``row_bytes`` each: host
        parts now, device parts queued (no wait)."""
        for t, r in count.rows.items():
            if r:
                self.add(t, r, row_bytes)
        for t, d, _ in count.dev:
            self.add_device(t, d, row_bytes)

    def flush(self) -> None:
        """Book the queued device counts (waits for the device once when there are any)."""
        if not self._dev:
            return
        with self._lock:
            for ev in self._events.values():  # the adds may sit on other threads' streams
                ev.synchronize()
            self._events.clear()
            for tier, e in self._dev.items():
                now = int(e[0])
                if now != e[1]:
                    self.add(tier, now - e[1], e[2])
                    e[1] = now

    def reset(self) -> None:
        with self._lock:
            self.flush()
            self._rows.clear()
            self._bytes.clear()

    def snapshot(self) -> dict[str, dict[str, int]]:
        with self._lock:
            self.flush()
            return {"rows": dict(self._rows), "bytes": dict(self._bytes)}

    def mark(self) -> tuple:
        """The counts now, device counts as device copies: no host synchronisation."""
        with self._lock:
            dev = {t: e[0].clone() for t, e in self._dev.items()}
            return dict(self._rows), dict(self._bytes), dev

    def since(self, mark: tuple) -> BatchCount:
        """What was counted after ``mark`` (:meth:`mark`), device parts still on the device."""
        rows0, bytes0, dev0 = mark
        out = BatchCount()
        with self._lock:
            for t, r in self._rows.items():  # every tier counted so far, as a snapshot lists them
                out.rows[t] = r - rows0.get(t, 0)
                out.bytes[t] = self._bytes[t] - bytes0.get(t, 0)
            for t, e in self._dev.items():
                d = e[0] - dev0[t] if t in dev0 else e[0].clone()
                out.dev.append((t, d, e[2]))
        return out


class BatchCount:
    """Rows and bytes per tier counted for some batches, parts of it still device tensors
    (:meth:`TierCounters.since`). :meth:`add` sums without a wait; :meth:`resolve` returns the
    plain ``{"rows": {...}, "bytes": {...}}`` (one device wait when there are device parts)."""

    def __init__(self, counted: dict | None = None) -> None:
        self.rows: dict[str, int] = dict((counted or {}).get("rows", {}))
        self.bytes: dict[str, int] = dict((counted or {}).get("bytes", {}))
        self.dev: list[tuple[str, torch.Tensor, int]] = []

    def add(self, other: BatchCount | dict) -> None:
        if isinstance(other, dict):
            other = BatchCount(other)
        for kind in ("rows", "bytes"):
            mine = getattr(self, kind)
            for t, v in getattr(other, kind).items():
                mine[t] = mine.get(t, 0) + v
        if other.dev:  # one running device sum per tier: no list growing with the batches
            sums = {(t, rb): i for i, (t, _, rb) in enumerate(self.dev)}
            for t, d, rb in other.dev:
                if d.is_cuda:  # made on the loader's stream, read on this one: keep its memory
                    d.record_stream(torch.cuda.current_stream(d.device))
                i = sums.get((t, rb))
                if i is None:
                    sums[(t, rb)] = len(self.dev)
                    self.dev.append((t, d.clone(), rb))
                else:
                    self.dev[i][1].add_(d)

    def resolve(self) -> dict[str, dict[str, int]]:
        rows, byts = dict(self.rows), dict(self.bytes)
        _wait_for(d for _, d, _ in self.dev)
        for t, d, rb in self.dev:
            v = int(d)
            if v:
                rows[t] = rows.get(t, 0) + v
                byts[t] = byts.get(t, 0) + v * rb
        return {"rows": rows, "bytes": byts}


_VOUCHED = threading.local()
_COLLECT = threading.local()  # .by: id(TierCounters) -> this thread's open counting() sums


def _collecting(counters: TierCounters) -> list[BatchCount]:
    """The :meth:`TierCounters.counting` blocks this thread has open on ``counters``."""
    by = getattr(_COLLECT, "by", None)
    return by.get(id(counters), ()) if by else ()  # type: ignore[return-value]


@contextmanager
def ids_in_range() -> Iterator[None]:
    """Within this block (this thread only), stores skip the range check of ids that are already
    on their GPU: the caller vouches that every id is in ``[0, num_rows)``. The check reads the
    ids' minimum and maximum back to the host -- a synchronisation per batch -- so the loader
    enters this block around its gather: its ids come from a sampler over the validated CSR
    (:class:`~gnnio.sampling.base.Sampler`'s contract). Ids from the host are checked anyway
    (that costs no device wait)."""
    before = getattr(_VOUCHED, "on", False)
    _VOUCHED.on = True
    try:
        yield
    finally:
        _VOUCHED.on = before


def ids_vouched() -> bool:
    """Whether this thread is inside :func:`ids_in_range`."""
    return getattr(_VOUCHED, "on", False)


def _wait_for(tensors) -> None:
    """Wait for every stream of the devices ``tensors`` live on (they may be written on a side
    stream the reading thread does not know)."""
    for dev in {t.device for t in tensors if t.device.type == "cuda"}:
        device_sync(dev)  # (never beside a CUDA graph capture: gnnio.utils.capture)


@dataclass(frozen=True)
class DeviceRows:
    """Where a store's rows lie on its device, for a kernel that reads them by id
    (:meth:`FeatureStore.device_rows`): row ``id`` is ``hot[t]`` with ``t = table[id]`` (a
    ``table`` given) or ``t = id`` for ``id < prefix`` (no table), when ``t >= 0``; else
    ``cold[id]``. Rows read from ``hot`` count under ``hot_tier``, from ``cold`` under
    ``cold_tier`` (in ``counters``, the store's); ``on_read()`` is called after queuing a read."""

    hot: torch.Tensor
    cold: torch.Tensor
    table: torch.Tensor | None
    prefix: int
    hot_tier: str
    cold_tier: str
    counters: TierCounters
    on_read: Callable[[], None]


class FeatureStore(ABC):
    """Maps global ids to feature rows on ``self.device``.

    Subclasses set ``num_rows``, ``dim``, ``dtype``, ``device`` and implement :meth:`gather`.
    """

    num_rows: int
    dim: int
    dtype: torch.dtype
    device: torch.device

    def __init__(self) -> None:
        self.counters = TierCounters()

    @property
    def row_bytes(self) -> int:
        return self.dim * self.dtype.itemsize  # (no tensor made: read several times a batch)

    @abstractmethod
    def gather(self, ids: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rows ``ids`` (int64 global ids, any order, repeats allowed) as a ``[len(ids), dim]``
        tensor on ``self.device``. With ``out`` the rows are written into ``out[:len(ids)]`` (a
        reused buffer avoids page faults from a fresh allocation per batch) and that view returned.
        Raises IndexError for ids outside ``[0, num_rows)``."""

    def gather_into(
        self, ids: torch.Tensor, out: torch.Tensor, mask: torch.Tensor
    ) -> list[tuple[str, torch.Tensor]] | None:
        """Write row ``ids[i]`` into ``out[i]`` where ``mask[i]``, leaving the other rows of
        ``out`` as they are, **without a host synchronisation** (the caches' misses on a GPU).
        ``ids`` are int64 on ``self.device`` and in range where ``mask`` (not checked); ``out``
        and ``mask`` have ``len(ids)`` rows. Returns the rows served per tier as 0-d device
        tensors (also queued in :attr:`counters`), or None when this store cannot do it without
        a sync -- then nothing was written and the caller gathers the masked ids itself. The
        default: None."""
        return None

    def device_rows(self) -> DeviceRows | None:
        """Where the rows lie on :attr:`device` for a kernel to read them by id (the caches' fused
        batch, :mod:`gnnio.features.caches._triton_cache`); None where they are not all readable
        there (the default)."""
        return None
