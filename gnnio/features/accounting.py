"""What the feature-store wrappers measure: a cache's :class:`CacheStats` and the phase timer that
splits *cache management* from *data movement*. (A wrapper books the rows its backing served
under the backing's tiers with the backing's ``counters.counting()`` -- the rows its own thread
fetched, not another reader's -- and its own ``counters.add_count()``:
:class:`~gnnio.features.base.TierCounters`.)"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from ..utils.capture import device_sync

__all__ = ["CacheStats", "EventLaps"]


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

    A cache books each batch at its end, under the cache's lock. Nothing else is locked: read
    from another thread while the cache gathers, the fields may be a batch apart, and
    :meth:`reset` (or :meth:`flush` from two threads) is for when no gather runs.

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
    # the sync-free path's counts (unique, hits, misses, insertions, evictions, hit ratio, fetched
    # and hit bytes), summed on the device, never reset; and their value at the last flush
    _dev: torch.Tensor | None = field(default=None, repr=False, compare=False)
    _dev_seen: list = field(default_factory=lambda: [0.0] * 8, repr=False, compare=False)

    def reset(self) -> None:
        self.flush()
        keep = {"_dev": self._dev, "_dev_seen": self._dev_seen}
        for k, v in CacheStats().__dict__.items():
            setattr(self, k, keep.get(k, v))

    def flush(self, wait: bool = True) -> None:
        """Add the seconds of the event-timed laps (CUDA) to ``manage_s`` / ``copy_s``; done
        without waiting after every batch and with waiting by :meth:`as_dict` and the per-batch
        figures, so on a GPU ``manage_s`` / ``copy_s`` read directly may lag a few batches. With
        ``wait`` also books the counts the sync-free path summed on the device (one wait)."""
        if wait and self._dev is not None:
            if self._dev.device.type == "cuda":
                device_sync(self._dev.device)  # (never beside a CUDA graph capture)
            now = self._dev.tolist()
            d = [a - b for a, b in zip(now, self._dev_seen, strict=True)]
            self._dev_seen = now
            for k, v in zip(_DEV_FIELDS, d, strict=True):
                setattr(self, k, getattr(self, k) + (v if k == "hit_ratio_sum" else round(v)))
        if len(self.laps):
            for phase, sec in self.laps.resolve(wait).items():
                setattr(self, f"{phase}_s", getattr(self, f"{phase}_s") + sec)

    @property
    def hit_ratio(self) -> float:
        """Mean over batches of the per-batch hit ratio (DESIGN: averaged over an epoch)."""
        self.flush()
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
        d = {k: v for k, v in self.__dict__.items() if k not in ("last", "laps") and k[0] != "_"}
        d.update(
            hit_ratio=self.hit_ratio,
            manage_ms_per_batch=self.manage_ms_per_batch,
            copy_ms_per_batch=self.copy_ms_per_batch,
        )
        return d

    def _record_device(self, n, unique, hits, misses, ins, ev, row_bytes, manage, copy) -> None:
        """:meth:`_record` with the counts as device scalars (``n`` known on the host): summed on
        the device, booked by :meth:`flush` (``last`` holds only what the host knows)."""
        like = next(x for x in (hits, misses, unique, ins, ev) if isinstance(x, torch.Tensor))
        one = torch.stack([_on_device(x, like) for x in (unique, hits, misses, ins, ev)])
        u = one[0]
        ratio = torch.where(u > 0, one[1] / u.clamp(min=1), 0.0)
        vec = torch.cat([one, ratio.reshape(1), one[2:3] * row_bytes, one[1:2] * row_bytes])
        self._device_sums(vec.device).add_(vec)
        self._booked_on_device(n, manage, copy)

    def _device_sums(self, device: torch.device) -> torch.Tensor:
        """The float64 ``[8]`` device accumulator of the counts in :data:`_DEV_FIELDS` order
        (made on first use); a kernel may add a batch's counts to it (the caches' fused batch)."""
        if self._dev is None:
            self._dev = torch.zeros(8, dtype=torch.float64, device=device)
        return self._dev

    def _booked_on_device(self, n: int, manage: float, copy: float) -> None:
        """The host's part of a batch whose counts were added to :meth:`_device_sums`."""
        self.batches += 1
        self.queries += n
        self.manage_s += manage
        self.copy_s += copy
        self.flush(wait=False)
        self.last = dict(queries=n, manage_s=manage, copy_s=copy)

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


def _on_device(x, like: torch.Tensor) -> torch.Tensor:
    """``x`` as a float64 scalar on ``like``'s device (a fill, not a copy from host memory)."""
    if isinstance(x, torch.Tensor):
        return x.to(torch.float64)
    return torch.full((), float(x), dtype=torch.float64, device=like.device)


_DEV_FIELDS = ("unique_queries", "hits", "misses", "insertions", "evictions", "hit_ratio_sum",
               "fetched_bytes", "hit_bytes")  # fmt: skip


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
