"""How many items "the top fraction" of a set is: one rounding rule for every part of gnnio.

A base utility (no gnnio imports) so that the dataset layer, the stores, placement and the
preprocessing stage all round the same way without importing each other.
"""

from __future__ import annotations

import math
from fractions import Fraction

__all__ = ["top_count"]


def top_count(fraction: float, n: int) -> int:
    """How many nodes "the top ``fraction`` of ``n`` nodes" is -- the one rule gnnio uses for hot
    tiers, cache capacities, placement buffers and the hotness benchmark.

    The count nearest to ``fraction * n``, halves rounded **up** (not Python's round-half-to-even,
    so ``top_count(0.25, 10) == 3`` like ``top_count(0.35, 10) == 4``), computed exactly on the
    decimal value of ``fraction`` (``top_count(0.15, 10) == 2`` although ``0.15 * 10`` is not 1.5
    in binary floating point); then clamped: at least 1 when ``fraction > 0`` and ``n > 0`` (a
    positive fraction never means an empty tier), at most ``n`` (fractions >= 1 mean all nodes).
    ``fraction == 0`` or ``n == 0`` gives 0.

    Why not ``ceil``: it overshoots by up to one node per call (``ceil(0.1 * 11) == 2``, 18 %);
    nearest-with-a-floor-of-one is never more than half a node off except for that floor.

    Raises:
        ValueError: ``fraction`` is negative or not finite, or ``n`` is negative.
    """
    f = float(fraction)
    if not math.isfinite(f) or f < 0:
        raise ValueError(f"fraction must be a finite number >= 0, got {fraction!r}")
    n = int(n)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if f == 0 or n == 0:
        return 0
    if f >= 1:
        return n
    # repr(f) is the shortest decimal that reads back as f: the value the user wrote
    k = math.floor(Fraction(repr(f)) * n + Fraction(1, 2))
    return min(n, max(1, k))
