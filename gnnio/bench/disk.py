"""``gnnio bench disk DIR``: the SSD tier against the device's own ceilings, and loading epochs
with the features on disk against the same epochs in memory (issue 25).

1. **Ceilings**, measured in the same run on the dataset's feature file, with ``O_DIRECT`` and the
   store's reader threads (``--queue-depth``): sequential reads of 1 MiB (``seq_read_GBps``) and
   random 4 KiB reads of distinct pages (``random_4k_iops``, ``random_4k_MBps``). The store's
   random-row reads (uniform ids, ``DiskFeatureStore.gather``) are timed between them, and
   ``random_read_fraction_of_ceiling`` = the store's device bytes per second over the ceiling's
   in the unit the store reads (medians of ``--repeats`` interleaved rounds; fresh random blocks
   every round; ``ceiling_block_bytes``). The store reads in blocks of ``block_bytes``
   (``--block-size``; auto: the device's 512-byte logical block where ``O_DIRECT`` takes it, else
   4 KiB). When that is less than 4 KiB, the ceiling is random reads of a row's span in such
   blocks, each one read (``random_block_iops``: the bytes a row read costs, at random places;
   ``random_read_fraction_of_4k_ceiling`` keeps the 4 KiB one, which on a disk bound by reads per
   second credits a sub-page read with half the bytes per second), and the same rounds also time
   the same ids
   through a store reading 4 KiB pages (``store_4k_*``), so the two read units are compared in
   one run: ``rows_per_s_over_4k`` is the store's rows per second over the 4 KiB store's.
2. **Epochs**: ``--epochs`` loading epochs (the first ``--batches`` mini-batches of each epoch's
   seed order, sampled and gathered by the pipelined loader; the consumer does nothing, so an
   epoch is what data loading costs) over the features in memory, on disk with no host cache,
   and on disk under a host cache of each ``--sizes`` fraction with each ``--policies`` policy
   (static by ``--score``; ``lookahead``: Belady's MIN over the next ``--lookahead`` batches the
   loader announces, the hotness rank beyond them; ``optimal``: MIN over every batch of every
   epoch, the offline optimum no policy can beat on rows fetched; it is replayed from the sampled
   trace, not run through the loader, so its times are not comparable and its ``replayed`` is
   true). Per configuration: the first and the steady epoch (median of the
   later ones), the device bytes per steady epoch (``disk_bytes``), the kernel's count
   (``/proc/self/io``), the host-cache hit ratio, and ``ratio_to_bound`` = steady epoch over
   ``max(in-memory epoch, disk bytes / ceiling)`` (issue 25's goal: <= 1.2; the ceiling in the
   store's read unit, as above), with the
   ceiling measured right before and right after the configuration's epochs (``ceiling_MBps``,
   their mean: a shared virtual disk's rate drifts by 2x within a minute);
   ``ratio_to_run_ceiling`` uses the ceiling of step 1 instead.
3. **Policies against the bound**: ``disk_bytes_over_optimal`` (each policy's steady disk bytes
   over ``optimal``'s at the same size) and ``lookahead_over_best`` (``lookahead``'s over the
   fewest of static, SIEVE and S3-FIFO: issue 25's goal <= 0.8).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from ..errors import UsageError
from ..utils.progress import bar
from . import KINDS
from ._timing import median

HELP = KINDS["disk"]
DESCRIPTION = __doc__.split("\n\n", 1)[1] if __doc__ else HELP


def add_arguments(p) -> None:
    p.add_argument("dataset", metavar="DIR", help="a prepared gnnio dataset directory")
    p.add_argument("--queue-depth", type=int, default=16, help="reads in flight (reader threads)")
    p.add_argument(
        "--block-size",
        default="auto",
        choices=["auto", "512", "1024", "2048", "4096"],
        help="the store's read unit in bytes (auto: the smallest O_DIRECT read the file takes)",
    )
    p.add_argument("--random-reads", type=int, default=20000, help="4 KiB reads per round")
    p.add_argument("--seq-mib", type=int, default=256, help="MiB read sequentially per round")
    p.add_argument("--repeats", type=int, default=3, help="interleaved ceiling/store rounds")
    p.add_argument("--sizes", default="0.05,0.1,0.2", help="host cache sizes (fractions of N)")
    p.add_argument("--policies", default="static,sieve,s3fifo", help="host cache policies")
    p.add_argument("--score", default="degree", help="hotness score of the static policy")
    p.add_argument(
        "--lookahead",
        type=int,
        default=64,
        help="batches announced ahead to the lookahead policy (Ginex's superbatch)",
    )
    p.add_argument("--epochs", type=int, default=3, help="loading epochs per configuration")
    p.add_argument("--batches", type=int, default=40, help="mini-batches per epoch")
    p.add_argument("--batch-size", type=int, default=1024, help="seeds per mini-batch")
    p.add_argument("--fanouts", default="15,10,5", help="neighbours sampled per hop")
    p.add_argument("--threads", type=int, default=2, help="CPU threads of sampler and gather")
    p.add_argument("--seed", type=int, default=0, help="seed of the orders, sampler and reads")
    p.add_argument(
        "--no-progress", "--quiet", dest="no_progress", action="store_true", help="no progress bars"
    )


def _check(args) -> tuple[list[float], list[str]]:
    for name in ("queue_depth", "random_reads", "seq_mib", "repeats", "epochs", "batches",
                 "batch_size", "threads"):  # fmt: skip
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    try:
        sizes = [float(x) for x in args.sizes.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--sizes: fractions separated by commas, got '{args.sizes}'") from None
    if any(not 0 < s <= 1 for s in sizes):
        raise UsageError(f"--sizes: every size must be in (0, 1], got '{args.sizes}'")
    policies = [x.strip() for x in args.policies.split(",") if x.strip()]
    known = ("static", "sieve", "s3fifo", "fifo", "lru", "lfu", "lookahead", "optimal")
    bad = [p for p in policies if p not in known]
    if bad:
        raise UsageError(f"--policies: unknown {bad[0]!r}; choose from {', '.join(known)}")
    return sizes, policies


# ---- ceilings ------------------------------------------------------------------------------


def _seq_round(reader, file_pages: int, mib: int, start: int) -> tuple[float, int]:
    from ..features.stores._direct_io import plan_pages

    want = min(file_pages, mib * 256)
    first = start % max(1, file_pages - want + 1)
    chunk = 64 * 256  # 64 MiB per read() call (the buffer), 1 MiB per read
    t0, done = time.perf_counter(), 0
    for a in range(first, first + want, chunk):
        pages = np.arange(a, min(a + chunk, first + want), dtype=np.int64)
        plan = plan_pages(pages * 4096, 4096, max_run_pages=256)
        b0 = reader.bytes_read
        reader.read(plan)
        done += reader.bytes_read - b0
    return time.perf_counter() - t0, done


def _random_round(
    reader, file_pages: int, n: int, rng, block: int = 4096, span: int = 0
) -> tuple[float, int, int]:
    """``n`` random reads of one ``block`` each (distinct; ``file_pages`` blocks in the file), or
    with ``span``: of the blocks of ``span`` bytes from a random block, each as one read."""
    from ..features.stores._direct_io import plan_pages

    width = max(1, -(-span // block))
    room = max(1, file_pages - width + 1)
    pages = rng.choice(room, size=min(n, room), replace=False).astype(np.int64)
    plan = plan_pages(pages * block, max(span, block), max_run_pages=width, block=block)
    b0 = reader.bytes_read
    t0 = time.perf_counter()
    reader.read(plan)
    return time.perf_counter() - t0, reader.bytes_read - b0, int(pages.size)  # reads issued


def _rounds(n: int, progress: bool):
    """``range(n)`` under a progress bar of the ceiling rounds."""
    with bar(n, "disk ceilings", "round", enabled=progress) as pb:
        for r in range(n):
            yield r
            pb.update(1)


def _timed_gather(store, ids) -> tuple[float, float]:
    """``(device bytes/s, rows/s)`` of one gather of ``ids``."""
    b0 = store.stats.bytes_read
    t0 = time.perf_counter()
    store.gather(ids)
    t = time.perf_counter() - t0
    return (store.stats.bytes_read - b0) / t, len(ids) / t


def ceilings(store, args, progress: bool = False) -> dict[str, Any]:
    """Sequential and random-4K ceilings and the store's random-row reads, interleaved (with a
    sub-page block: also single-block reads and a 4 KiB-page store on the same ids)."""
    from ..features.stores._direct_io import PageReader
    from ..features.stores.disk import DiskFeatureStore

    reader = PageReader(str(store.path), args.queue_depth, direct=True, block=4096)
    rng = np.random.default_rng(args.seed)
    file_pages = max(1, reader.file_size // 4096)
    bs = store.block_size
    pages = sub = None
    if bs < 4096:
        sub = PageReader(str(store.path), args.queue_depth, direct=True, block=bs)
        pages = DiskFeatureStore(str(store.path), store._np_dtype, (store.num_rows, store.dim),
                                 queue_depth=args.queue_depth, block_size=4096)  # fmt: skip
    seq, rnd, rows, blk, rows4k = [], [], [], [], []
    try:  # warm-up, untimed: reader threads started, kernels loaded
        _random_round(reader, file_pages, min(1000, args.random_reads), rng)
        for s in (store, pages):
            if s is not None:
                s.gather(rng.integers(0, store.num_rows, min(1000, args.random_reads)))
        for r in _rounds(args.repeats, progress):
            t, b = _seq_round(reader, file_pages, args.seq_mib, r * 7919)
            seq.append(b / t)
            t, b, n = _random_round(reader, file_pages, args.random_reads, rng)
            rnd.append((b / t, n / t))
            ids = rng.integers(0, store.num_rows, args.random_reads)
            rows.append(_timed_gather(store, ids))
            if pages is not None:  # the same ids in 4 KiB pages, and single-block reads
                rows4k.append(_timed_gather(pages, ids))
                nb = max(1, reader.file_size // bs)
                t, b, n = _random_round(sub, nb, args.random_reads, rng, bs, store.row_bytes)
                blk.append((b / t, n / t))
        amp = store.stats.read_amplification
        amp4k = pages.stats.read_amplification if pages is not None else amp
        store.reset_stats()
    finally:
        reader.close()
        for s in (pages, sub):
            if s is not None:
                s.close()
    ceil4k_bps = median([x[0] for x in rnd])
    ceil_bps = median([x[0] for x in blk]) if blk else ceil4k_bps  # in the store's read unit
    store_bps = median([x[0] for x in rows])
    out = {
        "direct": bool(reader.direct),
        "queue_depth": args.queue_depth,
        "block_bytes": bs,
        "seq_read_GBps": median(seq) / 1e9,
        "random_4k_iops": median([x[1] for x in rnd]),
        "random_4k_MBps": ceil4k_bps / 1e6,
        "ceiling_block_bytes": bs if blk else 4096,
        "store_random_MBps": store_bps / 1e6,
        "store_random_rows_per_s": median([x[1] for x in rows]),
        "store_read_amplification": amp,
        "random_read_fraction_of_ceiling": store_bps / ceil_bps if ceil_bps else 0.0,
        "random_read_fraction_of_4k_ceiling": store_bps / ceil4k_bps if ceil4k_bps else 0.0,
        "_ceiling_Bps": ceil_bps,
    }
    if pages is not None:
        out.update({
            "random_block_iops": median([x[1] for x in blk]),
            "random_block_MBps": median([x[0] for x in blk]) / 1e6,
            "store_4k_random_MBps": median([x[0] for x in rows4k]) / 1e6,
            "store_4k_random_rows_per_s": median([x[1] for x in rows4k]),
            "store_4k_read_amplification": amp4k,
            "rows_per_s_over_4k": median([a[1] / b[1] for a, b in zip(rows, rows4k, strict=True)]),
        })  # fmt: skip
    return out


# ---- epochs --------------------------------------------------------------------------------


def _epochs(loader, store, disk, epochs: int, replay=None) -> dict[str, Any]:
    """Time ``epochs`` epochs of ``loader`` (or, with ``replay``, call ``replay(e)`` per epoch)."""
    from ..train.setup_disk import proc_read_bytes

    times, dbytes, kbytes, hits, rows = [], [], [], [], []
    for e in range(epochs):
        b0 = disk.stats.bytes_read if disk is not None else 0
        c0 = store.counters.snapshot()["rows"]
        k0 = proc_read_bytes()
        t0 = time.perf_counter()
        if replay is not None:
            replay(e)
        else:
            for _ in loader.epoch(e):
                pass
        times.append(time.perf_counter() - t0)
        k1 = proc_read_bytes()
        dbytes.append((disk.stats.bytes_read - b0) if disk is not None else 0)
        kbytes.append(k1 - k0 if k0 is not None and k1 is not None else None)
        c1 = store.counters.snapshot()["rows"]
        served = {t: c1.get(t, 0) - c0.get(t, 0) for t in c1}
        rows.append(sum(served.values()))
        hits.append(served.get("host_cache", 0))
    steady = times[1:] or times
    return {
        "first_epoch_s": times[0],
        "steady_epoch_s": median(steady),
        "epoch_s": times,
        "disk_bytes": int(median(dbytes[1:] or dbytes)),
        "disk_bytes_per_epoch": dbytes,
        "kernel_read_bytes_per_epoch": kbytes,
        "host_cache_hit_ratio": (sum(hits[1:] or hits) / max(1, sum(rows[1:] or rows))),
    }


def _trace(ds, order, fanouts, args) -> list[list[torch.Tensor]]:
    """The input nodes of every batch of every epoch, as the loader samples them (same sampler
    seed, ``epoch_seed = (epoch << 32) + batch``): what ``optimal`` is told in advance."""
    from ..sampling import UniformSampler

    sampler = UniformSampler(ds.graph, fanouts, seed=args.seed, num_threads=args.threads)
    return [
        [
            sampler.sample(torch.as_tensor(s).long(), epoch_seed=(e << 32) + i).input_nodes
            for i, s in enumerate(order.batches(e))
        ]  # fmt: skip
        for e in range(args.epochs)
    ]


def _optimal_replay(cache, trace):
    """Announce the whole trace to an ``optimal`` cache; a function serving epoch ``e``."""
    for epoch in trace:
        for ids in epoch:
            cache.announce(ids)
    buf = torch.empty((max(int(t.numel()) for ep in trace for t in ep), cache.dim),
                      dtype=cache.dtype)  # fmt: skip

    def serve(e: int) -> None:
        for ids in trace[e]:
            cache.gather(ids, out=buf[: ids.numel()])

    return serve


def _ceiling_Bps(args, path: str, block: int = 4096, span: int = 0, rounds: int = 1) -> float:
    """The random-read ceiling now, in reads of one ``block`` or of ``span`` bytes' blocks
    (bytes/s; median of ``rounds``)."""
    from ..features.stores._direct_io import PageReader

    reader = PageReader(path, args.queue_depth, direct=True, block=block)
    rng = np.random.default_rng(args.seed + 1)
    try:
        pages = max(1, reader.file_size // block)
        got = [_random_round(reader, pages, args.random_reads, rng, block, span)
               for _ in range(rounds)]  # fmt: skip
    finally:
        reader.close()
    return median([b / t for t, b, _n in got])


def _versus(configs: list[dict[str, Any]]) -> dict[str, Any]:
    """Steady disk bytes of each policy over ``optimal``'s, and ``lookahead``'s over the best of
    static, SIEVE and S3-FIFO, per cache size."""
    out: dict[str, Any] = {"disk_bytes_over_optimal": {}, "lookahead_over_best": {}}
    for size in sorted({c["host_cache"] for c in configs if c["host_cache"] > 0}):
        at = {c["policy"]: c["disk_bytes"] for c in configs if c["host_cache"] == size}
        opt = at.get("optimal")
        if opt:
            out["disk_bytes_over_optimal"][f"{size:g}"] = {p: b / opt for p, b in at.items()}
        best = [at[p] for p in ("static", "sieve", "s3fifo") if p in at]
        if "lookahead" in at and best and min(best):
            out["lookahead_over_best"][f"{size:g}"] = at["lookahead"] / min(best)
    return out


def run(args) -> dict:
    import gnnio

    from ..features import InMemoryFeatureStore
    from ..features.caches.cache import FeatureCache
    from ..features.stores.disk import DiskFeatureStore
    from ..features.tiers.tiered import hot_rows_for_fraction
    from ..pipeline.loader import NodeLoader
    from ..sampling import UniformSampler
    from .gather import make_order, parse_fanouts_arg, seed_ids, set_threads
    from .loader import FirstBatches

    sizes, policies = _check(args)
    progress = not args.no_progress
    set_threads(args.threads)
    ds = gnnio.load(args.dataset)
    fanouts = parse_fanouts_arg(args.fanouts)
    block = None if args.block_size == "auto" else int(args.block_size)
    disk = DiskFeatureStore(ds.features, queue_depth=args.queue_depth, block_size=block)
    if not disk.direct:
        raise UsageError(f"{disk.path}: this filesystem refuses O_DIRECT; nothing to measure")
    res: dict[str, Any] = {
        "dataset": str(ds.path),
        "num_nodes": int(ds.num_nodes),
        "row_bytes": int(disk.row_bytes),
        "feature_bytes": int(disk.row_bytes * disk.num_rows),
        "fanouts": ",".join(map(str, fanouts)),
        "batch_size": args.batch_size,
        "batches_per_epoch": args.batches,
        "epochs": args.epochs,
        "threads": args.threads,
    }
    res.update(ceilings(disk, args, progress))
    ceil_bps = res.pop("_ceiling_Bps")
    order = FirstBatches(make_order(seed_ids(ds), args.batch_size, args.seed), args.batches)
    labels = None if ds.labels is None else np.asarray(ds.labels)

    def loader_for(store):
        sampler = UniformSampler(ds.graph, fanouts, seed=args.seed, num_threads=args.threads)
        return NodeLoader(sampler, store, order, labels=labels, device=torch.device("cpu"))

    mem = InMemoryFeatureStore(np.asarray(ds.features))
    rows_mem = _epochs(loader_for(mem), mem, None, args.epochs)
    del mem
    memory_s = rows_mem["steady_epoch_s"]
    res["memory"] = {k: rows_mem[k] for k in ("first_epoch_s", "steady_epoch_s", "epoch_s")}
    hot = None
    if {"static", "lookahead", "optimal"} & set(policies):
        from ..preprocess.hotness import compute_score
        from ..preprocess.reorder import order_by_score

        hot = order_by_score(compute_score(args.score, ds, fanouts=fanouts, progress=progress))
    trace = _trace(ds, order, fanouts, args) if "optimal" in policies else None
    configs: list[dict[str, Any]] = []
    todo = [(0.0, "none")] + [(s, p) for s in sizes for p in policies]
    blk = res["ceiling_block_bytes"]  # the ceilings around each configuration: the store's unit
    unit = (blk, disk.row_bytes if blk < 4096 else 0)
    with bar(len(todo), "disk configurations", "config", enabled=progress) as pb:
        for size, policy in todo:
            pb.set_postfix_str(f"{policy}@{size:g}")
            disk.reset_stats()
            store: DiskFeatureStore | FeatureCache = disk
            replay = None
            if size > 0:
                cap = hot_rows_for_fraction(size, ds.num_nodes)
                store = FeatureCache(disk, cap, policy, hot_ids=hot if policy in ("static",
                                     "lookahead", "optimal") else None, device="cpu",
                                     tier="host_cache", lookahead=args.lookahead)  # fmt: skip
                if policy == "optimal":
                    replay = _optimal_replay(store, trace)
            c0 = _ceiling_Bps(args, str(disk.path), *unit)
            r = _epochs(loader_for(store), store, disk, args.epochs, replay)
            near = (c0 + _ceiling_Bps(args, str(disk.path), *unit)) / 2
            bound = max(memory_s, r["disk_bytes"] / near if near else 0.0)
            run_bound = max(memory_s, r["disk_bytes"] / ceil_bps if ceil_bps else 0.0)
            configs.append({"host_cache": size, "policy": policy, **r, "replayed": replay is not None,
                            "ceiling_MBps": near / 1e6,
                            "ratio_to_bound": r["steady_epoch_s"] / bound if bound else 0.0,
                            "ratio_to_run_ceiling": r["steady_epoch_s"] / run_bound if run_bound
                            else 0.0})  # fmt: skip
            pb.update(1)
    res["disk"] = configs
    res["disk_bytes_by_policy"] = {
        f"{c['policy']}@{c['host_cache']:g}": c["disk_bytes"] for c in configs
    }
    res.update(_versus(configs))
    disk.close()
    return res
