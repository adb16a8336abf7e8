"""Management time per batch of the cache policies on one trace, interleaved rounds (issue 18).

``gnnio bench cache`` times each policy once, one after the other, so on a shared machine its
``overhead_ms`` mostly measures the load. This script samples one trace and replays it through
every policy in turn for several rounds in the same process, and prints the median and minimum
management ms per batch (announce + lookup + admission) of each::

    .venv/bin/python benchmarks/cache_overhead.py /tmp/syn21 --size 0.1 --rounds 7
"""

from __future__ import annotations

import argparse
import statistics
from types import SimpleNamespace

import torch

from gnnio.bench import cache as bc
from gnnio.bench.gather import seed_ids
from gnnio.features import open_store
from gnnio.features.cache import FeatureCache, capacity_rows
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
    a = p.parse_args()
    ds = load(a.dataset)
    opts = SimpleNamespace(seed=0, po_sequences=None, no_progress=True, score="wrpr",
                           fanouts=a.fanouts, batch_size=a.batch_size)  # fmt: skip
    sampler = UniformSampler(ds.graph, parse_fanouts(a.fanouts), seed=0)
    order = bc._make_order("random", ds, seed_ids(ds), a.batch_size, opts)
    trace = bc._trace(order, sampler, a.batches + a.warmup, "sampling", False)
    hot, _ = bc._static_hot(ds, opts)
    store = open_store(ds, kind="memory", progress=False)
    buf = torch.empty((max(t.numel() for t in trace), store.dim), dtype=store.dtype)
    cap = capacity_rows(a.size, ds.num_nodes)
    times: dict[str, list[float]] = {}
    for _ in range(a.rounds):
        for pol in a.policies.split(","):
            st, announce_ms = bc._replay(
                FeatureCache, store, cap, pol, hot, a.lookahead, trace, a.warmup, buf
            )
            times.setdefault(pol, []).append(st.manage_ms_per_batch + announce_ms)
    for pol, v in times.items():
        print(f"{pol:10s} median {statistics.median(v):7.2f} ms/batch  min {min(v):7.2f}")


if __name__ == "__main__":
    main()
