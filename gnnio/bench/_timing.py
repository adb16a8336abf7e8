"""Shared timing helpers for ``gnnio bench``: warm-up passes, then the median of timed passes.

All times are wall-clock seconds measured with :func:`time.perf_counter`. A "pass" is one call of
the function being measured (e.g. sampling N batches); callers divide by the work done per pass.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["time_passes", "median"]


def time_passes(
    fn: Callable[[], Any],
    warmup: int = 1,
    passes: int = 5,
    sync: Callable[[], Any] | None = None,
) -> list[float]:
    """Run ``fn()`` ``warmup`` times untimed, then ``passes`` times timed.

    Args:
        fn: the work of one pass (no arguments; its result is discarded).
        warmup: untimed calls first (JIT compilation, page faults, cache warm-up).
        passes: timed calls, at least 1.
        sync: optional barrier called before starting and before stopping each timer, e.g.
            ``torch.cuda.synchronize`` so asynchronous GPU work is inside the measured interval.

    Returns:
        The wall-clock seconds of each timed pass, in call order.
    """
    if warmup < 0:
        raise ValueError(f"time_passes: warmup must be >= 0, got {warmup}")
    if passes < 1:
        raise ValueError(f"time_passes: passes must be >= 1, got {passes}")
    for _ in range(warmup):
        fn()
    if sync is not None:
        sync()
    times: list[float] = []
    for _ in range(passes):
        t0 = time.perf_counter()
        fn()
        if sync is not None:
            sync()
        times.append(time.perf_counter() - t0)
    return times


def median(xs: Sequence[float]) -> float:
    """Median of a non-empty sequence (mean of the two middle values for even lengths)."""
    if len(xs) == 0:
        raise ValueError("median: empty sequence")
    return float(statistics.median(xs))
