"""``gnnio bench hotness DIR``: how well each hotness score predicts the real feature reads.

Protocol (Data Tiering §5.2, Figure 7): run the real sampler (:class:`gnnio.sampling.UniformSampler`
over :class:`gnnio.ordering.shuffle.RandomOrder` batches of ``train_idx``) for ``--epochs`` epochs with
``--seed`` and count, per node, the batches whose ``input_nodes`` contain it: these are the *true*
access counts. Rank the nodes by each score (descending, ties by id) and report the share of all
accesses that falls on the top 1 / 5 / 10 / 25 % of nodes -- the hit ratio a static hot tier of
that size would get. ``oracle`` ranks by the true counts themselves (the upper bound);
``presample`` counts accesses of a *different* run (seed ``--seed + 1``, ``--presample-epochs``
epochs), otherwise it would be the oracle.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..errors import UsageError
from ..graph.dataset import load
from ..preprocess.hotness import SCORES, compute_score, presample_counts, top_count
from ..preprocess.reorder import order_by_score
from ..utils.argtypes import fanouts_arg, int_range
from . import KINDS

__all__ = ["HELP", "DESCRIPTION", "add_arguments", "run", "captured_shares", "cumulative_curve"]

HELP = KINDS["hotness"]
DESCRIPTION = (
    "Run the sampler for an epoch over the training nodes, count every node's feature reads, and "
    "report for each hotness score the share of reads captured by the top 1/5/10/25% of nodes "
    "ranked by that score (Data Tiering Figure 7); 'oracle' ranks by the measured counts, "
    "'presample' by the counts of a different (differently seeded) run."
)

DEFAULT_SCORES = ("degree", "in_degree", "rpr", "wrpr", "sj", "sj_fanout", "presample")
DEFAULT_FRACTIONS = (0.01, 0.05, 0.1, 0.25)


def _csv_floats(text: str) -> list[float]:
    try:
        vals = [float(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise UsageError(f"--fractions: expected comma-separated numbers, got {text!r}") from None
    if not vals or any(not 0 < v <= 1 for v in vals):
        raise UsageError(f"--fractions: each must be in (0, 1], got {text!r}")
    return vals


def add_arguments(p) -> None:
    p.add_argument("dir", metavar="DIR", help="dataset directory (needs a train split)")
    p.add_argument(
        "--fanouts", type=fanouts_arg, default="15,10,5", help="per-hop fanouts, hop 1 first"
    )
    p.add_argument("--batch-size", type=int_range(1), default=1024, help="seeds per mini-batch")
    p.add_argument("--epochs", type=int_range(1), default=1, help="epochs of the measured run")
    p.add_argument("--seed", type=int, default=0, help="seed of the measured run")
    p.add_argument(
        "--presample-epochs",
        type=int_range(1),
        default=1,
        help="epochs of the pre-sampling run (seeded --seed + 1)",
    )
    p.add_argument(
        "--scores",
        default=",".join(DEFAULT_SCORES),
        help=f"comma-separated scores out of: {', '.join(SCORES)}",
    )
    p.add_argument(
        "--fractions",
        default=",".join(str(f) for f in DEFAULT_FRACTIONS),
        help="hot fractions of the nodes to report",
    )
    p.add_argument("--threads", type=int, default=None, help="sampler threads (default: all)")
    p.add_argument(
        "--plot",
        metavar="F.png",
        default=None,
        help="write the cumulative access-share curves to this PNG",
    )
    p.add_argument(
        "--quiet", "--no-progress", dest="quiet", action="store_true", help="no progress bars"
    )


def captured_shares(
    counts: np.ndarray, score: np.ndarray, fractions: list[float] | tuple[float, ...]
) -> dict[str, float]:
    """Share of ``counts.sum()`` on the top ``top_count(f, N)`` nodes by ``score`` (see
    :func:`gnnio.utils.counts.top_count`), per fraction ``f``.

    Keys are ``str(f)`` (e.g. ``"0.1"``); ties in ``score`` are broken by ascending node id.
    """
    n = counts.shape[0]
    total = float(counts.sum())
    order = order_by_score(score)
    csum = np.cumsum(counts[order], dtype=np.float64)
    out = {}
    for f in fractions:
        k = top_count(f, n)
        out[str(f)] = float(csum[k - 1] / total) if total > 0 and n else 0.0
    return out


def cumulative_curve(
    counts: np.ndarray, score: np.ndarray, points: int = 1000
) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)``: fraction of nodes (ranked by ``score``) vs share of accesses they hold."""
    n = counts.shape[0]
    order = order_by_score(score)
    csum = np.cumsum(counts[order], dtype=np.float64)
    total = csum[-1] if n and csum[-1] > 0 else 1.0
    idx = np.unique(np.linspace(0, n - 1, min(points, n)).astype(np.int64))
    return np.concatenate([[0.0], (idx + 1) / n]), np.concatenate([[0.0], csum[idx] / total])


def _plot(path: str, curves: dict[str, tuple[np.ndarray, np.ndarray]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for name, (x, y) in curves.items():
        style: dict[str, Any] = {"color": "black", "linestyle": "--"} if name == "oracle" else {}
        ax.plot(100 * x, 100 * y, label=name, linewidth=1.4, **style)
    ax.plot([0, 100], [0, 100], color="grey", linestyle=":", linewidth=1, label="random")
    ax.set_xlabel("nodes ranked by score (% of all nodes)")
    ax.set_ylabel("feature reads captured (% of all reads)")
    ax.set_xlim(0, 100)
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=9)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    from ..utils.outputs import save_figure

    save_figure(fig, path, dpi=120)
    plt.close(fig)


def run(args) -> dict[str, Any]:
    scores = [s.strip() for s in str(args.scores).split(",") if s.strip()]
    unknown = [s for s in scores if s not in SCORES]
    if unknown:
        raise UsageError(f"--scores: '{unknown[0]}' is unknown; choose from {', '.join(SCORES)}")
    fractions = (
        _csv_floats(args.fractions) if isinstance(args.fractions, str) else list(args.fractions)
    )
    progress = not getattr(args, "quiet", False)
    threads = getattr(args, "threads", None)
    ds = load(args.dir)
    ds.require_labels("bench hotness pre-samples batches of the labeled training nodes")
    train = np.asarray(ds.train_idx)
    fanouts = [int(k) for k in args.fanouts]

    t0 = time.perf_counter()
    counts = presample_counts(
        ds.graph,
        train,
        fanouts,
        args.batch_size,
        epochs=args.epochs,
        seed=args.seed,
        num_threads=threads,
        progress=progress,
    )
    measure_s = time.perf_counter() - t0

    captured: dict[str, dict[str, float]] = {}
    seconds: dict[str, float] = {}
    curves: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name in scores:
        t0 = time.perf_counter()
        s = compute_score(
            name,
            ds,
            fanouts=fanouts,
            batch_size=args.batch_size,
            progress=progress,
            epochs=getattr(args, "presample_epochs", 1),
            seed=args.seed + 1,
            num_threads=threads,
        )
        seconds[name] = time.perf_counter() - t0
        captured[name] = captured_shares(counts, s, fractions)
        if args.plot:
            curves[name] = cumulative_curve(counts, s)
    captured["oracle"] = captured_shares(counts, counts, fractions)
    if args.plot:
        curves["oracle"] = cumulative_curve(counts, counts)
    ratio = {
        name: {
            f: (v / captured["oracle"][f] if captured["oracle"][f] > 0 else 0.0)
            for f, v in shares.items()
        }
        for name, shares in captured.items()
        if name != "oracle"
    }
    if args.plot:
        _plot(
            args.plot,
            curves,
            f"{ds.name}: {ds.num_nodes:,} nodes, fanouts {fanouts}, batch {args.batch_size}, "
            f"{args.epochs} epoch(s)",
        )
    return {
        "dataset": ds.name,
        "num_nodes": ds.num_nodes,
        "num_edges": ds.num_edges,
        "num_train": int(train.size),
        "fanouts": fanouts,
        "batch_size": args.batch_size,
        "epochs": args.epochs,
        "seed": args.seed,
        "presample_seed": args.seed + 1,
        "accesses": int(counts.sum()),
        "nodes_accessed": int(np.count_nonzero(counts)),
        "measure_s": measure_s,
        "score_s": seconds,
        "ratio_to_oracle": ratio,
        "plot": args.plot,
        "captured": captured,
    }
