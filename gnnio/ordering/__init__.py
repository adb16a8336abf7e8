"""Seed order: the order in which training seeds are visited, per epoch and per rank.

- :mod:`.shuffle` -- the :class:`SeedOrder` contract (sharding over ranks, batching) and
  :class:`RandomOrder`, the seeded shuffle;
- :mod:`.po` -- BGL's proximity-aware order (:class:`ProximityOrder`, BFS sequences, needs numba;
  imported on first use), built from :mod:`.bfs` (BFS regions and their combination) and
  :mod:`.quality` (the shuffling error it is bounded by).
"""

from __future__ import annotations

import importlib

from .shuffle import RandomOrder, SeedOrder

__all__ = ["SeedOrder", "RandomOrder", "ProximityOrder", "shuffling_error"]


def __getattr__(name: str):
    if name in ("ProximityOrder", "shuffling_error"):
        return getattr(importlib.import_module(".po", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
