"""A rank's cache in front of host memory (``--cache-policy`` with several ranks).

Each rank puts a :class:`~gnnio.features.caches.cache.FeatureCache` (tier ``cache``) in front of
its host reads; rows on its own shard or a peer's never reach it. With the intra-machine reuse
level (``--reuse-level machine``, :mod:`gnnio.distributed.group_reuse`) a row no member of the
NVLink group holds is read by member ``id mod g``, so the group's caches hold disjoint residues:
together one CPU cache per machine, BGL's CPU level "on top of the multi-GPU cache" (each
residue's own policy: a deviation from one policy over the machine's rows). A static cache then
holds the hottest rows of its residue.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..utils.pages import drop_pages
from .group_reuse import machine_level, residue_of
from .hostrows import PreadFeatureStore

__all__ = ["host_cache"]


def host_cache(ds, cfg, ctx, pl, base) -> tuple[Any, dict | None]:
    """``(store, info)``: ``base`` behind the rank's cache and the summary's ``cache`` entry, or
    ``(base, None)`` without a cache."""
    if cfg.cache_policy == "none" or cfg.cache_size <= 0:
        return base, None
    from ..features.caches.cache import FeatureCache
    from ..features.tiers.tiered import hot_rows_for_fraction

    topo = ctx.topo
    residue = machine_level(topo, cfg.reuse and cfg.reuse_level)
    hot = None
    if cfg.cache_policy == "static":
        from ..train.setup import hot_score

        score = hot_score(ds, cfg, progress=False)
        for a in (ds.graph.indptr, ds.graph.indices):  # read once, at set-up: the
            drop_pages(a)  # pages leave this rank's mapping (as in plan.py)
        # the same lookup as the store's: rows this rank reads from its shard or a peer's
        peers = bool(pl.peer_reads) and topo.peers_cheaper
        held = np.asarray(pl.lookup(ctx.rank, peers=peers).dev_num) >= 0
        hot = np.argsort(-score, kind="stable")
        hot = hot[~held[hot]]  # rows the rank reads from host memory only
        if residue:  # ... and, at the machine level, of its residue
            g, i = residue_of(topo, ctx.rank)
            hot = hot[hot % g == i]
    cap = hot_rows_for_fraction(min(cfg.cache_size, 1.0), ds.num_nodes)
    # the misses read by pread too (hostrows.py): nothing of the feature file mapped
    back = PreadFeatureStore(base, cfg.threads) if cfg.store == "mmap" else base
    host = FeatureCache(back, cap, cfg.cache_policy, hot_ids=hot, tier="cache")
    where = "in front of host memory, per rank"
    if residue:
        where += "; the rows of its residue (id mod group size): one cache per NVLink group"
    info = {"policy": cfg.cache_policy, "size": cfg.cache_size, "capacity": host.capacity,
            "where": where}  # fmt: skip
    return host, info
