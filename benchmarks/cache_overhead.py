"""Management time per batch of the cache policies on one trace, interleaved rounds (issue 18).

``gnnio bench cache`` times each policy once, one after the other, so on a shared machine its
``overhead_ms`` mostly measures the load. This script samples one trace and replays it through
every policy in turn for several rounds in the same process, and prints the median and minimum
management ms per batch (announce + lookup + admission) of each::

    .venv/bin/python benchmarks/cache_overhead.py /tmp/syn21 --size 0.1 --rounds 7

``--device cuda`` keeps the cache (buffer, maps, policy state) and the trace on the GPU, as
``gnnio train --device cuda`` does; the lookahead policy then runs its torch path. It also prints
``wall``: the whole replay per batch, synchronised (management plus the misses' host->GPU rows).
``--json`` prints one JSON line instead of the table.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from types import SimpleNamespace

import torch

from gnnio.bench import cache as bc
from gnnio.bench.gather import seed_ids
from gnnio.features import open_store
from gnnio.features.caches.cache import FeatureCache, capacity_rows
from gnnio.graph.dataset import load
from gnnio.sampling import UniformSampler, parse_fanouts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dataset")
    p.add_argument("--size", type=float, default=0.1, help="cache rows as a fraction of nodes")
    p.add_argument("--policies", default="static,fifo,lru,lfu,lookahead")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--batches", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--fanouts", default="15,10,5")
    p.add_argument("--lookahead", type=int, default=8)
    p.add_argument("--device", default="cpu", help="where the cache lives: cpu or cuda")
    p.add_argument("--json", action="store_true", help="one JSON line instead of the table")
    a = p.parse_args()
    dev = torch.device(a.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    ds = load(a.dataset)
    opts = SimpleNamespace(seed=0, po_sequences=None, no_progress=True, score="wrpr",
                           fanouts=a.fanouts, batch_size=a.batch_size)  # fmt: skip
    sampler = UniformSampler(ds.graph, parse_fanouts(a.fanouts), seed=0)
    order = bc._make_order("random", ds, seed_ids(ds), a.batch_size, opts)
    trace = bc._trace(order, sampler, a.batches + a.warmup, "sampling", False)
    hot, _ = bc._static_hot(ds, opts)
    store = open_store(ds, kind="memory", progress=False)
    trace = [t.to(dev) for t in trace]
    buf = torch.empty((max(t.numel() for t in trace), store.dim), dtype=store.dtype, device=dev)
    cap = capacity_rows(a.size, ds.num_nodes)
    cache_cls = functools.partial(FeatureCache, device=dev)
    times: dict[str, list[float]] = {}
    walls: dict[str, list[float]] = {}
    hits: dict[str, float] = {}
    for _ in range(a.rounds):
        for pol in a.policies.split(","):
            sync()
            t0 = time.perf_counter()
            st, announce_ms = bc._replay(
                cache_cls, store, cap, pol, hot, a.lookahead, trace, a.warmup, buf
            )
            sync()
            walls.setdefault(pol, []).append((time.perf_counter() - t0) / len(trace) * 1e3)
            times.setdefault(pol, []).append(st.manage_ms_per_batch + announce_ms)
            hits[pol] = st.hit_ratio
    if a.json:
        print(json.dumps({
            "device": str(dev), "size": a.size, "lookahead": a.lookahead, "rounds": a.rounds,
            "manage_ms_median": {p: statistics.median(v) for p, v in times.items()},
            "manage_ms_min": {p: min(v) for p, v in times.items()},
            "wall_ms_median": {p: statistics.median(v) for p, v in walls.items()},
            "hit_ratio": hits,
        }))  # fmt: skip
        return
    for pol, v in times.items():
        print(f"{pol:10s} median {statistics.median(v):7.2f} ms/batch  min {min(v):7.2f}  "
              f"wall {statistics.median(walls[pol]):7.2f}  hit ratio {hits[pol]:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
