"""``gnnio bench placement``: how long placement takes on a large score vector (no dataset needed).

Song & Jiang claim Algorithm 1 is O(N) and "does no much more work than iterating over an array of
N elements" (§5.2, Table 2). This benchmark times every placement strategy that needs only the
access probabilities (``alg1``, ``rule1``, ``interleaved``, ``mod``, ``naive``, ``random``) on a
seeded heavy-tailed vector of ``--num-nodes`` probabilities (Pareto, shape ``--skew``), and splits
``alg1`` into its partial sort (the ``n * BSIZE`` hottest nodes in order: O(N) selection plus
O(K log K) sort, ``K = n * BSIZE``) and its replacement loop (numba, O(K n)).
It also times building one GPU's ``dev_num`` / ``buf_pos`` lookup arrays. Every figure is the
median wall-clock time of ``--passes`` passes after one warm-up pass (measured, CPU).

With ``--dataset DIR`` it instead runs Song & Jiang's evaluation grid (§5, Figures 4-6 and Table 2
in kind) on that dataset: every strategy for every ``--topologies`` x ``--buffers`` combination,
sharing one access-probability estimate and one sampled trace (``--trace-epochs`` epochs dealt to
the GPUs round-robin), with Algorithm 1's alpha set as in the paper (0 on all-connected GPUs, 0.2
on NVLink pairs) or by Eq. 7. Loading times are **modeled** (Eq. 3 on the counted reads and the
topology's bandwidths); preprocessing times are **measured**. ``--markdown FILE`` writes the tables.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..errors import DatasetError, UsageError
from ..placement import PlacementRequest, hottest_order, place
from ..placement.topology import load_topology
from ..utils.argtypes import positive_float
from ..utils.counts import top_count
from ..utils.progress import bar
from . import KINDS
from ._timing import median, time_passes

__all__ = ["HELP", "DESCRIPTION", "add_arguments", "run"]

HELP = KINDS["placement"]
DESCRIPTION = __doc__.split("\n\n", 1)[1].strip()

GRAPHLESS = ("alg1", "rule1", "interleaved", "mod", "naive", "random")


#: what each mode alone reads, with its default: given to the other mode it would do nothing
TIMING_ONLY = {"--num-nodes": 10_000_000, "--topology": "4", "--buffer": 0.1, "--alpha": None,
               "--skew": 1.2, "--strategies": ",".join(GRAPHLESS), "--passes": 3}  # fmt: skip
GRID_ONLY = {"--topologies": "2,2+2,4,8", "--buffers": "0.1,0.2,0.25",
             "--grid-strategies": "alg1,rule1,interleaved,mod,naive,random,metis,pagraph",
             "--fanouts": "15,10,5", "--batch-size": 1024, "--trace-epochs": 1, "--score": "sj",
             "--grid-alpha": "paper", "--local-seeds": False, "--pagraph-max-nodes": 200_000,
             "--markdown": None}  # fmt: skip


def _given(args, options: dict[str, Any]) -> list[str]:
    """The options of ``options`` whose value is not their default (given on the command line)."""
    return [o for o, d in options.items() if getattr(args, o[2:].replace("-", "_")) != d]


def add_arguments(p) -> None:
    def timing(flag, **kw):  # (the defaults live in TIMING_ONLY / GRID_ONLY, read by run())
        p.add_argument(flag, default=TIMING_ONLY[flag], **kw)

    timing("--num-nodes", type=int, help="length of the score vector")
    timing("--topology", help="GPU groups, preset or topology file")
    timing("--buffer", type=float, help="rows per GPU as a fraction of N")
    timing("--alpha", type=float, help="Algorithm 1's alpha (default: Eq. 7)")
    timing("--skew", type=positive_float, help="Pareto shape of the scores")
    timing("--strategies", help="comma-separated graph-free strategies")
    timing("--passes", type=int, help="timed passes (median reported)")
    p.add_argument("--seed", type=int, default=0, help="seed of the score vector / the trace")
    p.add_argument(
        "--no-progress", "--quiet", dest="no_progress", action="store_true", help="no progress bars"
    )
    g = p.add_argument_group("evaluation grid on a dataset (--dataset)")

    def grid(flag, **kw):
        g.add_argument(flag, default=GRID_ONLY[flag], **kw)

    g.add_argument("--dataset", default=None, metavar="DIR", help="run the grid on this dataset")
    grid("--topologies", help="comma-separated GPU group specs")
    grid("--buffers", help="comma-separated fractions of N")
    grid("--grid-strategies", help="strategies of the grid")
    grid("--fanouts", help="sampler fanouts, hop 1 first")
    grid("--batch-size", type=int, help="seeds per mini-batch per GPU")
    grid("--trace-epochs", type=int, help="epochs counted in the trace")
    grid("--score", help="access-probability estimate (hotness score)")
    grid("--grid-alpha", help="Algorithm 1's alpha: 'paper' (0 all-connected, 0.2 pairs), 'eq7' "
         "or a number")  # fmt: skip
    grid("--local-seeds", action="store_true", help="partition-local seeds for baselines")
    grid("--pagraph-max-nodes", type=int, help="pagraph size cap")
    grid("--markdown", metavar="FILE", help="write the tables to FILE")


def run(args) -> dict[str, Any]:
    if getattr(args, "dataset", None):
        given = _given(args, TIMING_ONLY)
        if given:  # the timing run's options: the grid has its own (--topologies, --buffers, ...)
            raise UsageError(
                f"{given[0]}: has no effect with --dataset (the grid takes --topologies, "
                "--buffers, --grid-strategies, --grid-alpha)"
            )
        return run_grid(args)
    given = _given(args, GRID_ONLY)
    if given:  # the grid's options, which only the grid reads
        raise UsageError(f"{given[0]}: has no effect without --dataset (an option of the grid)")
    if args.num_nodes < 1:
        raise UsageError(f"--num-nodes: must be >= 1, got {args.num_nodes}")
    if not 0 < args.buffer <= 1:
        raise UsageError(f"--buffer: a fraction in (0, 1], got {args.buffer}")
    names = [s.strip() for s in args.strategies.split(",") if s.strip()]
    bad = [s for s in names if s not in GRAPHLESS]
    if bad:
        raise UsageError(f"--strategies: {', '.join(bad)} not graph-free; choose from {GRAPHLESS}")
    if not names:
        raise UsageError(f"--strategies: give at least one of {', '.join(GRAPHLESS)}")
    topo = load_topology(args.topology)
    n = int(args.num_nodes)
    probs = np.random.default_rng(args.seed).pareto(args.skew, n)
    bsize = top_count(args.buffer, n)
    req = PlacementRequest(probs=probs, topology=topo, buffer_rows=bsize, alpha=args.alpha)
    result: dict[str, Any] = {
        "num_nodes": n,
        "topology": topo.shorthand,
        "buffer_rows": bsize,
        "passes": int(args.passes),
        "measured": "wall-clock seconds, median of passes after one warm-up (CPU)",
    }
    placements: dict[str, Any] = {}
    steps = len(names) + 2 * ("alg1" in names) + 1  # ~45 s by default: show where it is
    pb = bar(steps, "placement timings", "timing", enabled=not args.no_progress)

    def timed(fn) -> float:
        t = median(time_passes(fn, 1, args.passes))
        pb.update(1)
        return t

    try:
        for name in names:

            def one(name=name):
                placements[name] = place(name, req)

            result[f"{name}_s"] = timed(one)
        if "alg1" in names:
            from ..placement.alg1 import algorithm1

            alpha = topo.alpha if args.alpha is None else float(args.alpha)
            g = len(topo.groups[0]) if topo.peers_cheaper else 1
            k = min(n, g * bsize)  # Algorithm 1 only needs the first n * BSIZE nodes of V
            order = hottest_order(probs, k=k)
            result["alg1_sort_s"] = timed(lambda: hottest_order(probs, k=k))
            result["alg1_loop_s"] = timed(lambda: algorithm1(probs, g, bsize, alpha, order=order))
            result["alg1_nodes_per_s"] = n / result["alg1_s"] if result["alg1_s"] > 0 else None
            summ = placements["alg1"].summary()
            result["alg1_alpha"] = alpha
            result["alg1_distinct_rows"] = summ["distinct_rows"]
        first = placements[names[0]]
        result["lookup_one_gpu_s"] = timed(lambda: first.lookup(0))
    finally:
        pb.close()
    return result


def run_grid(args) -> dict[str, Any]:
    """The evaluation grid (see module docstring); returns ``{"rows": [...], ...}``."""
    import math

    from ..graph.dataset import load
    from ..placement.alg1 import resolve_alpha
    from ..placement.planner import make_plan, warm_up_kernels
    from ..placement.trace import sample_trace
    from ..preprocess.hotness import compute_score
    from ..sampling import parse_fanouts

    specs, buffers, strategies = _check_grid(args)
    ds = load(args.dataset)
    train = ds.train_idx
    if train is None or train.size == 0:  # (as make_plan refuses it; a score need not read it)
        raise DatasetError(f"{ds.path}: has no training nodes; placement needs them to model reads")
    try:
        fanouts = parse_fanouts(args.fanouts)
    except ValueError as e:
        raise UsageError(f"--fanouts: {e}") from None
    topos = [load_topology(t) for t in specs]
    alphas = [resolve_alpha(args.grid_alpha, t, "--grid-alpha") for t in topos]  # refuse now
    warm_up_kernels()
    t0 = time.perf_counter()
    probs = compute_score(args.score, ds, fanouts=fanouts, batch_size=args.batch_size)
    prob_s = time.perf_counter() - t0
    slots = math.lcm(*[t.num_gpus for t in topos])
    trace = sample_trace(
        ds.graph,
        train,
        fanouts,
        args.batch_size,
        slots,
        seed=args.seed,
        epochs=args.trace_epochs,
        progress=not args.no_progress,
    )
    cache: dict = {}
    tcache: dict = {}
    rows = []
    for topo, alpha in zip(topos, alphas, strict=True):
        for b in buffers:
            res = make_plan(
                ds,
                topo,
                top_count(b, ds.num_nodes),
                strategies=strategies,
                fanouts=fanouts,
                batch_size=args.batch_size,
                score=args.score,
                alpha=alpha,
                seed=args.seed,
                local_seeds=args.local_seeds,
                pagraph_max_nodes=args.pagraph_max_nodes,
                probs=probs,
                prob_s=prob_s,
                trace=trace,
                partition_cache=cache,
                local_trace_cache=tcache,
                progress=not args.no_progress,
            )
            for name, o in res.outcomes.items():
                row = {"topology": topo.name, "buffer": b, "strategy": name}
                if o.skipped is not None:
                    row["skipped"] = o.skipped
                else:
                    row.update(o.to_dict())
                rows.append(row)
    out = {
        "dataset": ds.name,
        "num_nodes": ds.num_nodes,
        "row_bytes": int(ds.feat_dim * ds.features.dtype.itemsize),
        "score": args.score,
        "prob_s": prob_s,
        "trace": trace.to_dict(),
        "grid_alpha": args.grid_alpha,
        "local_seeds": bool(args.local_seeds),
        "rows": rows,
    }
    if args.markdown:
        from ..utils.outputs import write_atomic

        text = grid_markdown(out).encode()
        write_atomic(args.markdown, lambda f: f.write(text), "--markdown")
    return out


def _check_grid(args) -> tuple[list[str], list[float], list[str]]:
    """The grid's lists (topology specs, buffer fractions, strategies), each non-empty, and its
    counts, checked before the dataset is read: one ``gnnio: error:`` line for a bad value."""
    from ..placement import STRATEGIES
    from ..utils.outputs import check_output_path

    for name in ("batch_size", "trace_epochs"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    specs = [t.strip() for t in args.topologies.split(",") if t.strip()]
    try:
        buffers = [float(b) for b in args.buffers.split(",") if b.strip()]
    except ValueError:
        raise UsageError(f"--buffers: comma-separated fractions, got {args.buffers!r}") from None
    for b in buffers:
        if not 0 < b <= 1:  # (as --buffer; nan fails too)
            raise UsageError(f"--buffers: each a fraction in (0, 1], got {b}")
    strategies = [s.strip() for s in args.grid_strategies.split(",") if s.strip()]
    for s in strategies:
        if s not in STRATEGIES:
            raise UsageError(
                f"--grid-strategies: unknown '{s}' (choose from {', '.join(STRATEGIES)})"
            )
    for option, got in (("--topologies", specs), ("--buffers", buffers),
                        ("--grid-strategies", strategies)):  # fmt: skip
        if not got:
            raise UsageError(f"{option}: give at least one")
    if args.markdown:
        check_output_path(args.markdown, "--markdown")
    return specs, buffers, strategies


def grid_markdown(out: dict[str, Any]) -> str:
    """Markdown tables of a grid: modeled max loading time, then local/peer/host shares."""
    rows = out["rows"]
    names = list(dict.fromkeys(r["strategy"] for r in rows))
    keys = list(dict.fromkeys((r["topology"], r["buffer"]) for r in rows))
    get = {(r["topology"], r["buffer"], r["strategy"]): r for r in rows}
    lines = [
        f"**{out['dataset']}** ({out['num_nodes']:,} nodes, {out['row_bytes']} B/row; score "
        f"`{out['score']}` in {out['prob_s']:.2f} s; trace {out['trace']['epochs']} epoch(s), "
        f"batch {out['trace']['batch_size']}, fanouts {out['trace']['fanouts']}; alpha "
        f"{out['grid_alpha']}; {'partition-local' if out['local_seeds'] else 'global'} seeds "
        "for partitions)",
        "",
        "Modeled max per-GPU loading time per epoch, ms (Eq. 3; slowest GPU):",
        "",
        "| topology | buffer | " + " | ".join(names) + " | best partition / alg1 |",
        "|---|---|" + "---|" * (len(names) + 1),
    ]
    for t, b in keys:
        cells, best_part = [], None
        for nm in names:
            r = get.get((t, b, nm))
            if r is None or "skipped" in r:
                cells.append("n/a")
                continue
            cells.append(f"{1e3 * r['max_cost_s']:.3g}")
            if nm in ("naive", "random", "metis", "pagraph"):
                v = r["max_cost_s"]
                best_part = v if best_part is None else min(best_part, v)
        a = get.get((t, b, "alg1"))
        ratio = (
            f"{best_part / a['max_cost_s']:.2f}x"
            if a and "skipped" not in a and best_part and a["max_cost_s"] > 0
            else "n/a"
        )
        lines.append(f"| {t} | {b:g}N | " + " | ".join(cells) + f" | {ratio} |")
    lines += [
        "",
        "Access shares local / peer / host, % of rows read (all GPUs):",
        "",
        "| topology | buffer | " + " | ".join(names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for t, b in keys:
        cells = []
        for nm in names:
            r = get.get((t, b, nm))
            if r is None or "skipped" in r:
                cells.append("n/a")
            else:
                cells.append(f"{100 * r['local']:.0f}/{100 * r['peer']:.0f}/{100 * r['host']:.0f}")
        lines.append(f"| {t} | {b:g}N | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Preprocessing seconds (measured; partitioning included; p computed once, not included):",
        "",
        "| topology | buffer | " + " | ".join(names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for t, b in keys:
        cells = []
        for nm in names:
            r = get.get((t, b, nm))
            cells.append("n/a" if r is None or "skipped" in r else f"{r['prep_s']:.3g}")
        lines.append(f"| {t} | {b:g}N | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
