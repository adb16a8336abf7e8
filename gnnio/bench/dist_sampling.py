"""``gnnio bench dist-sampling DIR --nproc N --partition P``: sampling over a partitioned topology.

N ranks (local processes started by PyTorch's elastic launcher, or a ``torchrun`` launch), one
per part of the partition ``P`` (``gnnio partition``), each holding only its shard of the
topology. Every rank samples the first ``--batches`` batches of its slice of one global shuffle
of the training nodes (``--local-seeds``: of its own part's training nodes) in each mode of
``--modes``: ``dsp`` (request/response through collectives) and ``shared`` (HyDRA memory
sharing: the owner's shard read directly; request/response across machines). One untimed
warm-up batch first.

Reported per mode: ``bytes_by_link`` (``local``, ``peer``, ``network``; summed over ranks and
``per_rank``), ``requests_per_batch`` (remote neighbour lists asked for or read, per rank and
batch), ``ms_per_batch`` (wall clock, the slowest rank) and, measured in the same run as the
reference, ``single_process_ms_per_batch``: the same batches sampled by the single-process
sampler from the whole graph held by one rank. Both modes produce exactly that sampler's
batches. Without GPUs the ranks are CPU processes on gloo (simulated devices): the times are
those of loopback collectives and CPU kernels.

``--prune-threshold ALPHA,BETA`` (flag alone: 1,1) samples with HyDRA's threshold pruning (Eq. 4,
``ceil(ALPHA * avg_degree + BETA * fanout)`` per hop, ``avg_degree`` of the whole graph): both
modes then produce exactly :class:`~gnnio.sampling.PrunedUniformSampler`'s batches (also the
single-process reference), and ``shared`` reads only each remote list's window.

``--overlap`` adds HyDRA's overlap rates (§IV, Eq. 5-6) to each mode as ``overlap``: ``eta``,
``t_local_ms``, ``t_remote_ms``, ``t_observed_ms``, ``r_optimal``, ``r_experimental`` (and
``r_optimal_as_printed``, ``batches_identical``, ``note``): the same batches timed once with every
row local and once with every row remote (:mod:`gnnio.bench.dist_overlap`, where Eq. 5's printed
form and how gnnio reads it are explained); each rank then maps the whole topology.

``--shard-device cuda`` shares the shards of ``shared`` mode from the GPU with CUDA IPC (two ranks
on gloo may share one GPU; :mod:`gnnio.distributed.shm`); ``cpu`` from ``/dev/shm``; default: the
rank's device (the CPU here). The mode's ``shared_via`` says which path ran.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np

from ..errors import UsageError
from . import KINDS

HELP = KINDS["dist-sampling"]
DESCRIPTION = __doc__.split("\n\n", 1)[1] if __doc__ else HELP


def add_arguments(p) -> None:
    p.add_argument("dataset", metavar="DIR", help="a prepared gnnio dataset directory")
    p.add_argument("--nproc", type=int, default=2, help="local ranks (ignored under torchrun)")
    p.add_argument("--partition", required=True, metavar="P", help="a gnnio partition directory")
    p.add_argument("--modes", default="dsp,shared", help="sampling modes: dsp, shared")
    p.add_argument("--batches", type=int, default=10, help="timed batches per rank and mode")
    p.add_argument("--batch-size", type=int, default=1024, help="seeds per batch per rank")
    p.add_argument("--fanouts", default="15,10,5", help="neighbours sampled per hop")
    p.add_argument("--local-seeds", action="store_true", help="each rank samples its own seeds")
    p.add_argument("--seed", type=int, default=0, help="seed of the order and the sampler")
    p.add_argument(
        "--prune-threshold", metavar="ALPHA,BETA", nargs="?", const="1,1", default=None,
        help="HyDRA threshold pruning (window of ALPHA*avg_degree + BETA*fanout; flag alone: 1,1)",
    )  # fmt: skip
    p.add_argument(
        "--shard-device", choices=["cpu", "cuda"], default=None,
        help="shared mode: shards shared from /dev/shm (cpu) or the GPU with CUDA IPC (cuda)",
    )  # fmt: skip
    p.add_argument("--topology", default=None, help="NVLink groups of the ranks")
    p.add_argument(
        "--overlap", action="store_true",
        help="HyDRA's overlap rates (Eq. 5-6): also time the batches all-local and all-remote "
        "(each rank then maps the whole topology)",
    )  # fmt: skip
    p.add_argument("--dist-timeout", type=float, default=None, help="collective timeout, seconds")
    p.add_argument(
        "--no-progress", "--quiet", dest="no_progress", action="store_true", help="no progress bars"
    )


def run(args) -> dict:
    import gnnio

    from ..distributed.context import env_world_size
    from ..preprocess.partition import load_partition

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in ("dsp", "shared"):
            raise UsageError(f"--modes: unknown '{m}' (choose from dsp, shared)")
    if not modes:
        raise UsageError("--modes: give at least one")
    for name in ("nproc", "batches", "batch_size"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    prune = parse_prune(args.prune_threshold)
    if args.shard_device is not None and "shared" not in modes:
        raise UsageError("--shard-device: only with --modes shared")
    if args.shard_device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--shard-device cuda: no CUDA device is present")
    ds = gnnio.load(args.dataset)
    if prune is not None:
        from ..sampling import parse_fanouts, prune_thresholds

        try:
            prune_thresholds(
                ds.num_edges / max(ds.num_nodes, 1), parse_fanouts(args.fanouts), prune
            )
        except ValueError as e:
            raise UsageError(f"--prune-threshold: {e}") from None
    world = env_world_size() if env_world_size() > 1 else args.nproc
    load_partition(args.partition, ds, world)  # refused here, once, if it does not fit
    opts = {k: v for k, v in vars(args).items() if k not in ("func", "bench_module", "rank_entry")}
    opts["modes"] = modes
    opts["prune"] = prune
    if env_world_size() > 1:
        out = rank_main(opts)
        return out if out is not None else {}
    from ..distributed.launch import launch

    return launch(args.nproc, rank_main, opts, timeout_s=args.dist_timeout)[0]


def parse_prune(text: str | None) -> tuple[float, float] | None:
    """``ALPHA,BETA`` -> floats (both finite, >= 0, not both 0), or None; one-line UsageError."""
    import math

    if text is None:
        return None
    try:
        vals = tuple(float(v) for v in str(text).split(","))
    except ValueError:
        vals = ()
    if len(vals) != 2 or not all(math.isfinite(v) and v >= 0 for v in vals) or max(vals) == 0:
        raise UsageError(
            f"--prune-threshold: needs ALPHA,BETA (two numbers >= 0, not both 0), got '{text}'"
        )
    return (vals[0], vals[1])


def rank_main(opts: dict) -> dict | None:
    """One rank (module docstring); rank 0 returns the result, the others None."""
    from torch.distributed.elastic.multiprocessing.errors import record

    return record(_rank_body)(opts)


def _rank_body(opts: dict) -> dict | None:
    import gnnio

    from ..distributed.context import init, shutdown
    from ..distributed.sampling import ShardedSampler
    from ..ordering import RandomOrder
    from ..preprocess.partition import load_partition
    from ..sampling import PrunedUniformSampler, UniformSampler, parse_fanouts
    from .gather import seed_ids, set_threads

    o = SimpleNamespace(**opts)
    set_threads(1)
    ctx = init(timeout_s=o.dist_timeout, topology=o.topology)
    try:
        ds = gnnio.load(o.dataset)
        part = load_partition(o.partition, ds, ctx.world_size)
        fanouts = parse_fanouts(o.fanouts)
        seeds = seed_ids(ds)
        if o.local_seeds:
            mine = seeds[part.parts[seeds] == ctx.rank]
            counts = ctx.all_reduce_sum(
                [float(mine.size) if k == ctx.rank else 0.0 for k in range(ctx.world_size)]
            )
            nb = max(1, min(-(-int(c) // o.batch_size) for c in counts))
            order = RandomOrder(mine, -(-mine.size // nb), seed=o.seed)
        else:
            order = RandomOrder(
                seeds, o.batch_size, seed=o.seed, rank=ctx.rank,
                world_size=ctx.world_size, equal_batches=True,
            )  # fmt: skip
        batches: list = []  # a warm-up batch, then the timed ones; a small training set (Cora:
        epoch = 0  # 140 seeds) has fewer batches per epoch than asked: take the next epochs'
        while len(batches) < o.batches + 1 and order.num_batches > 0:
            for b in order.batches(epoch):
                if len(batches) == o.batches + 1:
                    break
                batches.append(b)
            epoch += 1
        if not batches:
            raise UsageError("bench dist-sampling: no training seeds to sample (empty split)")
        k = len(batches) - 1
        avg_degree = ds.num_edges / max(ds.num_nodes, 1)
        ref: UniformSampler | PrunedUniformSampler
        if o.prune is None:
            ref = UniformSampler(ds.graph, fanouts, seed=o.seed, num_threads=1)
        else:
            ref = PrunedUniformSampler(ds.graph, fanouts, o.prune, seed=o.seed, num_threads=1)
        ref.sample(batches[0], epoch_seed=0)
        ref_out = []
        t0 = time.perf_counter()
        for i, b in enumerate(batches[1:]):
            ref_out.append(ref.sample(b, epoch_seed=i + 1))
        ref_ms = 1000 * (time.perf_counter() - t0) / max(k, 1)
        per_mode, runs = {}, {}
        for mode in o.modes:
            s = ShardedSampler(
                part, o.partition, ctx, fanouts, seed=o.seed, mode=mode, prune=o.prune,
                avg_degree=avg_degree, shard_device=o.shard_device if mode == "shared" else None,
            )  # fmt: skip
            s.sample(batches[0], epoch_seed=0)  # warm-up
            s.bytes_by_link.clear()
            s.stats.update(requests=0, local_rows=0, batches=0, seconds=0.0, collective_s=0.0)
            ctx.barrier()
            out = []
            t0 = time.perf_counter()
            for i, b in enumerate(batches[1:]):
                out.append(s.sample(b, epoch_seed=i + 1))
            wall = time.perf_counter() - t0
            if getattr(o, "overlap", False):
                runs[mode] = (1000 * wall / max(k, 1), out, s.stats["local_rows"],
                              s.stats["requests"])  # fmt: skip
            mine = {
                "bytes_by_link": {
                    t: int(s.bytes_by_link.get(t, 0)) for t in ("local", "peer", "network")
                },
                "requests_per_batch": s.stats["requests"] / max(k, 1),
                "ms_per_batch": 1000 * wall / max(k, 1),
                "collective_ms_per_batch": 1000 * s.stats["collective_s"] / max(k, 1),
            }
            ranks = ctx.all_gather_object(mine)
            per_mode[mode] = {
                "bytes_by_link": {
                    **{
                        t: sum(r["bytes_by_link"][t] for r in ranks)
                        for t in ("local", "peer", "network")
                    },
                    "per_rank": [r["bytes_by_link"] for r in ranks],
                },
                "requests_per_batch": float(np.mean([r["requests_per_batch"] for r in ranks])),
                "ms_per_batch": max(r["ms_per_batch"] for r in ranks),
                "ms_per_batch_per_rank": [r["ms_per_batch"] for r in ranks],
                "collective_ms_per_batch": max(r["collective_ms_per_batch"] for r in ranks),
            }
            if mode == "shared":
                per_mode[mode]["shared_via"] = s.shared_via
        if runs:  # --overlap: HyDRA's Eq. 5-6 (gnnio.bench.dist_overlap)
            from .dist_overlap import measure_overlap

            rates = measure_overlap(o, ctx, ds, part, fanouts, batches, ref_out, runs)
            for mode, entry in rates.items():
                per_mode[mode]["overlap"] = entry
        refs = ctx.all_gather_object(ref_ms)
        if not ctx.is_main:
            return None
        return {
            "dataset": ds.name,
            "partition": o.partition,
            "method": part.method,
            "replicated_nodes": int(part.replicated.size),
            "world_size": ctx.world_size,
            "num_machines": ctx.num_machines,
            "batches": k,
            "batch_size": o.batch_size,
            "fanouts": list(fanouts),
            "local_seeds": bool(o.local_seeds),
            "prune_threshold": None if o.prune is None else list(o.prune),
            "thresholds": s.thresholds,
            "simulated_devices": ctx.simulated,
            "single_process_ms_per_batch": max(refs),
            "modes": per_mode,
        }
    finally:
        shutdown()
