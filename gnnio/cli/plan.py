"""``gnnio plan DIR --topology T --buffer B [--json]``: compare feature placements before training.

Runs every placement strategy for the machine described by ``--topology`` and a per-GPU buffer of
``B * N`` rows (``B`` 0.1 by default, as ``gnnio train --nproc``'s; a topology file's
``feature_budget_bytes`` instead where it sets one), models each GPU's feature-loading time per
epoch from a pre-sampled epoch of the real sampler (Song & Jiang's Eq. 3 cost model; seconds are
modeled from link bandwidths, not measured) and recommends the cheapest. ``--json`` prints one JSON object last; see
:class:`gnnio.placement.planner.PlanResult`.
"""

from __future__ import annotations

import json

from ..errors import UsageError
from ..graph.dataset import load
from ..placement import STRATEGIES, save_placement
from ..placement.alg1 import resolve_alpha
from ..placement.planner import (
    DEFAULT_STRATEGIES,
    PARTITION_STRATEGIES,
    PlanResult,
    buffer_rows_from,
    make_plan,
)
from ..placement.topology import PRESETS, load_topology
from ..train.config_dist import DEFAULT_BUFFER
from ..utils.outputs import check_output_path
from . import COMMANDS, HelpFormatter, refuse_without_effect

__all__ = ["register", "run", "format_table"]


def register(sub) -> None:
    p = sub.add_parser(
        "plan",
        help=COMMANDS["plan"],
        description=(
            "Place the feature rows with every strategy (Song & Jiang Algorithm 1 and Rule 1, Data "
            "Tiering interleaved, BGL mod-sharded, and the NAIVE/RAND/METIS/PaGraph partitioning "
            "baselines) on a simulated machine, count every GPU's local/peer/host reads over one "
            "sampled epoch, and model the slowest GPU's loading time (seconds are modeled from "
            "link bandwidths, not measured)."
        ),
        formatter_class=HelpFormatter,
    )
    p.add_argument("dir", metavar="DIR", help="dataset directory written by 'gnnio prepare'")
    p.add_argument(
        "--topology",
        required=True,
        metavar="T",
        help="GPU groups (2, 2+2, 4, 2*4, 8, 1+1), a preset "
        f"({', '.join(PRESETS)}) or a .toml/.json topology file",
    )
    p.add_argument(
        "--buffer",
        type=float,
        default=None,
        metavar="B",
        help="feature buffer per GPU as a fraction of the nodes (e.g. 0.2); default: the "
        "topology file's feature_budget_bytes where it sets one, else "
        f"{DEFAULT_BUFFER:g} (as 'gnnio train --nproc N --buffer'; no preset sets a budget)",
    )
    p.add_argument("--fanouts", default="15,10,5", help="sampler fanouts, hop 1 first")
    p.add_argument("--batch-size", type=int, default=1024, help="seeds per mini-batch per GPU")
    p.add_argument(
        "--strategies",
        default=",".join(DEFAULT_STRATEGIES),
        help=f"comma-separated subset of {', '.join(STRATEGIES)}",
    )
    p.add_argument(
        "--score",
        default="sj",
        help="access-probability estimate (a gnnio.preprocess.hotness score: sj, sj_fanout, presample, "
        "degree (= out_degree), in_degree, rpr, wrpr)",
    )
    p.add_argument(
        "--alpha",
        default=None,
        help="Algorithm 1's threshold (alg1 in --strategies): a number in [0, 1], 'paper' (Song & "
        "Jiang's tuned values: 0 on all-connected GPUs, 0.2 on several NVLink groups) or 'eq7' "
        "(C_gpu/C_cpu = host_bw/peer_bw; needs a calibrated score such as presample) (default: "
        "paper)",
    )
    p.add_argument(
        "--replicate",
        type=float,
        default=None,
        help="interleaved (in --strategies): fraction of each buffer holding replicated hottest "
        "rows (default: 0)",
    )
    p.add_argument("--host-bw", default=None, help="override host->GPU bandwidth (e.g. 12GB/s)")
    p.add_argument("--peer-bw", default=None, help="override GPU<->GPU bandwidth (e.g. 150GB/s)")
    p.add_argument(
        "--local-seeds",
        action="store_true",
        help=f"evaluate {', '.join(PARTITION_STRATEGIES)} with partition-local training seeds "
        "(PaGraph/DistDGL style) instead of the global shuffle",
    )
    p.add_argument(
        "--pagraph-max-nodes",
        type=int,
        default=None,
        help="pagraph (in --strategies): skip it on larger graphs (its partitioning is "
        "quadratic) (default: 200000)",
    )
    p.add_argument(
        "--trace-epochs",
        type=int,
        default=1,
        help="epochs of the sampler to count reads over (costs are per epoch)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the sampled epoch and of 'random'")
    p.add_argument(
        "--save", metavar="FILE", default=None, help="write the best placement to FILE (.npz)"
    )
    p.add_argument(
        "--memory-budget",
        metavar="BYTES",
        default=None,
        help="keep what this process allocates within BYTES (e.g. 4GiB; the per-node arrays, "
        "the CSR and the score's chunks count, the interpreter does not); metis runs in memory "
        "and is refused when it would not fit; the same placements (default: half the available "
        "RAM without metis, in RAM with it; 'none': in RAM)",
    )
    p.add_argument("--json", action="store_true", help="print the result as one JSON object last")
    p.add_argument(
        "--quiet", "--no-progress", dest="quiet", action="store_true", help="no progress bars"
    )
    p.set_defaults(func=run)


def _parse_fanouts(text: str) -> list[int]:
    from ..sampling import parse_fanouts

    try:
        return parse_fanouts(text)
    except ValueError as e:
        raise UsageError(f"--fanouts: {e}") from None


def run(args) -> int:
    strategies = [s.strip() for s in str(args.strategies).split(",") if s.strip()]
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown or not strategies:
        raise UsageError(
            f"--strategies: unknown {', '.join(unknown) or '(none given)'}; "
            f"choose from {', '.join(STRATEGIES)}"
        )
    if args.local_seeds and not set(strategies) & set(PARTITION_STRATEGIES):
        raise UsageError(  # (it keeps a partitioning's training seeds local: nothing else reads it)
            f"--local-seeds: has no effect without a partitioning strategy in --strategies "
            f"({', '.join(PARTITION_STRATEGIES)})"
        )
    # an option no strategy given reads is one line (README: options without effect), then
    # the defaults
    refuse_without_effect([
        ("--alpha", args.alpha, "alg1" in strategies, "alg1 in --strategies"),
        ("--replicate", args.replicate, "interleaved" in strategies, "interleaved in --strategies"),
        ("--pagraph-max-nodes", args.pagraph_max_nodes, "pagraph" in strategies, "pagraph in --strategies"),
    ])  # fmt: skip
    alpha = "paper" if args.alpha is None else args.alpha
    replicate = 0.0 if args.replicate is None else args.replicate
    pagraph_max_nodes = 200_000 if args.pagraph_max_nodes is None else args.pagraph_max_nodes
    from ..preprocess.hotness import SCORES

    if args.score not in SCORES:  # before the dataset is opened, naming the option
        raise UsageError(f"--score: unknown score '{args.score}' (choose from {', '.join(SCORES)})")
    if args.trace_epochs < 1:
        raise UsageError(f"--trace-epochs: must be >= 1, got {args.trace_epochs}")
    if args.batch_size < 1:
        raise UsageError(f"--batch-size: must be >= 1, got {args.batch_size}")
    fanouts = _parse_fanouts(args.fanouts)
    if args.save:
        check_output_path(args.save, "--save")  # before the plan is computed
    from ..preprocess.chunked import resolve_budget

    budget = resolve_budget(args.memory_budget, "metis" not in strategies)
    topo = load_topology(args.topology, host_bw=args.host_bw, peer_bw=args.peer_bw)
    ds = load(args.dir)
    row_bytes = int(ds.feat_dim * ds.features.dtype.itemsize)
    bsize = buffer_rows_from(args.buffer, ds.num_nodes, row_bytes, topo)
    result = make_plan(
        ds,
        topo,
        bsize,
        strategies=strategies,
        fanouts=fanouts,
        batch_size=args.batch_size,
        score=args.score,
        alpha=resolve_alpha(alpha, topo),
        replicate=replicate,
        seed=args.seed,
        trace_epochs=args.trace_epochs,
        local_seeds=args.local_seeds,
        pagraph_max_nodes=pagraph_max_nodes,
        progress=not args.quiet and not args.json,
        memory_budget=budget,
    )
    if args.save and result.best is None:  # (it said "saved the None placement", wrote nothing)
        raise UsageError(
            f"--save: no placement to save, every strategy was skipped "
            f"({'; '.join(str(o.skipped) for o in result.outcomes.values())})"
        )
    if args.save and result.best is not None:
        best = result.outcomes[result.best].placement
        assert best is not None  # (the best is a feasible outcome: it has its placement)
        best.params.update(dataset=ds.name, dataset_fingerprint=ds.fingerprint)
        save_placement(best, args.save, "--save")
    if args.json:
        out = result.to_dict()
        if args.save:
            out["saved"] = str(args.save)
        print(json.dumps(out))
    else:
        print(format_table(result))
        if args.save:
            print(f"saved the {result.best} placement to {args.save}")
    return 0


def cost_unit(seconds) -> tuple[str, str, float]:
    """``(word, unit, factor)`` for the table's modeled costs: seconds, unless the largest is
    below 0.1 s (a small graph), then milliseconds, or below 0.1 ms microseconds, so that four
    decimals never show every strategy as 0.0000."""
    top = max(seconds, default=0.0)
    if top >= 0.1 or top <= 0:
        return "seconds", "s", 1.0
    if top >= 1e-4:
        return "milliseconds", "ms", 1e3
    return "microseconds", "us", 1e6


def versus(ours: float, theirs: float, other: str) -> str:
    """The best line's comparison with the best partitioning strategy ``other``: how many times
    less modeled loading time, or that it is the same (to 0.5 %; "1.00x less" would say a gain
    that is not there); nothing when the best one's cost is 0."""
    if ours <= 0:
        return ""
    if theirs / ours < 1.005:
        return f" (the same modeled loading time as {other}, to 0.5 %)"
    return f" ({theirs / ours:.2f}x less modeled loading time than {other})"


def format_table(result: PlanResult) -> str:
    """The human-readable report of ``gnnio plan``."""
    t = result.topology
    tr = result.trace.to_dict()
    word, unit, scale = cost_unit(
        [c.max_s for o in result.outcomes.values() if o.skipped is None
         for c in (o.trace_cost, o.predicted_cost) if c is not None]
    )  # fmt: skip
    lines = [
        f"dataset   {result.dataset}: {result.num_nodes:,} nodes, {result.row_bytes} bytes/row",
        f"machine   {t.describe()}",
        f"buffer    {result.buffer_rows:,} rows per GPU "
        f"({result.buffer_rows / max(1, result.num_nodes):.3g} N, "
        f"{result.buffer_rows * result.row_bytes / 2**20:,.1f} MiB)",
        f"trace     {tr['epochs']} epoch(s), {sum(tr['batches_per_device'])} batches of {tr['batch_size']} "
        f"seeds (fanouts {','.join(map(str, tr['fanouts']))}), "
        f"{tr['mean_rows_per_batch']:,.0f} rows/batch, sampled in {tr['sample_s']:.1f} s",
        f"p         score '{result.score}' computed in {result.prob_s:.2f} s",
        "",
        f"modeled {word} per epoch of the slowest GPU (Eq. 3 on the sampled epoch; 'predicted' on "
        "p)",
        f"{'strategy':12s} {'max cost ' + unit:>11s} {'predicted ' + unit:>12s} {'local':>7s} "
        f"{'peer':>7s} {'host':>7s} {'prep s':>8s} {'rows on GPUs':>13s}",
    ]
    best = result.best
    for name, o in result.outcomes.items():
        if o.skipped is not None:
            lines.append(f"{name:12s} skipped: {o.skipped}")
            continue
        d = o.to_dict()
        mark = "  <- best" if name == best else ""
        seeds = " (local seeds)" if d["seeds_mode"] == "parts" else ""
        lines.append(
            f"{name:12s} {d['max_cost_s'] * scale:11.4f} {d['predicted_max_cost_s'] * scale:12.4f} "
            f"{d['local']:7.1%} {d['peer']:7.1%} {d['host']:7.1%} {d['prep_s']:8.3f} "
            f"{d['distinct_rows']:13,d}{seeds}{mark}"
        )
    if best is not None:
        f = result.feasible
        parts = [k for k in f if k in PARTITION_STRATEGIES]
        msg = f"best: {best}"
        if parts and best not in PARTITION_STRATEGIES:
            bp = min(parts, key=lambda k: f[k].cost.max_s)
            ours, theirs = f[best].cost.max_s, f[bp].cost.max_s
            msg += versus(ours, theirs, bp)
        lines += ["", msg]
    return "\n".join(lines)
