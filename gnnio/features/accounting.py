"""What the feature-store wrappers measure: a cache's :class:`CacheStats`, the wall-clock phase
timer that splits *cache management* from *data movement*, and per-tier row deltas of a backing
store's counters (so a wrapper books the rows its backing served under the backing's tiers)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["CacheStats", "DeferredSplit", "EventLaps", "counters_delta", "snapshot_rows"]


class DeferredSplit:
    """Rows per tier of a two-tier gather, counted on the device and read back only when asked.

    The tiered store's fused gather (one kernel, no hot/cold split on the host) knows how many of a
    batch's rows were hot only as a device tensor; reading it back per batch would be the host
    synchronisation the kernel exists to avoid. :meth:`add` queues the batch's hot count into a
    cumulative device counter (no synchronisation); :meth:`flush`, called when the store's
    counters are read (once per epoch in ``gnnio train``), waits for the device once and books the
    rows since the last flush. The device counter is only ever added to, never reset: a reset
    queued on another stream than the adds could run before an add queued earlier on the host.

    The flush waits for the adds only: each add records an event on its stream, and the flush
    synchronizes the last event of every stream that added since the last flush -- never the
    whole device, which would also wait for the training stream and every copy in flight (the
    loader reads the counters after every batch, from its gather thread:
    :meth:`gnnio.pipeline.stages.EpochRun._gather_one`).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._hot = torch.zeros((), dtype=torch.int64, device=device)
        self._hot_seen = 0  # the counter's value at the last flush
        self._total = 0  # rows added since the last flush (known on the host)
        self._events: dict[int, Any] = {}  # stream handle -> event after its last add (CUDA)
        self._lock = threading.Lock()

    def add(self, hot_mask: torch.Tensor) -> None:
        """Queue one batch: ``hot_mask`` is True where a row came from the hot tier."""
        with self._lock:
            self._hot.add_(hot_mask.sum())
            self._total += int(hot_mask.shape[0])
            if self.device.type == "cuda":
                stream = torch.cuda.current_stream(self.device)
                ev = torch.cuda.Event()
                ev.record(stream)
                self._events[stream.cuda_stream] = ev

    def flush(self, counters: Any, hot_tier: str, cold_tier: str, row_bytes: int) -> None:
        """Book the rows queued since the last flush into ``counters`` (waits for the adds)."""
        with self._lock:
            if not self._total:
                return
            for ev in self._events.values():  # the adds may sit on other streams
                ev.synchronize()
            self._events.clear()
            now = int(self._hot)
            hot, total = now - self._hot_seen, self._total
            self._hot_seen, self._total = now, 0
        if hot:
            counters.add(hot_tier, hot, row_bytes)
        if total - hot:
            counters.add(cold_tier, total - hot, row_bytes)


class EventLaps:
    """Phase laps timed with CUDA events, waiting to be read.

    A lap is a pair of events recorded on the current stream around the phase's queued work; its
    seconds are known once the end event has happened. :meth:`resolve` reads the laps whose end
    event is done (``wait=True``: waits for the last event of each, never the whole device) and
    returns the seconds per phase. Timing with events instead of ``torch.cuda.synchronize()``
    keeps the other streams (the loader's copies, training) running while a cache is timed.
    """

    def __init__(self) -> None:
        self._pending: list[tuple[str, Any, Any]] = []
        self._lock = threading.Lock()

    def mark(self):
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(torch.cuda.current_stream())
        return ev

    def add(self, phase: str, start, end) -> None:
        with self._lock:
            self._pending.append((phase, start, end))

    def __len__(self) -> int:
        return len(self._pending)

    def resolve(self, wait: bool = False) -> dict[str, float]:
        """Seconds per phase of the laps that have completed (all of them with ``wait``)."""
        with self._lock:
            pending, self._pending = self._pending, []
        out: dict[str, float] = {}
        keep = []
        for i, (phase, start, end) in enumerate(pending):
            if wait:
                end.synchronize()
            elif not end.query():
                keep = pending[i:]  # laps complete in order on one stream: stop at the first
                break
            out[phase] = out.get(phase, 0.0) + start.elapsed_time(end) / 1e3
        if keep:
            with self._lock:
                self._pending = keep + self._pending
        return out


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
    laps: EventLaps = field(default_factory=EventLaps, repr=False, compare=False)

    def reset(self) -> None:
        for k, v in CacheStats().__dict__.items():
            setattr(self, k, v)

    def flush(self, wait: bool = True) -> None:
        """Add the seconds of the event-timed laps (CUDA) to ``manage_s`` / ``copy_s``; done
        without waiting after every batch and with waiting by :meth:`as_dict` and the per-batch
        figures, so on a GPU ``manage_s`` / ``copy_s`` read directly may lag a few batches."""
        if len(self.laps):
            for phase, sec in self.laps.resolve(wait).items():
                setattr(self, f"{phase}_s", getattr(self, f"{phase}_s") + sec)

    @property
    def hit_ratio(self) -> float:
        """Mean over batches of the per-batch hit ratio (DESIGN: averaged over an epoch)."""
        return self.hit_ratio_sum / self.batches if self.batches else 0.0

    @property
    def manage_ms_per_batch(self) -> float:
        self.flush()
        return 1e3 * self.manage_s / self.batches if self.batches else 0.0

    @property
    def copy_ms_per_batch(self) -> float:
        self.flush()
        return 1e3 * self.copy_s / self.batches if self.batches else 0.0

    def as_dict(self) -> dict:
        self.flush()
        d = {k: v for k, v in self.__dict__.items() if k not in ("last", "laps")}
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
        self.flush(wait=False)
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


class _Timer:
    """Phases of one call: wall-clock laps on the CPU; on a CUDA device, with ``laps`` given,
    event pairs on the current stream (:class:`EventLaps`; :meth:`lap` then returns 0 and the
    seconds arrive when the laps are resolved). No device-wide synchronisation either way."""

    def __init__(self, device: torch.device, enabled: bool, laps: EventLaps | None = None):
        self.enabled = enabled
        self.laps = laps if enabled and device.type == "cuda" else None
        if self.laps is not None:
            self._last = self.laps.mark()
        self.t = time.perf_counter()

    def lap(self, phase: str = "") -> float:
        if not self.enabled:
            return 0.0
        if self.laps is not None:
            ev = self.laps.mark()
            self.laps.add(phase, self._last, ev)
            self._last = ev
            return 0.0
        now = time.perf_counter()
        d, self.t = now - self.t, now
        return d


def snapshot_rows(counters) -> dict[str, int]:
    return dict(counters.rows)


def counters_delta(before: dict[str, int], counters) -> dict[str, int]:
    """Rows per tier counted by ``counters`` since ``before`` (a :func:`snapshot_rows`)."""
    return {t: r - before.get(t, 0) for t, r in counters.rows.items() if r - before.get(t, 0)}
