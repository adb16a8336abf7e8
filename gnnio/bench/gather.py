"""``gnnio bench gather DIR``: feature-gather bandwidth of a store, next to a measured ceiling.

What is measured. ``--batches`` mini-batches are sampled first (untimed) with the GraphSAGE uniform
sampler (``--fanouts``, ``--batch-size`` seeds from the training split in random order); a pass
gathers the ``input_nodes`` of every batch from the store into one reused output buffer, as the
loader does. ``gb_per_s`` = useful bytes (rows x row bytes) per second of a pass.

The ceiling. ``ceiling_gb_per_s`` is the rate of the same *access pattern* stripped of everything
gnnio-specific: uniformly random 512-byte rows copied out of a separate buffer of ``--ceiling-gib``
GiB (default: 1 GiB or four times the last-level cache, whichever is larger, at most a quarter
of the memory available -- far larger than the cache; every page touched beforehand so reads hit
DRAM, not the zero page; its first row on a 2 MiB boundary, the best case: no row straddles a
cache line and huge pages cover it from the start) into a reused, pre-faulted buffer, with the
same number of rows per call and calls per pass as the measured gather, on the same number of
threads. Five implementations run and the fastest one is the ceiling: ATen's
``index_select(out=)`` (a ``memcpy`` per row), and four numba kernels written here: two copy a
row as uint64 words (numba's slice copy), two with a ``memcpy`` call per row (the store's kernel
copies rows this way); of each pair one is plain, one prefetches the rows 8 ahead. Random rows of
a power-law batch partly hit in cache (hot rows repeat across batches), so a real gather may beat
the ceiling.
Gather and ceiling passes are interleaved so both see the same machine load, each round in a
fresh order drawn from ``--seed`` (with a fixed order, or one rotated from round to round, which
keeps each pass's neighbours, the same gather call measured up to 10 % slower in one place than
in another), and every pass
(warm-up and timed, gather and ceiling alike) starts after a sequential read of ``--evict-mib``
MiB (default: twice the last-level cache) that evicts what the pass before left in the cache:
otherwise a ceiling pass reads rows its predecessor (the same ids) left in the cache while the
gather's were just evicted -- on a VM with a 480 MiB L3 that gave the 1 GiB ceiling a third of its
rows from the cache and the gather 0.74-0.78 of it, where the same kernel on the store's rows
measured the ceiling's rate (docs/benchmarks.md). ``fraction_of_ceiling`` is the ratio of the
medians, ``fraction_of_ceiling_paired`` the median of the per-pass ratios (steadier on a shared
machine).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from ..errors import UsageError
from ..features._gather import host_empty, host_rows
from ..utils.progress import bar
from ..utils.rss import available_ram
from ..utils.torch_threads import set_torch_threads
from . import KINDS
from ._timing import median, time_passes

HELP = KINDS["gather"]
DESCRIPTION = __doc__.split("\n\n", 1)[1] if __doc__ else HELP

CEILING_ROW_BYTES = 512


def add_arguments(p) -> None:
    p.add_argument("dataset", metavar="DIR", help="a prepared gnnio dataset directory")
    p.add_argument("--batch-size", type=int, default=1024, help="seeds per mini-batch")
    p.add_argument("--fanouts", default="15,10,5", help="neighbours sampled per hop")
    p.add_argument("--batches", type=int, default=20, help="mini-batches gathered per pass")
    p.add_argument("--threads", type=int, default=2, help="CPU threads (sampler, gather, ceiling)")
    p.add_argument("--store", choices=["memory", "mmap"], default="memory", help="feature store")
    p.add_argument("--passes", type=int, default=5, help="timed passes (the median is reported)")
    p.add_argument("--warmup", type=int, default=1, help="untimed passes first")
    p.add_argument("--ceiling-gib", type=float, default=None,
                   help="size of the ceiling's buffer (default: 1 GiB or 4x the last-level "
                        "cache, the larger, at most a quarter of the memory available)")  # fmt: skip
    p.add_argument("--evict-mib", type=float, default=None,
                   help="MiB read before every pass to evict the cache (default: 2x the "
                        "last-level cache, at most a quarter of the memory available; 0: none)")  # fmt: skip
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the seed order, the sampler and the order of the passes",
    )
    p.add_argument(
        "--no-progress", "--quiet", dest="no_progress", action="store_true", help="no progress bars"
    )


def check_common(args) -> None:
    """One-line UsageErrors for the options the gather and loader benches share."""
    for name in ("batch_size", "batches", "threads", "passes"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0:
        raise UsageError(f"--warmup must be >= 0, got {args.warmup}")


def set_threads(n: int) -> None:
    """Threads for this bench (asked for by --threads): torch's pool and numba's, this thread."""
    set_torch_threads(n)  # (numba's pool first: its start would reset torch's count)
    try:
        import numba

        numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))  # type: ignore[attr-defined]  # set by numba.config at import
    except ImportError:  # pragma: no cover
        pass


def parse_fanouts_arg(text: str) -> list[int]:
    from ..sampling import parse_fanouts

    try:
        return parse_fanouts(text)
    except ValueError as e:
        raise UsageError(str(e)) from None


def seed_ids(ds) -> np.ndarray:
    """Seeds of the benches: the training split, or every node when there is none."""
    if ds.train_idx is not None and ds.train_idx.size:
        return np.asarray(ds.train_idx, dtype=np.int64)
    return np.arange(ds.num_nodes, dtype=np.int64)


def make_order(seeds: np.ndarray, batch_size: int, seed: int):
    from ..ordering import RandomOrder

    return RandomOrder(torch.as_tensor(seeds), batch_size, seed=seed)


def sample_batches(ds, args) -> list[torch.Tensor]:
    """The input-node ids of ``args.batches`` sampled mini-batches (the first of epoch 0)."""
    fanouts = parse_fanouts_arg(args.fanouts)
    seeds = seed_ids(ds)
    order = make_order(seeds, args.batch_size, args.seed)
    first = []
    for s in order.batches(0):
        first.append(s)
        if len(first) == args.batches:
            break
    while len(first) < args.batches:  # fewer seeds than batches asked for: go round again
        first.append(first[len(first) % max(1, order.num_batches)])
    from ..sampling import UniformSampler

    sampler = UniformSampler(ds.graph, fanouts, seed=args.seed, num_threads=args.threads)
    out = []
    with bar(len(first), "sampling", "batch", enabled=not args.no_progress) as pb:
        for i, s in enumerate(first):
            out.append(sampler.sample(s, epoch_seed=i).input_nodes)
            pb.update(1)
    return out


# ---- the ceiling ------------------------------------------------------------------------------

try:
    import numba
    from numba import njit, prange

    from ..features._gather import prefetch_row
    from ..utils.row_copy import copy_row

    @njit(parallel=True, nogil=True, cache=True)
    def _copy_rows_u64(src, ids, out):  # pragma: no cover - compiled
        # src [R, 64] uint64, ids [n] int64, out [>= n, 64] uint64: one 512-byte row per
        # iteration as a whole-row slice copy (an explicit per-word loop measured 2x slower here)
        for i in prange(ids.shape[0]):
            out[i, :] = src[ids[i], :]

    @njit(parallel=True, nogil=True, cache=True)
    def _copy_rows_u64_prefetch(src, ids, out, chunks, ahead):  # pragma: no cover - compiled
        # the same copy, each thread walking contiguous chunks and prefetching the 8 cache
        # lines of the row ``ahead`` positions on (random rows defeat the hardware prefetcher)
        n = ids.shape[0]
        for c in prange(chunks):
            lo = c * n // chunks
            hi = (c + 1) * n // chunks
            for i in range(lo, hi):
                if i + ahead < hi:
                    r = ids[i + ahead]
                    for off in range(0, 512, 64):
                        prefetch_row(src, r, off)
                out[i, :] = src[ids[i], :]

    @njit(parallel=True, nogil=True, cache=True)
    def _memcpy_rows(src, ids, out, chunks, ahead):  # pragma: no cover - compiled
        # a memcpy call per row (glibc's, vectorised for this CPU); prefetch as above if ahead > 0
        n = ids.shape[0]
        nbytes = src.shape[1] * 8
        for c in prange(chunks):
            lo = c * n // chunks
            hi = (c + 1) * n // chunks
            for i in range(lo, hi):
                if ahead > 0 and i + ahead < hi:
                    r = ids[i + ahead]
                    for off in range(0, 512, 64):
                        prefetch_row(src, r, off)
                copy_row(out, i, src, ids[i], nbytes)

except ImportError:  # pragma: no cover
    numba = None  # type: ignore[assignment]  # (no numba: the numba kernels are not offered)


def llc_bytes() -> int:
    """The largest CPU cache of this machine (sysfs), or 32 MiB where it cannot be read."""
    best = 0
    for d in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (d / "size").read_text().strip().upper()
        except OSError:
            continue
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text[:-1] if text[-1:] in "KMG" else text
        if digits.isdigit():
            best = max(best, int(digits) * mult)
    return best or (32 << 20)


def make_evict(nbytes: int):
    """``evict()``: a sequential read of ``nbytes`` of a buffer of its own (pre-faulted), which
    pushes what the previous pass left out of the cache; a no-op for 0 bytes."""
    words = nbytes // 8
    if words < 8:
        return lambda: None
    buf = host_empty((words // 8, 8), np.uint64)
    buf.fill(1)
    return lambda: int(buf.sum())


def make_ceiling(rows_per_call: list[int], gib: float, seed: int, progress: bool):
    """Passes of the random-512-byte-row copy, one function per implementation."""
    words = CEILING_ROW_BYTES // 8
    nrows = max(1, int(gib * (1 << 30)) // CEILING_ROW_BYTES)
    src = host_empty((nrows, words), np.uint64)  # 2 MiB-aligned: no row straddles a cache line
    step = max(1, nrows // 64)
    with bar(nrows * CEILING_ROW_BYTES >> 20, "ceiling buffer", "MiB", enabled=progress) as pb:
        for s in range(0, nrows, step):  # touch every page (untouched pages read as zero page)
            src[s : s + step] = np.arange(s, min(nrows, s + step), dtype=np.uint64)[:, None]
            pb.update(min(step, nrows - s) * CEILING_ROW_BYTES >> 20)
    rng = np.random.default_rng(seed + 1)
    ids = [rng.integers(0, nrows, n, dtype=np.int64) for n in rows_per_call]
    out = host_empty((max(rows_per_call), words), np.uint64)
    out.fill(0)  # pre-faulted
    src_t, out_t = torch.from_numpy(src), torch.from_numpy(out)
    ids_t = [torch.from_numpy(i) for i in ids]

    def torch_pass():
        for i in ids_t:
            torch.index_select(src_t, 0, i, out=out_t[: len(i)])

    impls = {"aten_index_select": torch_pass}
    if numba is not None:

        def numba_pass():
            for i in ids:
                _copy_rows_u64(src, i, out)

        def numba_prefetch_pass():
            chunks = 4 * numba.get_num_threads()
            for i in ids:
                _copy_rows_u64_prefetch(src, i, out, chunks, 8)

        def memcpy_pass(ahead):
            chunks = 4 * numba.get_num_threads()
            for i in ids:
                _memcpy_rows(src, i, out, chunks, ahead)

        impls["numba_u64_rows"] = numba_pass
        impls["numba_u64_rows_prefetch"] = numba_prefetch_pass
        impls["numba_memcpy_rows"] = lambda: memcpy_pass(0)
        impls["numba_memcpy_rows_prefetch"] = lambda: memcpy_pass(8)
    return impls, sum(rows_per_call) * CEILING_ROW_BYTES


def run(args) -> dict:
    import gnnio

    from ..features import open_store

    check_common(args)
    llc = llc_bytes()
    avail = available_ram()
    if args.ceiling_gib is None:  # 1 GiB or 4x the cache, in quarter GiB; at most a quarter of RAM
        args.ceiling_gib = max(1.0, math.ceil(4 * llc / (1 << 28)) / 4)
        if avail is not None:  # (a quarter of what is free always passes the check below)
            args.ceiling_gib = min(args.ceiling_gib, avail / 4 / (1 << 30))
    if not 0 < args.ceiling_gib < float("inf"):
        raise UsageError(f"--ceiling-gib must be > 0, got {args.ceiling_gib}")
    if avail is not None and args.ceiling_gib * (1 << 30) > avail // 2:
        raise UsageError(
            f"--ceiling-gib {args.ceiling_gib:g}: more than half of the "
            f"{avail / 2**30:.1f} GiB of memory available now"
        )
    evict_mib = args.evict_mib
    if evict_mib is None:  # 2x the cache; at most a quarter of the memory (as checked below)
        evict_mib = 2 * llc / (1 << 20)
        if avail is not None:
            evict_mib = min(evict_mib, avail / 4 / (1 << 20))
    limit = (avail if avail is not None else 1 << 50) / 4  # (unknown memory: any finite size)
    if not 0 <= evict_mib * (1 << 20) <= limit:
        raise UsageError(f"--evict-mib must be >= 0 and at most a quarter of the memory "
                         f"available now, got {evict_mib:g}")  # fmt: skip
    set_threads(args.threads)
    ds = gnnio.load(args.dataset)
    ids = sample_batches(ds, args)
    store = open_store(ds, kind=args.store, num_threads=args.threads, progress=not args.no_progress)
    rows = [int(i.shape[0]) for i in ids]
    # reused and pre-faulted, on a 2 MiB boundary like the ceiling's buffers (as the loader's ring)
    out = host_rows(max(rows), store.dim, store.dtype)
    useful = sum(rows) * store.row_bytes
    get_host = getattr(store, "host_tensor", None)
    host = get_host() if callable(get_host) else None
    offset = None if host is None else int(host.data_ptr() % 64)

    def gather_pass():
        for i in ids:
            store.gather(i, out=out)

    ceilings, ceiling_bytes = make_ceiling(rows, args.ceiling_gib, args.seed, not args.no_progress)
    fns = {"gather": gather_pass, **ceilings}
    evict = make_evict(int(evict_mib * (1 << 20)))
    times: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():  # warm-up: JIT, page faults
        for _ in range(args.warmup):
            evict()
            fn()
    with bar(args.passes, "timed passes", "pass", enabled=not args.no_progress) as pb:
        keys = list(fns)
        rng = np.random.default_rng(args.seed)
        for _ in range(args.passes):  # interleaved, so all see the same machine load
            for k in rng.permutation(keys):  # a fresh order each round: no fixed slot or neighbour
                evict()  # each pass starts with the cache holding none of its rows
                times[k] += time_passes(fns[k], warmup=0, passes=1)
            pb.update(1)
    t_gather = median(times["gather"])
    ceil = {k: ceiling_bytes / median(times[k]) / 1e9 for k in ceilings}
    best = max(ceil, key=lambda k: ceil[k])
    gbps = useful / t_gather / 1e9
    return {
        "dataset": str(ds.path),
        "store": args.store,
        "threads": args.threads,
        "batches": args.batches,
        "rows_per_batch": float(np.mean(rows)),
        "row_bytes": store.row_bytes,
        "store_row_offset_mod_64": offset,
        "ms_per_batch": t_gather / args.batches * 1e3,
        "gb_per_s": gbps,
        "ceiling_gb_per_s": ceil[best],
        "ceiling_impl": best,
        **{f"ceiling_{k}_gb_per_s": v for k, v in ceil.items()},
        "ceiling_gib": args.ceiling_gib,
        "llc_mib": llc / (1 << 20),
        "evict_mib": evict_mib,
        "fraction_of_ceiling": gbps / ceil[best],
        # the same, as the median over passes of (ceiling time / gather time) within one pass:
        # steadier than the ratio of medians when the machine's load drifts between passes
        "fraction_of_ceiling_paired": median(
            [c / g * useful / ceiling_bytes for c, g in zip(times[best], times["gather"])]
        ),
        "passes": args.passes,
        "counters": store.counters.snapshot(),
    }
