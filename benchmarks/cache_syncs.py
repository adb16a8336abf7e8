"""Host syncs and ATen ops per batch of a FIFO / static / lookahead FeatureCache, host path vs the
sync-free path (issue 24, items 2 and 5; docs/benchmarks.md). An op is about one kernel launch on a GPU; on
the CPU the sync-free path runs its torch fallback, so its CPU time is not the point.

    python benchmarks/cache_syncs.py              # the torch fallback over an in-memory store
    python benchmarks/cache_syncs.py --interpret  # as a GPU runs it (Triton's interpreter)
    python benchmarks/cache_syncs.py --interpret --by-op   # which ops, from which line

``--rows``, ``--dim`` and ``--batch`` shrink the store and the batches for a quick check of the
script (syncs and launches per batch stay the same, ops per batch about; hit ratios and times not).

``--interpret`` re-runs itself under ``TRITON_INTERPRET=1`` so the Triton branches run on CPU
tensors as they would on a GPU, with the cache over a tiered store of 0 % hot rows (the misses
read zero-copy, as ``gnnio train --cache-policy`` builds it on a GPU); Triton launches are counted
apart (``launches/batch``) and the torch ops the interpreter runs inside a launch are not counted
as the host's. ``--by-op`` prints each op name and the gnnio line that dispatched it.

The lookahead cache (window K = 4) is counted per batch served plus the announcement of the batch
K ahead, as the loader does; its host path runs its torch ops (a GPU's, not the CPU kernels), and
the ids reach it as a GPU's loader hands them (int64 on the cache's device: ``ids_on`` passes
them through, so the announced batch is recognised without comparing a copy).
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch

from gnnio.features import InMemoryFeatureStore
from gnnio.features.caches import cache as cache_mod
from gnnio.features.caches.cache import FeatureCache
from gnnio.utils.syncs import OpCounter


class _Ops(OpCounter):
    """:class:`OpCounter` that skips the ops run inside a Triton launch (the interpreter's) and,
    with ``by_op``, counts ops by ``name @ file:line`` (the innermost gnnio frame)."""

    def __init__(self, by_op: bool) -> None:
        super().__init__()
        self.paused, self.by_op, self.names = False, by_op, collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.paused:
            return func(*args, **(kwargs or {}))
        if self.by_op:
            st = [f for f in traceback.extract_stack()[:-1] if "/gnnio/" in f.filename]
            at = f"{Path(st[-1].filename).name}:{st[-1].lineno}" if st else "?"
            self.names[f"{func.overloadpacket.__name__} @ {at}"] += 1
        return super().__torch_dispatch__(func, types, args, kwargs)


_COUNTER: list = [None]
LAUNCHES: collections.Counter = collections.Counter()


def _count_launches() -> None:
    """Count Triton launches by kernel; the active :class:`_Ops` pauses inside them."""
    from triton.runtime.jit import KernelInterface

    real = KernelInterface.__getitem__

    def getitem(self, grid):
        launch = real(self, grid)

        def run(*a, **k):
            c = _COUNTER[0]
            if c is not None:
                c.paused = True
            try:
                return launch(*a, **k)
            finally:
                if c is not None:
                    c.paused = False
                LAUNCHES[getattr(getattr(self, "fn", None), "__name__", "?")] += 1

        return run

    KernelInterface.__getitem__ = getitem


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--interpret", action="store_true", help="the Triton branches, interpreted")
    ap.add_argument("--by-op", action="store_true", help="ops per name and line (sync-free)")
    ap.add_argument(
        "--rows",
        type=int,
        default=None,
        help="rows in the store (default 2^18; 2^16 with --interpret)",
    )
    ap.add_argument(
        "--dim",
        type=int,
        default=None,
        help="float32 values per row (default 128; 32 with --interpret)",
    )
    ap.add_argument(
        "--batch",
        type=int,
        default=None,
        help="ids per batch (default 100,000; 10,000 with --interpret)",
    )
    a = ap.parse_args()
    for name in ("rows", "dim", "batch"):
        if getattr(a, name) is not None and getattr(a, name) < 1:
            ap.error(f"--{name} must be >= 1, got {getattr(a, name)}")
    if a.interpret and os.environ.get("TRITON_INTERPRET") != "1":
        env = {**os.environ, "TRITON_INTERPRET": "1"}
        sys.exit(subprocess.call([sys.executable, *sys.argv], env=env))
    if a.interpret:
        _count_launches()
    # the interpreter is slow: smaller rows and batches there (counts per batch do not change)
    n, dim, bs = (1 << 16, 32, 10_000) if a.interpret else (1 << 18, 128, 100_000)
    n, dim, bs = a.rows or n, a.dim or dim, a.batch or bs
    feats = np.random.default_rng(0).standard_normal((n, dim)).astype(np.float32)
    rng = np.random.default_rng(1)
    k = 4  # the lookahead cache's window
    batches = [torch.from_numpy((rng.zipf(1.3, bs) % n).astype(np.int64)) for _ in range(8 + k)]
    cache_mod.ids_on = lambda store, ids, device: ids.long()  # as on a GPU (module docstring)

    def backing():
        if not a.interpret:
            return InMemoryFeatureStore(feats)
        from gnnio.features.tiers.simdevice import SimulatedDevice
        from gnnio.features.tiers.tiered import TieredFeatureStore

        return TieredFeatureStore(torch.from_numpy(feats), 0, simulate=SimulatedDevice())

    for pol in ("fifo", "static", "lookahead"):
        ahead = k if pol == "lookahead" else 0
        for free in (False, True):
            c = FeatureCache(backing(), n // 10, pol, hot_ids=np.arange(n), sync_free=free,
                             lookahead=k)  # fmt: skip
            if pol == "lookahead":
                c.policy.use_kernels = False  # the host path as on a GPU: torch ops
            for b in batches[:ahead]:
                c.announce(b)
            ops = syncs = launches = 0
            t = 0.0
            names: collections.Counter = collections.Counter()
            for i, b in enumerate(batches[:8]):
                oc = _COUNTER[0] = _Ops(a.by_op and free)
                LAUNCHES.clear()
                with oc:
                    t0 = time.perf_counter()
                    c.gather(b)
                    if ahead:
                        c.announce(batches[i + ahead])
                    dt = time.perf_counter() - t0
                _COUNTER[0] = None
                if i >= 2:  # warm batches only
                    ops, syncs, t = ops + oc.ops, syncs + oc.syncs, t + dt
                    launches += sum(LAUNCHES.values())
                    names += oc.names
            w = 8 - 2
            print(f"{pol:9s} {'sync_free' if free else 'host':9s} ops/batch {ops / w:6.1f} "
                  f"syncs/batch {syncs / w:4.1f} launches/batch {launches / w:4.1f} "
                  f"cpu ms/batch {1e3 * t / w:7.1f} "
                  f"hit ratio {c.stats.as_dict()['hit_ratio']:.3f}")  # fmt: skip
            for name, cnt in sorted(names.items(), key=lambda x: (-x[1], x[0])):
                print(f"    {cnt / w:5.1f}  {name}")


if __name__ == "__main__":
    main()
