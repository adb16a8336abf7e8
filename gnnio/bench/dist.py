"""``gnnio bench dist DIR --nproc N``: the feature fetch of data-parallel ranks, per placement.

N ranks (local processes started by PyTorch's elastic launcher, or the ranks of a ``torchrun``
launch) each sample the first ``--batches`` batches of their slice of one global shuffle, then,
for every strategy of ``--strategies``: the placement is computed on rank 0 and broadcast (its
time is not counted), every rank builds its :class:`~gnnio.distributed.store.ShardedFeatureStore`
(the rows of its buffer; host rows from the memory-mapped features), one untimed warm-up gather,
then the batches' gathers (the first ``--batches`` of epoch 1; the warm-up is epoch 0's first),
each one collective step on all ranks.

Reported per strategy: ``bytes_by_link`` (**measured**: rows received per link at the
all_to_all buffers, the own shard and host reads; summed over ranks and ``per_rank``),
``modeled_bytes_by_link`` (the Eq. 3 cost model's rows for the same deduplicated reads),
``fetch_ms_per_batch`` (**measured** wall clock of one gather, mean over batches, the slowest
rank: data-parallel ranks wait for each other) and ``modeled_fetch_ms_per_batch`` (Eq. 3 seconds
from the topology's bandwidths, slowest rank). With ``--reuse`` / ``--reuse-level``: ``reuse_bytes``
(rows copied from a rank's own previous batch) and ``forwarded_bytes`` (intra-machine level: rows
a rank got from a member of its NVLink group, part of ``peer``; ``forwarded_from_prev_bytes``: of
those, rows the member held from its previous batch). Without GPUs the devices are simulated: the
times are those of gloo collectives over loopback TCP between CPU processes plus CPU gathers, not
of NVLink or PCIe, and ``all_to_all_ceiling_GBps`` (a raw ``all_to_all_single`` of 16 MiB per
rank, measured in the same run) is the ceiling they are held against.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import numpy as np

from ..errors import UsageError
from . import KINDS

HELP = KINDS["dist"]
DESCRIPTION = __doc__.split("\n\n", 1)[1] if __doc__ else HELP

DEFAULT_STRATEGIES = "alg1,interleaved,mod,rule1"
LINKS = ("local", "peer", "host", "network")


def add_arguments(p) -> None:
    p.add_argument("dataset", metavar="DIR", help="a prepared gnnio dataset directory")
    p.add_argument("--nproc", type=int, default=2, help="local ranks (ignored under torchrun)")
    p.add_argument(
        "--topology", default=None, help="NVLink groups of the ranks (default: one per machine)"
    )
    p.add_argument("--buffer", type=float, default=0.1, help="rows per rank, fraction of nodes")
    p.add_argument(
        "--strategies",
        default=DEFAULT_STRATEGIES,
        help="placements to compare: alg1, interleaved, mod, rule1, metis, naive, random",
    )
    p.add_argument("--batches", type=int, default=10, help="batches per rank and strategy")
    p.add_argument("--batch-size", type=int, default=1024, help="seeds per batch per rank")
    p.add_argument("--fanouts", default="15,10,5", help="neighbours sampled per hop")
    p.add_argument(
        "--threads", type=int, default=None, help="CPU threads per rank (default: cores / ranks)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the order, sampler, placement")
    p.add_argument(
        "--reuse",
        action="store_true",
        help="HyDRA cross-batch reuse (off by default, so measured bytes match the cost model)",
    )
    p.add_argument(
        "--reuse-level",
        choices=("gpu", "machine"),
        default=None,
        help="with reuse: a rank's own previous batch (gpu), or also HyDRA's intra-machine "
        "level (machine: an NVLink group reads each host row once); implies --reuse "
        "(default: gpu)",
    )
    p.add_argument("--dist-timeout", type=float, default=None, help="collective timeout, seconds")
    p.add_argument(
        "--no-progress", "--quiet", dest="no_progress", action="store_true", help="no progress bars"
    )


def _check(args) -> list[str]:
    from ..train.config import DIST_STRATEGIES

    for name in ("nproc", "batches", "batch_size"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.threads is not None and args.threads < 1:
        raise UsageError(f"--threads must be >= 1, got {args.threads}")
    if not 0.0 <= args.buffer <= 1.0:
        raise UsageError(f"--buffer: must be a fraction in [0, 1], got {args.buffer}")
    names = [s.strip() for s in args.strategies.split(",") if s.strip()]
    for s in names:
        if s not in DIST_STRATEGIES:
            raise UsageError(
                f"--strategies: unknown '{s}' (choose from {', '.join(DIST_STRATEGIES)})"
            )
    if not names:
        raise UsageError("--strategies: give at least one")
    return names


def run(args) -> dict:
    import os

    import gnnio

    from ..distributed.context import env_world_size

    names = _check(args)
    gnnio.load(args.dataset)  # a bad directory fails here, once
    opts = {k: v for k, v in vars(args).items() if k not in ("func", "bench_module", "rank_entry")}
    opts["strategies"] = names
    if env_world_size() > 1:  # under torchrun: this process is one rank
        out = rank_main(opts)
        return out if out is not None else {}
    if args.nproc < 2:
        raise UsageError("--nproc: the fetch across ranks needs at least 2")
    from ..distributed.launch import launch

    cores = os.cpu_count() or 1
    opts["threads"] = args.threads or max(1, cores // args.nproc)
    if args.topology is not None:  # refuse a bad --topology before the ranks start
        from ..distributed.context import check_topology

        check_topology(args.topology, [0] * args.nproc)
    results = launch(args.nproc, rank_main, opts, timeout_s=args.dist_timeout)
    return results[0]


def rank_main(opts: dict) -> dict | None:
    """One rank (module docstring); rank 0 returns the result, the others None."""
    import torch
    from torch.distributed.elastic.multiprocessing.errors import record

    return record(_rank_body)(opts, torch)


def _rank_body(opts: dict, torch) -> dict | None:
    import gnnio

    from ..distributed.context import init, shutdown
    from ..distributed.group_reuse import level_info
    from ..distributed.store import ShardedFeatureStore
    from ..distributed.train import get_placement
    from ..features import open_store
    from ..ordering import RandomOrder
    from ..sampling import UniformSampler, parse_fanouts
    from .gather import seed_ids, set_threads

    o = SimpleNamespace(**opts)
    threads = o.threads or 1
    set_threads(threads)
    ctx = init(timeout_s=o.dist_timeout, topology=o.topology)
    try:
        ds = gnnio.load(o.dataset)
        fanouts = parse_fanouts(o.fanouts)
        order = RandomOrder(
            seed_ids(ds), o.batch_size, seed=o.seed, rank=ctx.rank,
            world_size=ctx.world_size, equal_batches=True,
        )  # fmt: skip
        k = min(o.batches, order.num_batches)
        sampler = UniformSampler(ds.graph, fanouts, seed=o.seed, num_threads=threads)
        # batch 0 of epoch 0 warms up; the timed batches are the first k of epoch 1
        batches = [sampler.sample(next(iter(order.batches(0)))).input_nodes]
        for i, seeds in enumerate(order.batches(1)):
            if i == k:
                break
            batches.append(sampler.sample(seeds).input_nodes)
        host = open_store(ds, "mmap", "cpu", num_threads=threads, progress=False)
        ceiling = _all_to_all_ceiling(ctx, torch)
        level = (o.reuse_level or "gpu") if (o.reuse or o.reuse_level) else False
        per_strategy: dict[str, Any] = {}
        for name in o.strategies:
            cfg = SimpleNamespace(
                placement=None, placement_strategy=name, buffer=o.buffer, fanouts=fanouts,
                batch_size=o.batch_size, progress=ctx.is_main and not o.no_progress, seed=o.seed,
                num_layers=len(fanouts),
            )  # fmt: skip
            pl = get_placement(ds, cfg, ctx)
            store = ShardedFeatureStore(host, pl, ctx, reuse=level)
            store.gather(batches[0])  # warm-up (page cache, first-touch), not counted
            store.counters.reset()
            if store.group_reuse is not None:
                store.group_reuse.forwarded_rows = store.group_reuse.forwarded_from_prev = 0
            store.reset_trace()
            store.collective_s = 0.0
            times = []
            ctx.barrier()
            for ids in batches[1:]:
                t0 = time.perf_counter()
                store.gather(ids)
                times.append(time.perf_counter() - t0)
            m = max(len(times), 1)
            rows, gr = store.modeled_rows(), store.group_reuse
            mine = {
                "bytes_by_link": {t: int(store.counters.bytes.get(t, 0)) for t in LINKS},
                "reuse_bytes": int(store.counters.bytes.get("reuse", 0)),
                **{
                    f"forwarded{k}_bytes": 0 if gr is None else getattr(gr, a) * store.row_bytes
                    for k, a in (("", "forwarded_rows"), ("_from_prev", "forwarded_from_prev"))
                },
                "modeled_bytes_by_link": {
                    t: int(round(r * store.row_bytes)) for t, r in rows.items()
                },
                "fetch_ms_per_batch": 1000 * float(np.mean(times)) if times else 0.0,
                "collective_ms_per_batch": 1000 * store.collective_s / m,
                "modeled_fetch_ms_per_batch": 1000 * store.modeled_seconds(rows) / m,
                "control_bytes": int(store.control_bytes),
                "shard_rows": int(store.shard.shape[0]),
            }
            ranks = ctx.all_gather_object(mine)
            per_strategy[name] = _combine(ranks, pl, len(times))
        if not ctx.is_main:
            return None
        return {
            "dataset": ds.name,
            "world_size": ctx.world_size,
            "num_machines": ctx.num_machines,
            "topology": ctx.topology_spec,
            "buffer": o.buffer,
            "batches": k,
            "batch_size": o.batch_size,
            "fanouts": list(fanouts),
            "threads_per_rank": threads,
            "reuse": level is not False,
            # the level that ran: machine acts as gpu where it cannot hand rows over
            "reuse_level": level_info(ctx.topo, str(level))["level"] if level else None,
            "simulated_devices": ctx.simulated,
            "time_kind": (
                "wall clock of gloo collectives over loopback TCP between CPU processes "
                "(simulated devices)"
                if ctx.simulated
                else f"wall clock on {ctx.backend}"
            ),
            "all_to_all_ceiling_GBps": ceiling,
            "strategies": per_strategy,
        }
    finally:
        shutdown()


def _combine(ranks: list[dict], pl, batches: int) -> dict:
    def total(key: str) -> dict:
        d: dict[str, Any] = {t: sum(r[key][t] for r in ranks) for t in LINKS}
        d["per_rank"] = [r[key] for r in ranks]
        return d

    meas, mod = total("bytes_by_link"), total("modeled_bytes_by_link")
    return {
        "bytes_by_link": meas,
        "modeled_bytes_by_link": mod,
        "reuse_bytes": sum(r["reuse_bytes"] for r in ranks),
        "forwarded_bytes": sum(r["forwarded_bytes"] for r in ranks),
        "forwarded_from_prev_bytes": sum(r["forwarded_from_prev_bytes"] for r in ranks),
        "fetch_ms_per_batch": max(r["fetch_ms_per_batch"] for r in ranks),
        "collective_ms_per_batch": max(r["collective_ms_per_batch"] for r in ranks),
        "modeled_fetch_ms_per_batch": max(r["modeled_fetch_ms_per_batch"] for r in ranks),
        "fetch_ms_per_batch_per_rank": [r["fetch_ms_per_batch"] for r in ranks],
        "control_bytes": sum(r["control_bytes"] for r in ranks),
        "shard_rows": [r["shard_rows"] for r in ranks],
        "timed_batches_per_rank": batches,
        "placement_prep_s": pl.prep_s,
    }


def _all_to_all_ceiling(ctx, torch, nbytes: int = 16 << 20, reps: int = 3) -> float:
    """GB/s one rank receives from a raw ``all_to_all_single`` of ``nbytes`` per rank (split
    evenly over the others), best of ``reps``: the ceiling of the fetch's collective."""
    w = ctx.world_size
    per = nbytes // max(w - 1, 1)
    splits = [0 if k == ctx.rank else per for k in range(w)]
    send = ctx.to_comm(torch.ones(sum(splits), dtype=torch.uint8))
    recv = ctx.empty(sum(splits), torch.uint8)
    best = float("inf")
    for _ in range(reps):
        ctx.barrier()
        t0 = time.perf_counter()
        ctx.all_to_all_single(send, splits, splits, group="fetch", out=recv)
        best = min(best, time.perf_counter() - t0)
    got = ctx.all_reduce_sum([sum(splits) / best / 1e9])[0] / w
    return got
