"""``gnnio bench cache DIR``: feature-cache hit ratio and management overhead per policy, cache size
and seed order (BGL Figure 5), and the cross-batch redundancy rate eta1 per batch size (HyDRA
Figure 4).

Protocol. For every seed order (``random`` = :class:`gnnio.ordering.shuffle.RandomOrder`, ``po`` =
:class:`gnnio.ordering.po.ProximityOrder` with the automatic number of sequences) the first
``--warmup + --batches`` batches (continuing into the next epochs if needed) are sampled once with
:class:`gnnio.sampling.UniformSampler` (``--fanouts``, ``epoch_seed`` = batch index) -- the access
trace. Every (policy, size) cache is then a real :class:`gnnio.features.caches.cache.FeatureCache` over
the dataset's feature store, fed the trace's ``input_nodes`` one batch at a time into a reused
output buffer: the first ``--warmup`` batches fill it, the next ``--batches`` are measured.

* ``hit_ratio["<policy>+<order>"]["<size>"]``: per-batch hits / distinct input nodes, averaged
  over the measured batches; ``size`` is the capacity as a fraction of all nodes.
* ``overhead_ms["<policy>+<order>"]``: mean cache-management time per batch (dedup, lookup,
  bookkeeping, victim selection; not the row copies, which are ``copy_ms``) at size 0.1 (BGL
  Fig. 5a's 10 % cache), or the middle size when 0.1 is not measured; ``overhead_ms_by_size`` has
  every size. CPU times of the vectorized torch code on this machine: a GPU runs the same ops.
* ``fetched_rows["<policy>+<order>"]["<size>"]``: mean rows per batch fetched from the backing
  store (misses). PO batches have fewer distinct input nodes (seeds close in the graph share
  neighbours), so this traffic can drop even where the hit ratio does not rise.
* ``rows_fetched``: the same as ``fetched_rows`` (the name issue 18 uses).
* ``lookahead`` (:mod:`gnnio.features.caches.lookahead`): Belady's MIN over the next ``--lookahead``
  batches of the trace, announced to the cache before it serves each batch (what the loader does
  in training), frequency and ``--score`` hotness beyond the window; ``optimal``: MIN with the
  whole trace announced first, the offline bound (not a policy a loader can run). Their
  ``overhead_ms`` includes announcing a batch. ``--lookahead-ks 1,2,4,8,16`` adds
  ``lookahead_by_k["<order>"]["<size>"]["<K>"] = {"hit_ratio", "rows_fetched"}``.
* ``eta1["<batch size>"]``: mean share of a batch's input nodes that the previous batch also had,
  over ``--eta-batches`` consecutive random-order batches (``eta1_by_order`` adds the PO order).

The static policy keeps the top nodes by ``--score`` (default ``wrpr``, weighted reverse PageRank,
Data Tiering); if that score cannot be computed the bench falls back to ``degree`` and says so in
``static_score``.
"""

from __future__ import annotations

import time
import warnings

import numpy as np
import torch

from ..errors import UsageError
from ..utils.progress import bar
from ..utils.warnings_at import warn
from . import KINDS

HELP = KINDS["cache"]
DESCRIPTION = (
    "Sample the first --warmup + --batches batches of each seed order (random, BGL's proximity-"
    "aware 'po') once, replay their input nodes through a real cache per policy and size (as a "
    "fraction of all nodes), and report the mean per-batch hit ratio (BGL Figure 5b), the cache-"
    "management ms per batch at size 0.1 (Figure 5a; CPU times), rows fetched per batch, and the "
    "redundancy rate eta1 of consecutive batches per batch size (HyDRA Figure 4). The static "
    "policy keeps the top nodes by --score."
)

ORDERS = ("random", "po")


def _csv(text: str, cast, name: str) -> list:
    try:
        vals = [cast(t) for t in str(text).split(",") if t.strip()]
    except ValueError:
        raise UsageError(f"--{name}: expected a comma-separated list, got {text!r}") from None
    if not vals:
        raise UsageError(f"--{name}: empty list")
    return vals


def add_arguments(p) -> None:
    p.add_argument("dataset", metavar="DIR", help="a prepared gnnio dataset directory")
    p.add_argument("--policies", default="static,fifo,lru,lfu", help="cache policies")
    p.add_argument("--orders", default="random,po", help="seed orders: random, po")
    p.add_argument(
        "--sizes", default="0.01,0.05,0.1,0.2", help="cache sizes, fractions of all nodes"
    )
    p.add_argument("--fanouts", default="15,10,5", help="neighbours sampled per hop")
    p.add_argument("--batch-size", type=int, default=1024, help="seeds per mini-batch")
    p.add_argument("--batches", type=int, default=30, help="measured batches per order")
    p.add_argument("--warmup", type=int, default=5, help="batches that fill the cache first")
    p.add_argument(
        "--eta-batch-sizes", default="256,1024,4096", help="batch sizes for eta1 (HyDRA Fig. 4)"
    )
    p.add_argument("--eta-batches", type=int, default=8, help="consecutive batches per eta1 value")
    p.add_argument(
        "--score", default="wrpr", help="hotness score of the static cache (lookahead: tie-break)"
    )
    p.add_argument(
        "--lookahead", type=int, default=8, metavar="K", help="lookahead: batches announced ahead"
    )
    p.add_argument(
        "--lookahead-ks", default="", metavar="K,K,..", help="also sweep lookahead over these K"
    )
    p.add_argument("--store", choices=["memory", "mmap"], default="memory", help="backing store")
    p.add_argument("--po-sequences", type=int, default=None, help="PO: k (default automatic)")
    p.add_argument("--threads", type=int, default=2, help="CPU threads (sampler, copies)")
    p.add_argument("--seed", type=int, default=0, help="seed of orders and sampler")
    p.add_argument("--plot", default=None, metavar="PNG", help="write a PNG plot here")
    p.add_argument(
        "--no-progress", "--quiet", dest="no_progress", action="store_true", help="no progress bars"
    )


def _check(args) -> tuple[list[str], list[str], list[float], list[int]]:
    from ..features.caches.lookahead import POLICIES

    policies = _csv(args.policies, str, "policies")
    for pol in policies:
        if pol not in POLICIES:
            raise UsageError(
                f"--policies: unknown policy {pol!r}; choose from {', '.join(POLICIES)}"
            )
    orders = _csv(args.orders, str, "orders")
    for o in orders:
        if o not in ORDERS:
            raise UsageError(f"--orders: unknown order {o!r}; choose from {', '.join(ORDERS)}")
    sizes = _csv(args.sizes, float, "sizes")
    if any(not 0 <= s <= 1 for s in sizes):
        raise UsageError(f"--sizes: each must be a fraction in [0, 1], got {args.sizes!r}")
    eta_sizes = _csv(args.eta_batch_sizes, int, "eta-batch-sizes") if args.eta_batch_sizes else []
    for name in ("batch_size", "batches", "threads"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0 or args.eta_batches < 2:
        raise UsageError("--warmup must be >= 0 and --eta-batches >= 2")
    if args.lookahead < 0:
        raise UsageError(f"--lookahead must be >= 0, got {args.lookahead}")
    if any(b < 1 for b in eta_sizes):
        raise UsageError(f"--eta-batch-sizes: each must be >= 1, got {args.eta_batch_sizes!r}")
    return policies, orders, sizes, eta_sizes


def _size_key(s: float) -> str:
    return f"{s:g}"


def _make_order(name, ds, seeds, batch_size, args):
    from ..ordering import RandomOrder

    if name == "random":
        return RandomOrder(seeds, batch_size, seed=args.seed)
    from ..ordering.po import ProximityOrder

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # bound_met is reported instead
        return ProximityOrder(
            ds.graph,
            seeds,
            np.asarray(ds.labels),
            batch_size,
            seed=args.seed,
            num_sequences=args.po_sequences,
            progress=not args.no_progress,
        )


def _trace(order, sampler, count: int, desc: str, progress: bool) -> list[torch.Tensor]:
    """``input_nodes`` of the first ``count`` batches of ``order`` (epochs 0, 1, ...)."""
    out: list[torch.Tensor] = []
    epoch = 0
    with bar(count, desc, "batch", enabled=progress) as pb:
        while len(out) < count:
            for s in order.batches(epoch):
                out.append(sampler.sample(s, epoch_seed=len(out)).input_nodes)
                pb.update(1)
                if len(out) == count:
                    break
            epoch += 1
            if order.num_batches == 0:
                raise UsageError("the seed order yields no batches (no training seeds?)")
    return out


def _replay(cache_cls, store, capacity, pol, hot, k, trace, warmup, buf):
    """Serve ``trace`` through a fresh cache (the first ``warmup`` batches unmeasured); a
    ``lookahead`` cache is told the next ``k`` batches before each one, ``optimal`` the whole
    trace first. Returns the measured stats and the announce ms per measured batch."""
    cache = cache_cls(
        store, capacity, pol, hot_ids=hot if pol in ("static", "lookahead", "optimal") else None,
        lookahead=k,
    )  # fmt: skip
    ahead = len(trace) if pol == "optimal" else (k if pol == "lookahead" else 0)
    announced, announce_s = 0, 0.0
    for t, ids in enumerate(trace):
        if t == warmup:
            cache.reset_stats()
            announce_s = 0.0
        t0 = time.perf_counter()
        while announced < min(len(trace), t + 1 + ahead):
            cache.announce(trace[announced])
            announced += 1
        announce_s += time.perf_counter() - t0
        cache.gather(ids, out=buf)
    measured = max(1, len(trace) - warmup)
    return cache.stats, announce_s / measured * 1e3


def _static_hot(ds, args) -> tuple[np.ndarray, str]:
    from ..preprocess.hotness import compute_score

    name = args.score
    try:
        score = compute_score(
            name,
            ds,
            fanouts=[int(f) for f in args.fanouts.split(",")],
            batch_size=args.batch_size,
            progress=not args.no_progress,
        )
    except Exception as e:  # noqa: BLE001 - report and fall back, as documented
        warn(f"bench cache: score {name!r} failed ({e}); static cache uses 'degree'")
        name = "degree (fallback)"
        score = np.asarray(ds.graph.out_degrees(), dtype=np.float64)
    order = np.lexsort((np.arange(score.shape[0]), -np.asarray(score)))  # hottest first, ties by id
    return order.astype(np.int64), name


def run(args) -> dict:
    from ..features import open_store
    from ..features.caches.cache import FeatureCache, capacity_rows
    from ..features.caches.reuse import redundancy_rates
    from ..graph.dataset import load
    from ..ordering.po import shuffling_error
    from ..sampling import UniformSampler, parse_fanouts
    from .gather import seed_ids, set_threads

    policies, orders, sizes, eta_sizes = _check(args)
    try:
        fanouts = parse_fanouts(args.fanouts)
    except ValueError as e:
        raise UsageError(f"--fanouts: {e}") from None
    set_threads(args.threads)
    progress = not args.no_progress
    ds = load(args.dataset)
    if ds.labels is None and "po" in orders:  # (its sequences come from the labels' bound)
        raise UsageError(f"--orders po: {args.dataset} has no labels, which the proximity-aware "
                         "order's shuffling-error bound needs; use --orders random")  # fmt: skip
    seeds = seed_ids(ds)
    labels = None if ds.labels is None else np.asarray(ds.labels)
    sampler = UniformSampler(ds.graph, fanouts, seed=args.seed, num_threads=args.threads)
    n_nodes = ds.num_nodes
    total = args.warmup + args.batches

    result: dict = {
        "dataset": str(args.dataset),
        "num_nodes": n_nodes,
        "num_seeds": int(seeds.shape[0]),
        "batch_size": args.batch_size,
        "fanouts": fanouts,
        "warmup": args.warmup,
        "batches": args.batches,
        "device": "cpu (a GPU cache simulated in host memory; times are CPU times)",
    }
    traces, order_info = {}, {}
    for o in orders:
        t0 = time.perf_counter()
        order = _make_order(o, ds, seeds, args.batch_size, args)
        build_s = time.perf_counter() - t0
        info = {"build_s": round(build_s, 3), "num_batches_per_epoch": order.num_batches}
        info["shuffling_error"] = (  # (no labels: no classes to be shuffled)
            None
            if labels is None
            else shuffling_error(labels[order.epoch_order(0)], args.batch_size)
        )
        if o == "po":
            info.update(
                num_sequences=order.num_sequences,
                bound=order.bound_value,
                bound_met=order.bound_met,
            )
        order_info[o] = info
        traces[o] = _trace(order, sampler, total, f"sampling ({o})", progress)
        info["input_nodes_mean"] = float(np.mean([t.numel() for t in traces[o][args.warmup :]]))
    result["orders"] = order_info

    hot, score_name = (None, None)
    if {"static", "lookahead", "optimal"} & set(policies) or args.lookahead_ks:
        hot, score_name = _static_hot(ds, args)
        result["static_score"] = score_name

    store = open_store(ds, kind=args.store, progress=progress, num_threads=args.threads)
    max_rows = max(int(t.numel()) for tr in traces.values() for t in tr)
    buf = torch.empty((max_rows, store.dim), dtype=store.dtype)
    hit_ratio: dict = {}
    overhead: dict = {}
    copy_ms: dict = {}
    fetched: dict = {}
    ref_size = 0.1 if 0.1 in sizes else sorted(sizes)[len(sizes) // 2]
    ks = _csv(args.lookahead_ks, int, "lookahead-ks") if args.lookahead_ks else []
    runs = [(p, o, s, args.lookahead, False) for o in orders for p in policies for s in sizes]
    runs += [("lookahead", o, s, k, True) for o in orders for s in sizes for k in ks]
    by_k: dict = {}
    with bar(len(runs), "caches", "cache", enabled=progress) as pb:
        for pol, o, size, k, sweep in runs:
            st, announce_ms = _replay(
                FeatureCache, store, capacity_rows(float(size), n_nodes), pol, hot, k,
                traces[o], args.warmup, buf,
            )  # fmt: skip
            fetched_mean = round(st.misses / max(1, st.batches), 1)
            if sweep:
                by_k.setdefault(o, {}).setdefault(_size_key(size), {})[str(k)] = {
                    "hit_ratio": round(st.hit_ratio, 6), "rows_fetched": fetched_mean}  # fmt: skip
                pb.update(1)
                continue
            key = f"{pol}+{o}"
            hit_ratio.setdefault(key, {})[_size_key(size)] = round(st.hit_ratio, 6)
            manage = st.manage_ms_per_batch + announce_ms
            overhead.setdefault(key, {})[_size_key(size)] = round(manage, 4)
            copy_ms.setdefault(key, {})[_size_key(size)] = round(st.copy_ms_per_batch, 4)
            fetched.setdefault(key, {})[_size_key(size)] = fetched_mean
            pb.update(1)
    if ks:
        result["lookahead_by_k"] = by_k
    if {"lookahead", "optimal"} & set(policies):
        result["lookahead"] = args.lookahead
    result["hit_ratio"] = hit_ratio
    result["overhead_ms"] = {k: v[_size_key(ref_size)] for k, v in overhead.items()}
    result["overhead_size"] = ref_size
    result["overhead_ms_by_size"] = overhead
    result["copy_ms_by_size"] = copy_ms
    result["fetched_rows"] = fetched
    result["rows_fetched"] = fetched

    eta_by_order: dict = {}
    for o in orders:
        for bs in eta_sizes:
            order = _make_order(o, ds, seeds, bs, args)
            tr = _trace(order, sampler, args.eta_batches, f"eta1 {o} b={bs}", progress)
            eta_by_order.setdefault(o, {})[str(bs)] = round(
                float(redundancy_rates(tr, n_nodes).mean()), 6
            )
    result["eta1"] = eta_by_order.get("random", next(iter(eta_by_order.values()), {}))
    result["eta1_by_order"] = eta_by_order
    if args.plot:
        plot(result, args.plot)
        result["plot"] = args.plot
    return result


def plot(result: dict, path: str) -> None:
    """Hit ratio vs cache size per policy+order, overhead per policy+order, eta1 vs batch size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    policies = list(dict.fromkeys(k.split("+")[0] for k in result["hit_ratio"]))
    color = {p: f"C{i}" for i, p in enumerate(policies)}
    ax = axes[0]
    for key, per_size in result["hit_ratio"].items():
        pol, order = key.split("+")
        xs = sorted(per_size, key=float)
        ax.plot(
            [100 * float(x) for x in xs],
            [per_size[x] for x in xs],
            "-" if order == "po" else "--",
            marker="o" if order == "po" else "s",
            color=color[pol],
            label=key,
        )
    ax.set_xlabel("cache size (% of nodes)")
    ax.set_ylabel("hit ratio")
    ax.set_title("hit ratio (BGL Fig. 5b); dashed = random order")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax = axes[1]
    keys = list(result["overhead_ms"])
    ax.bar(
        range(len(keys)),
        [result["overhead_ms"][k] for k in keys],
        color=[color[k.split("+")[0]] for k in keys],
    )
    ax.set_xticks(range(len(keys)), keys, rotation=45, ha="right", fontsize=7)
    ax.set_ylabel("ms / batch")
    ax.set_title(f"cache management at size {result['overhead_size']:g} (CPU, measured)")
    ax.grid(alpha=0.3, axis="y")
    ax = axes[2]
    for o, per_bs in result.get("eta1_by_order", {}).items():
        xs = sorted(per_bs, key=int)
        ax.plot([int(x) for x in xs], [per_bs[x] for x in xs], marker="o", label=o)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel("eta1")
    ax.set_title("redundancy rate (HyDRA Fig. 4)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    name = result.get("dataset", "")
    fig.suptitle(
        f"gnnio bench cache {name} (b={result['batch_size']}, fanouts={result['fanouts']})"
    )
    fig.tight_layout()
    from ..utils.outputs import save_figure

    save_figure(fig, path, dpi=110)
    plt.close(fig)
