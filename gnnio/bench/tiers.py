"""``gnnio bench tiers DIR``: host->GPU traffic of a tiered feature store against the hot fraction,
for each hotness score (Data Tiering §5.3, Figure 10, "PCIe traffic vs. hot data portion"), and a
GPU gather-bandwidth micro-benchmark of the three ways to read feature rows.

* :func:`host_traffic_experiment` runs the real sampler over the training seeds and gathers every
  batch's ``input_nodes`` through one :class:`~gnnio.features.tiers.tiered.TieredFeatureStore` per
  (score, hot fraction); the store's own counters give the bytes per tier. The counts are exact on
  simulated devices too (they do not depend on the hardware); only times would.
* :func:`gpu_gather_bandwidth` (CUDA only; :mod:`gnnio.bench.tier_bandwidth`) measures, on one
  GPU: (a) gathering GPU-resident rows against a device-to-device copy, (b) zero-copy gathering of
  pinned host rows against a pinned host->device copy, (c) CPU gather + copy; and the tiered store
  end to end.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import UsageError
from ..features.tiers.tiered import TieredFeatureStore, hot_rows_for_fraction
from ..utils.argtypes import fanouts_arg, int_range
from ..utils.progress import bar
from . import KINDS
from .tier_bandwidth import gpu_gather_bandwidth

__all__ = [
    "DESCRIPTION",
    "HELP",
    "add_arguments",
    "gpu_gather_bandwidth",
    "host_traffic_experiment",
    "run",
]

HELP = KINDS["tiers"]
DESCRIPTION = (
    "Sample an epoch over the training nodes and gather every batch's features through a tiered "
    "store (hot rows on the GPU, the rest read from host memory) for each hotness score and hot "
    "fraction; report host->GPU bytes per epoch, GPU-tier hit ratio and traffic reduction against "
    "hot fraction 0 (Data Tiering Figure 10). 'oracle' ranks nodes by the true access counts of "
    "the measured epoch(s). Without a GPU the tiers are simulated; byte counts are exact either way."
)

DEFAULT_FRACTIONS = (0.0, 0.05, 0.1, 0.25)
DEFAULT_SCORES = ("degree", "rpr", "wrpr", "sj", "presample")


def host_traffic_experiment(
    dataset: Any,
    scores: Mapping[str, Any],
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    fanouts: Sequence[int] = (15, 10, 5),
    batch_size: int = 1024,
    epochs: int = 1,
    seed: int = 0,
    *,
    device: str | torch.device = "cpu",
    count_only: bool = False,
    num_threads: int | None = None,
    progress: bool = True,
    oracle: bool = False,
    max_batches: int | None = None,
) -> dict[str, Any]:
    """Host->GPU feature bytes per epoch for each hotness score and hot fraction.

    Batches: :class:`gnnio.ordering.shuffle.RandomOrder` over ``train_idx`` (seed ``seed``), sampled by
    :class:`gnnio.sampling.UniformSampler` (seed ``seed``) with ``epoch_seed = epoch * 2**32 +
    batch`` -- the same batches as :func:`gnnio.preprocess.hotness.presample_counts` with the same arguments,
    so ``presample_counts(..., seed=seed)`` is the exact oracle score for this run. Each batch is
    sampled once and gathered by every store. A batch's ``input_nodes`` are distinct, so the bytes
    counted are those of the *unique* rows of each batch (rows shared by two batches count twice).

    Args:
        dataset: a :class:`gnnio.Dataset` (needs a train split) or its directory.
        scores: score name -> ``[N]`` array (higher = hotter, global ids). Each score's hot set at
            fraction ``f`` is its ``top_count(f, N)`` highest ids (lookup mode, ties by id).
        fractions: hot fractions of the nodes (``0`` = everything from host memory).
        fanouts, batch_size, epochs, seed: sampling setup (``fanouts[0]`` = hop 1).
        device: ``"cpu"`` simulates the GPU tier; ``"cuda"`` moves real rows.
        count_only: route and count ids without copying rows (:meth:`TieredFeatureStore.account`,
            same counts, much faster); False gathers the rows for real.
        num_threads: sampler threads; None = numba's setting.
        progress: progress bar over batches.
        oracle: also report the score ``"oracle"``: the per-node access counts (batches whose
            ``input_nodes`` hold the node) of *this very run* -- recorded while the batches are
            sampled, then the recorded batches are replayed through the oracle's stores. It is the
            best any static hot set can do on this trace.
        max_batches: measure only the first ``max_batches`` batches of each epoch (None = all);
            bytes "per epoch" then mean per measured (partial) epoch, and the oracle counts the
            same partial epochs.

    Memory: every store holds its hot rows, i.e. ``sum(fractions) * len(scores)`` times the
    feature bytes, plus the features themselves in RAM; ``oracle`` also keeps the measured batches'
    ids (8 bytes per requested row).

    Returns:
        ``{"dataset", "path", "num_nodes", "num_train", "row_bytes", "fanouts", "batch_size",
        "epochs", "seed", "batches_per_epoch" (measured), "full_batches_per_epoch", "max_batches",
        "requested_rows_per_epoch", "requested_bytes_per_epoch", "nodes_accessed" (distinct nodes
        read in the whole run), "mean_rows_per_batch", "oracle" (how the oracle was obtained, or
        None), "simulated", "device", "count_only", "rows": [...], "host_bytes_by_score",
        "reduction_pct"}`` where each row is ``{"score", "fraction", "hot_rows",
        "host_bytes_per_epoch", "gpu_bytes_per_epoch", "host_rows_per_epoch",
        "gpu_rows_per_epoch", "hit_ratio" (GPU-tier rows / rows, overall), "hit_ratio_batch_mean"
        (per batch, averaged), "traffic_reduction" (1 - host bytes / host bytes at fraction 0)}``;
        ``host_bytes_by_score[score][str(f)]`` and ``reduction_pct[score][str(f)]`` (100 x
        traffic_reduction) summarise the rows. Bytes are counted by the stores (measured counts,
        not modeled).
    """
    from ..graph.dataset import load

    if isinstance(dataset, (str, os.PathLike)):
        dataset = load(dataset)
    if dataset.train_idx is None or len(dataset.train_idx) == 0:
        raise UsageError(f"{dataset.path}: has no train split; the experiment samples from it")
    if epochs < 1:
        raise UsageError(f"epochs: must be >= 1, got {epochs}")
    if batch_size < 1:
        raise UsageError(f"batch_size: must be >= 1, got {batch_size}")
    if max_batches is not None and max_batches < 1:
        raise UsageError(f"max_batches: must be >= 1, got {max_batches}")
    if not scores and not oracle:
        raise UsageError("scores: need at least one score")
    if oracle and "oracle" in scores:
        raise UsageError("scores: 'oracle' is reserved for the measured access counts")
    n = dataset.num_nodes
    fracs = [float(f) for f in fractions]
    for f in fracs:
        hot_rows_for_fraction(f, n)  # validates
    feats = np.asarray(dataset.features)
    if isinstance(dataset.features, np.memmap):
        feats = np.array(dataset.features)  # in RAM once, shared by all stores' host tiers
    train = np.asarray(dataset.train_idx, dtype=np.int64)
    from ..ordering import RandomOrder
    from ..sampling import UniformSampler

    stores: list[tuple[str, float, TieredFeatureStore]] = []
    for name, score in scores.items():
        for f in fracs:
            stores.append((name, f, TieredFeatureStore.from_scores(feats, score, f, device=device)))

    sampler = UniformSampler(dataset.graph, fanouts, seed=seed, num_threads=num_threads)
    order = RandomOrder(train, batch_size, seed=seed)
    full_nb = -(-train.size // batch_size)
    nb = full_nb if max_batches is None else min(full_nb, int(max_batches))
    counts = np.zeros(n, dtype=np.int64)  # batches reading each node, over the whole run
    trace: list[torch.Tensor] = []
    feeder = _Feeder(feats.shape[1], count_only)
    requested = 0
    with bar(epochs * nb, desc="tier traffic", unit="batch", enabled=progress) as pb:
        for ep in range(epochs):
            for b, seeds in enumerate(order.batches(ep)):
                if b >= nb:
                    break
                mb = sampler.sample(seeds, epoch_seed=(ep << 32) + b)
                ids_cpu = mb.input_nodes
                counts[ids_cpu.numpy()] += 1  # input_nodes are distinct within a batch
                requested += int(ids_cpu.shape[0])
                if oracle:
                    trace.append(ids_cpu)
                if stores:
                    feeder.feed(stores, ids_cpu.to(stores[0][2].device))
                pb.update(1)
    if oracle:
        ostores = [
            ("oracle", f, TieredFeatureStore.from_scores(feats, counts, f, device=device))
            for f in fracs
        ]
        ofeed = _Feeder(feats.shape[1], count_only)
        with bar(len(trace), desc="oracle replay", unit="batch", enabled=progress) as pb:
            for ids_cpu in trace:
                ofeed.feed(ostores, ids_cpu.to(ostores[0][2].device))
                pb.update(1)
        trace.clear()
        stores += ostores
        feeder.hit_sums += ofeed.hit_sums
    batches = epochs * nb
    rb = stores[0][2].row_bytes

    rows: list[dict[str, Any]] = []
    host_at_zero: dict[str, float] = {}
    for i, (name, f, st) in enumerate(stores):
        host_b = st.counters.bytes.get("host", 0) / epochs
        if st.num_hot == 0:
            host_at_zero.setdefault(name, host_b)
        rows.append(
            {
                "score": name,
                "fraction": f,
                "hot_rows": st.num_hot,
                "host_bytes_per_epoch": host_b,
                "gpu_bytes_per_epoch": st.counters.bytes.get("gpu", 0) / epochs,
                "host_rows_per_epoch": st.counters.rows.get("host", 0) / epochs,
                "gpu_rows_per_epoch": st.counters.rows.get("gpu", 0) / epochs,
                "hit_ratio": st.counters.rows.get("gpu", 0) / requested if requested else 0.0,
                "hit_ratio_batch_mean": feeder.hit_sums[i] / batches if batches else 0.0,
            }
        )
    full = requested * rb / epochs  # host bytes with no GPU tier (fraction 0)
    for r in rows:
        base = host_at_zero.get(r["score"], full)
        r["traffic_reduction"] = 1.0 - r["host_bytes_per_epoch"] / base if base else 0.0
    simulated = stores[0][2].simulated
    gpu_name = str(stores[0][2].gpu_name)
    for _, _, st in stores:
        st.close()
    host_by: dict[str, dict[str, float]] = {}
    red_pct: dict[str, dict[str, float]] = {}
    for r in rows:
        host_by.setdefault(r["score"], {})[str(r["fraction"])] = r["host_bytes_per_epoch"]
        red_pct.setdefault(r["score"], {})[str(r["fraction"])] = 100.0 * r["traffic_reduction"]
    return {
        "dataset": dataset.name,
        "path": str(dataset.path),
        "num_nodes": n,
        "num_train": int(train.size),
        "row_bytes": rb,
        "fanouts": [int(k) for k in fanouts],
        "batch_size": int(batch_size),
        "epochs": int(epochs),
        "seed": int(seed),
        "batches_per_epoch": nb,
        "full_batches_per_epoch": full_nb,
        "max_batches": None if max_batches is None else int(max_batches),
        "requested_rows_per_epoch": requested / epochs,
        "requested_bytes_per_epoch": full,
        "nodes_accessed": int(np.count_nonzero(counts)),
        "mean_rows_per_batch": requested / batches if batches else 0.0,
        "oracle": ORACLE_SOURCE if oracle else None,
        "simulated": simulated,
        "device": gpu_name,
        "count_only": bool(count_only),
        "rows": rows,
        "host_bytes_by_score": host_by,
        "reduction_pct": red_pct,
    }


#: what the ``oracle`` score of :func:`host_traffic_experiment` is
ORACLE_SOURCE = "access counts of the measured batches themselves (same run, same trace)"


class _Feeder:
    """Sends one batch's ids through every store (real gather or count only) and sums each store's
    per-batch GPU-tier hit ratio."""

    def __init__(self, dim: int, count_only: bool):
        self.dim = dim
        self.count_only = count_only
        self.out: torch.Tensor | None = None
        self.hit_sums: list[float] = []

    def feed(self, stores: list[tuple[str, float, TieredFeatureStore]], ids: torch.Tensor) -> None:
        if not self.hit_sums:
            self.hit_sums = [0.0] * len(stores)
        k = int(ids.shape[0])
        st0 = stores[0][2]
        if not self.count_only and (self.out is None or self.out.shape[0] < k):
            rows = max(k, 2 * (0 if self.out is None else self.out.shape[0]))
            self.out = torch.empty((rows, self.dim), dtype=st0.dtype, device=st0.device)
        for i, (_, _, st) in enumerate(stores):
            if self.count_only:
                g, _ = st.account(ids)
            else:
                before = st.counters.rows.get("gpu", 0)
                st.gather(ids, out=self.out)
                g = st.counters.rows.get("gpu", 0) - before
            self.hit_sums[i] += g / k if k else 0.0


def traffic_table(result: Mapping[str, Any]) -> str:
    """Markdown table of one :func:`host_traffic_experiment` result: per score, host->GPU MB per
    epoch at each hot fraction and, in brackets, the reduction against fraction 0 in %."""
    fracs: list[float] = []
    for r in result["rows"]:
        if r["fraction"] not in fracs:
            fracs.append(r["fraction"])
    by = {(r["score"], r["fraction"]): r for r in result["rows"]}
    names = list(dict.fromkeys(r["score"] for r in result["rows"]))
    head = "| score | " + " | ".join(f"{100 * f:g} % hot" for f in fracs) + " |"
    lines = [head, "| --- |" + " --- |" * len(fracs)]
    for name in names:
        cells = []
        for f in fracs:
            r = by.get((name, f))
            if r is None:
                cells.append("")
                continue
            mb = r["host_bytes_per_epoch"] / 1e6
            cells.append(
                f"{mb:,.1f} MB" + (f" (-{100 * r['traffic_reduction']:.1f} %)" if f else "")
            )
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_traffic(results: Sequence[Mapping[str, Any]], path: str | os.PathLike) -> None:
    """PNG with one panel per :func:`host_traffic_experiment` result: x = hot fraction (% of
    nodes), y = host->GPU bytes per epoch relative to hot fraction 0 (%), one line per score
    (``oracle`` dashed black)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = len(results)
    if k == 0:
        raise UsageError("plot_traffic: need at least one result")
    fig, axes = plt.subplots(1, k, figsize=(4.6 * k, 4.0), squeeze=False, sharey=True)
    for ax, res in zip(axes[0], results):
        names = list(dict.fromkeys(r["score"] for r in res["rows"]))
        for name in names:
            pts = sorted((r["fraction"], r["traffic_reduction"]) for r in res["rows"]
                         if r["score"] == name)  # fmt: skip
            x = [100 * f for f, _ in pts]
            y = [100 * (1 - red) for _, red in pts]
            style = {"color": "black", "linestyle": "--"} if name == "oracle" else {}
            ax.plot(x, y, marker="o", markersize=3, linewidth=1.3, label=name, **style)
        cap = "" if not res.get("max_batches") else f", first {res['batches_per_epoch']} batches"
        ax.set_title(
            f"{res['dataset']}: {res['num_nodes']:,} nodes, {res['num_train']:,} train\n"
            f"fanouts {res['fanouts']}, batch {res['batch_size']}{cap}",
            fontsize=9,
        )
        ax.set_xlabel("hot fraction in GPU tier (% of nodes)")
        ax.set_ylim(0, 105)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("host->GPU bytes per epoch (% of 0 % hot)")
    axes[0][-1].legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    from ..utils.outputs import save_figure

    save_figure(fig, path, dpi=120)
    plt.close(fig)


# ---- CLI (``gnnio bench tiers``) -------------------------------------------------------------------


def _csv_fracs(text: str) -> list[float]:
    try:
        vals = [float(t) for t in str(text).split(",") if t.strip()]
    except ValueError:
        raise UsageError(f"--fractions: expected comma-separated numbers, got {text!r}") from None
    if not vals or any(not 0 <= v <= 1 for v in vals):
        raise UsageError(f"--fractions: each must be in [0, 1], got {text!r}")
    return vals


def add_arguments(p) -> None:
    p.add_argument("dir", metavar="DIR", help="dataset directory (needs a train split)")
    p.add_argument("--scores", default=",".join(DEFAULT_SCORES),
                   help="comma-separated hotness scores (gnnio.preprocess.hotness.SCORES); 'oracle' (the "
                   "access counts of the measured run itself) is always added")  # fmt: skip
    p.add_argument("--fractions", default=",".join(str(f) for f in DEFAULT_FRACTIONS),
                   help="hot fractions of the nodes")  # fmt: skip
    p.add_argument("--fanouts", type=fanouts_arg, default="15,10,5",
                   help="per-hop fanouts, hop 1 first")  # fmt: skip
    p.add_argument("--batch-size", type=int_range(1), default=1024, help="seeds per mini-batch")
    p.add_argument("--epochs", type=int_range(1), default=1, help="epochs of the measured run")
    p.add_argument("--max-batches", type=int, default=None,
                   help="measure only the first N batches of each epoch (None: whole epochs)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="seed of the measured run")
    p.add_argument(
        "--device", default="cpu", help="cpu (simulated GPU tier), cuda (cuda:N) or auto"
    )
    p.add_argument("--gather", action="store_true",
                   help="copy rows for real (default: route and count only; same bytes)")  # fmt: skip
    p.add_argument("--bandwidth", action="store_true",
                   help="also run the GPU gather-bandwidth micro-benchmark (needs CUDA)")  # fmt: skip
    p.add_argument("--threads", type=int, default=None, help="sampler threads (default: all)")
    p.add_argument("--plot", metavar="F.png", default=None,
                   help="write host bytes vs hot fraction (relative to 0 %%) to this PNG")  # fmt: skip
    p.add_argument("--plot-add", metavar="R.json", action="append", default=[],
                   help="put an earlier run's --json output in the --plot figure as an extra "
                   "panel, before this run's (repeatable; default: none)")  # fmt: skip
    p.add_argument(
        "--quiet", "--no-progress", dest="quiet", action="store_true", help="no progress bars"
    )


def read_result(path: str | os.PathLike) -> dict[str, Any]:
    """The result object of an earlier ``gnnio bench tiers --json`` run saved to ``path`` (the
    JSON object on its last non-empty line), or a one-line UsageError."""
    try:
        lines = [ln for ln in Path(path).read_text().splitlines() if ln.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--plot-add {path}: cannot read ({e.__class__.__name__})") from None
    try:
        res = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        res = None
    if not isinstance(res, dict) or not isinstance(res.get("rows"), list):
        raise UsageError(f"--plot-add {path}: not the --json output of 'gnnio bench tiers'")
    return res


def run(args) -> dict[str, Any]:
    from ..graph.dataset import load
    from ..preprocess.hotness import SCORES, compute_score
    from ..train import check_device

    device = str(check_device(args.device))  # one line naming --device, before anything runs
    names = [s.strip() for s in str(args.scores).split(",") if s.strip() and s.strip() != "oracle"]
    unknown = [s for s in names if s not in SCORES]
    if unknown:
        raise UsageError(f"--scores: '{unknown[0]}' is unknown; choose from {', '.join(SCORES)}")
    fractions = _csv_fracs(args.fractions) if isinstance(args.fractions, str) else args.fractions
    progress = not args.quiet
    max_batches = getattr(args, "max_batches", None)
    plot_add = [read_result(f) for f in (getattr(args, "plot_add", None) or [])]
    if plot_add and not getattr(args, "plot", None):
        raise UsageError("--plot-add: needs --plot F.png")
    ds = load(args.dir)
    fanouts = [int(k) for k in args.fanouts]
    scores: dict[str, np.ndarray] = {}
    for name in names:
        scores[name] = compute_score(
            name, ds, fanouts=fanouts, batch_size=args.batch_size, progress=progress,
            seed=args.seed + 1, num_threads=args.threads,
        )  # fmt: skip
    # the oracle is recorded from the measured batches themselves (same trace, cap included)
    result = host_traffic_experiment(
        ds, scores, fractions, fanouts, args.batch_size, args.epochs, args.seed,
        device=device, count_only=not args.gather, num_threads=args.threads,
        progress=progress, oracle=True, max_batches=max_batches,
    )  # fmt: skip
    if "presample" in scores:
        result["presample_seed"] = args.seed + 1
    if getattr(args, "plot", None):
        plot_traffic([*plot_add, result], args.plot)
        result["plot"] = str(args.plot)
    if args.bandwidth:
        result["bandwidth"] = gpu_gather_bandwidth()
    if not getattr(args, "json", False):
        print(traffic_table(result))
    return result
