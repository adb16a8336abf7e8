"""What the feature-store wrappers measure: a cache's :class:`CacheStats`, the wall-clock phase
timer that splits *cache management* from *data movement*, and per-tier row deltas of a backing
store's counters (so a wrapper books the rows its backing served under the backing's tiers)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

__all__ = ["CacheStats", "counters_delta", "snapshot_rows"]


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
