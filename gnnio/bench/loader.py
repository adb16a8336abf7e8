"""``gnnio bench loader DIR``: end-to-end sample + gather through the pipelined NodeLoader.

A pass iterates ``--batches`` mini-batches of one epoch through :class:`gnnio.pipeline.loader.NodeLoader`
(sampling, gathering and, on a GPU, transfer overlapped in background threads) with a consumer that
does nothing, so the pass time is the loader's own throughput. Reported: ``ms_per_batch`` and
``seeds_per_s`` (median pass); the loader's per-stage seconds of the same passes, whose sum
``stage_sum_ms_per_batch`` is the time the stages would take one after another; and
``sequential_ms_per_batch``, the same batches sampled and gathered in one thread with no pipeline
(measured, not summed). With ``--threads 2`` on a 2-core machine the stages compete for the same
cores, so overlap gains little; it pays where sampling and gathering leave cores or memory
bandwidth idle, or while the consumer trains.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from ..utils.progress import bar
from . import KINDS
from ._timing import median, time_passes
from .gather import check_common, make_order, parse_fanouts_arg, seed_ids, set_threads

if TYPE_CHECKING:
    from ..pipeline.loader import LoaderStats

HELP = KINDS["loader"]
DESCRIPTION = __doc__.split("\n\n", 1)[1] if __doc__ else HELP


def add_arguments(p) -> None:
    p.add_argument("dataset", metavar="DIR", help="a prepared gnnio dataset directory")
    p.add_argument("--batch-size", type=int, default=1024, help="seeds per mini-batch")
    p.add_argument("--fanouts", default="15,10,5", help="neighbours sampled per hop")
    p.add_argument(
        "--batches",
        type=int,
        default=50,
        help="mini-batches per pass, at most one epoch's (ceil(training nodes / --batch-size)); "
        "the JSON's 'batches' says how many ran",
    )
    p.add_argument("--threads", type=int, default=2, help="CPU threads of sampler and gather")
    p.add_argument("--store", choices=["memory", "mmap"], default="memory", help="feature store")
    p.add_argument("--prefetch", type=int, default=2, help="batches ready ahead of the consumer")
    p.add_argument("--workers", type=int, default=1, help="sampling threads of the loader")
    p.add_argument(
        "--device",
        default="cpu",
        help="where batches are delivered: cpu, cuda (cuda:N) or auto (as gnnio train: cuda when "
        "a GPU is present, else cpu)",
    )
    p.add_argument(
        "--store-device",
        default="cpu",
        help="where a 'memory' store keeps its rows (cpu, cuda): cuda measures the loader with "
        "every feature row GPU-resident",
    )
    p.add_argument(
        "--sampler-device",
        default="cpu",
        help="where the uniform sampler runs (cpu, cuda: the GPU sampler with the CSR on the GPU)",
    )
    p.add_argument("--passes", type=int, default=5, help="timed passes (the median is reported)")
    p.add_argument("--warmup", type=int, default=1, help="untimed passes first")
    p.add_argument("--seed", type=int, default=0, help="seed of the seed order and the sampler")
    p.add_argument(
        "--no-progress", "--quiet", dest="no_progress", action="store_true", help="no progress bars"
    )


class FirstBatches:
    """The first ``n`` batches of each epoch of an order (same interface as the order)."""

    def __init__(self, order, n: int) -> None:
        self.order, self.num_batches = order, min(int(n), int(order.num_batches))

    def batches(self, epoch: int):
        for i, b in enumerate(self.order.batches(epoch)):
            if i == self.num_batches:
                return
            yield b


def _device_option(option: str, value: str) -> torch.device:
    """The device an option names; a one-line UsageError if it is none, or CUDA is missing."""
    from ..errors import UsageError

    try:
        dev = torch.device(value)
    except RuntimeError:
        raise UsageError(f"{option} {value!r}: not a device (cpu, cuda)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"{option} {value}: CUDA is not available on this machine")
    return dev


def run(args) -> dict:
    import gnnio

    from ..errors import UsageError
    from ..features import open_store
    from ..pipeline.loader import NodeLoader
    from ..sampling import UniformSampler

    check_common(args)
    if args.prefetch < 1 or args.workers < 1:
        raise UsageError("--prefetch and --workers must be >= 1")
    for name, v in (("--prefetch", args.prefetch), ("--workers", args.workers)):
        if v > 4096:  # (a slot / a thread each: 1e20 was an OverflowError traceback)
            raise UsageError(f"{name}: must be at most 4096, got {v}")
    from ..train import check_device

    device = check_device(args.device)  # as gnnio train's --device: auto = cuda when present
    store_device = _device_option("--store-device", args.store_device)
    if store_device.type != "cpu" and args.store != "memory":
        raise UsageError(f"--store-device {args.store_device} needs --store memory")
    sampler_device = _device_option("--sampler-device", args.sampler_device)
    set_threads(args.threads)
    ds = gnnio.load(args.dataset)
    fanouts = parse_fanouts_arg(args.fanouts)
    if sampler_device.type == "cuda":
        sampler = UniformSampler(ds.graph, fanouts, seed=args.seed, device=sampler_device)
    else:
        sampler = UniformSampler(ds.graph, fanouts, seed=args.seed, num_threads=args.threads)
    store = open_store(
        ds, kind=args.store, device=store_device, num_threads=args.threads,
        progress=not args.no_progress,
    )  # fmt: skip
    order = FirstBatches(make_order(seed_ids(ds), args.batch_size, args.seed), args.batches)
    labels = None if ds.labels is None else np.asarray(ds.labels)
    loader = NodeLoader(
        sampler, store, order, labels=labels, device=device, prefetch=args.prefetch,
        num_workers=args.workers,
    )  # fmt: skip
    stats: list[LoaderStats] = []
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    pb = bar(args.warmup + args.passes, "loader passes", "pass", enabled=not args.no_progress)

    def loader_pass():
        for _ in loader.epoch(0):
            pass
        assert loader.stats is not None  # (an epoch's end sets it)
        stats.append(loader.stats)
        pb.update(1)

    with pb:
        times = time_passes(loader_pass, warmup=args.warmup, passes=args.passes, sync=sync)
    stats = stats[args.warmup :]
    last = loader.stats
    assert last is not None  # (set by the passes above)
    nb, seeds = last.num_batches, last.num_seeds

    # the same batches, one stage after the other in this thread (no pipeline), for comparison
    seed_batches = list(order.batches(0))
    buf = torch.zeros((1, store.dim), dtype=store.dtype, device=store_device)

    def sequential_pass():
        nonlocal buf
        for i, s in enumerate(seed_batches):
            mb = sampler.sample(s, epoch_seed=i)
            n = int(mb.input_nodes.shape[0])
            if buf.shape[0] < n:
                buf = torch.zeros(
                    (int(n * 1.25), store.dim), dtype=store.dtype, device=store_device
                )
            store.gather(mb.input_nodes, out=buf)

    sync_store = torch.cuda.synchronize if store_device.type == "cuda" else None
    seq = time_passes(sequential_pass, warmup=args.warmup, passes=args.passes, sync=sync_store)

    def per_batch_ms(xs: list[float]) -> float:
        return median(xs) / nb * 1e3

    return {
        "dataset": str(ds.path),
        "store": args.store,
        "store_device": str(store_device),
        "sampler_device": str(sampler_device),
        "device": str(device),
        "threads": args.threads,
        "batches": nb,
        "batch_size": args.batch_size,
        "fanouts": ",".join(map(str, fanouts)),
        "ms_per_batch": per_batch_ms(times),
        "seeds_per_s": seeds / median(times),
        "input_nodes_per_batch": stats[-1].num_input_nodes / nb,
        "sample_ms_per_batch": per_batch_ms([s.sample_s for s in stats]),
        "gather_ms_per_batch": per_batch_ms([s.gather_s for s in stats]),
        "transfer_ms_per_batch": per_batch_ms([s.transfer_s for s in stats]),
        "wait_ms_per_batch": per_batch_ms([s.wait_s for s in stats]),
        "stage_sum_ms_per_batch": per_batch_ms([s.stage_sum_s for s in stats]),
        "sequential_ms_per_batch": per_batch_ms(seq),
        "passes": args.passes,
    }
