"""How well a seed order mixes: the *shuffling error* of an order (the mean total-variation
distance between a batch's label distribution and that of all seeds) and BGL's bound on it (step 3
of :mod:`gnnio.ordering.po`, whose docstring discusses which bound to use).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["paper_bound", "shuffling_error"]


def _batch_bounds(n: int, batch_size: int, world_size: int) -> list[tuple[int, int]]:
    """``[start, end)`` of every *full* batch of every rank (the :class:`SeedOrder` sharding); the
    last partial batch of a rank is used only when the rank has no full batch."""
    out = []
    for r in range(world_size):
        lo, hi = r * n // world_size, (r + 1) * n // world_size
        full = (hi - lo) // batch_size
        out += [(lo + i * batch_size, lo + (i + 1) * batch_size) for i in range(full)]
        if full == 0 and hi > lo:
            out.append((lo, hi))
    return out


def shuffling_error(
    order_labels: np.ndarray, batch_size: int, world_size: int = 1, num_classes: int | None = None
) -> float:
    """Mean over batches of the total-variation distance between a batch's label distribution and
    the label distribution of all seeds (:mod:`gnnio.ordering.po`, step 3).

    Args:
        order_labels: int labels of the seeds in epoch order (``-1`` = unlabeled: ignored, both in
            the batches and in the global distribution).
        batch_size: seeds per batch; ``world_size``: ranks (contiguous shards, as SeedOrder).
        num_classes: number of classes (default ``max label + 1``).

    Returns:
        A value in ``[0, 1]``: 0 when every batch has exactly the global proportions.
    """
    lab = np.asarray(order_labels, dtype=np.int64)
    n = lab.shape[0]
    valid = lab >= 0
    if n == 0 or not valid.any():
        return 0.0
    c = int(num_classes) if num_classes is not None else int(lab[valid].max()) + 1
    q = np.bincount(lab[valid], minlength=c).astype(np.float64)
    q /= q.sum()
    bounds = _batch_bounds(n, int(batch_size), int(world_size))
    batch_of = np.full(n, -1, dtype=np.int64)
    for i, (s, e) in enumerate(bounds):
        batch_of[s:e] = i
    keep = valid & (batch_of >= 0)
    counts = np.bincount(batch_of[keep] * c + lab[keep], minlength=len(bounds) * c).reshape(-1, c)
    sizes = counts.sum(1)
    used = sizes > 0
    if not used.any():
        return 0.0
    p = counts[used] / sizes[used, None]
    return float(0.5 * np.abs(p - q[None, :]).sum(1).mean())


def paper_bound(batch_size: int, world_size: int, num_seeds: int) -> float:
    """BGL's (Meng et al.'s) convergence condition on the shuffling error: ``sqrt(b M) / n``."""
    return math.sqrt(batch_size * world_size) / max(1, num_seeds)
