"""Host syncs and ATen ops per batch of a FIFO / static FeatureCache, host path vs the sync-free
path (issue 24, item 2; docs/benchmarks.md). An op is about one kernel launch on a GPU; on the CPU
the sync-free path runs its torch fallback, so its CPU time is not the point.

    python benchmarks/cache_syncs.py
"""

from __future__ import annotations

import time

import numpy as np
import torch

from gnnio.features import InMemoryFeatureStore
from gnnio.features.caches.cache import FeatureCache
from gnnio.utils.syncs import OpCounter


def main() -> None:
    n, dim = 1 << 18, 128
    feats = np.random.default_rng(0).standard_normal((n, dim)).astype(np.float32)
    rng = np.random.default_rng(1)
    batches = [torch.from_numpy((rng.zipf(1.3, 100_000) % n).astype(np.int64)) for _ in range(8)]
    for pol in ("fifo", "static"):
        for free in (False, True):
            c = FeatureCache(InMemoryFeatureStore(feats), n // 10, pol, hot_ids=np.arange(n),
                             sync_free=free)  # fmt: skip
            ops = syncs = 0
            t = 0.0
            for i, b in enumerate(batches):
                with OpCounter() as oc:
                    t0 = time.perf_counter()
                    c.gather(b)
                    dt = time.perf_counter() - t0
                if i >= 2:  # warm batches only
                    ops, syncs, t = ops + oc.ops, syncs + oc.syncs, t + dt
            k = len(batches) - 2
            print(f"{pol:6s} {'sync_free' if free else 'host':9s} ops/batch {ops / k:6.1f} "
                  f"syncs/batch {syncs / k:4.1f} cpu ms/batch {1e3 * t / k:7.1f} "
                  f"hit ratio {c.stats.as_dict()['hit_ratio']:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
