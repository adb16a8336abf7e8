"""Preprocessing: what gnnio computes once per dataset before training.

- :mod:`.hotness` -- per-node scores that predict how often a feature row is read (degree, reverse
  PageRank, weighted reverse PageRank, Song & Jiang's L-hop estimate, pre-sampling counts): the
  registry; the scores themselves are in :mod:`.graph_scores` and :mod:`.presample`;
- :mod:`.reorder` -- relabel the graph and features hottest-first (Data Tiering Algorithm 2);
- :mod:`.partition` -- split the topology over ranks or machines (random, range, METIS, BGL's
  BFS-block partitioner, HyDRA's HDR replication), its on-disk format and quality report.

Placement of feature rows lives in :mod:`gnnio.placement`. Submodules are imported on first use (they need
numba), so ``import gnnio.preprocess`` is cheap.
"""

from __future__ import annotations

import importlib

__all__ = ["graph_scores", "hotness", "partition", "presample", "reorder"]


def __getattr__(name: str):
    if name in __all__:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
