"""``gnnio reorder DIR --by SCORE --out DIR2``: relabel a dataset so its hottest nodes come first."""

from __future__ import annotations

import argparse
import json

from ..errors import UsageError
from ..graph.feature_dtype import writing_as
from ..preprocess.hotness import FANOUT_SCORES, SCORES
from ..preprocess.reorder import reorder_path
from ..utils.argtypes import fanouts_arg, int_range
from . import COMMANDS, HelpFormatter, add_feature_dtype_argument, refuse_without_effect


def _unit_float(text: str) -> float:
    """A number in [0, 1] (``--damping``)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if not 0.0 <= v <= 1.0:  # (NaN fails too)
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text}")
    return v


def register(sub) -> None:
    p = sub.add_parser(
        "reorder",
        help=COMMANDS["reorder"],
        description=(
            "Score every node (degree, reverse PageRank, weighted reverse PageRank, Song & Jiang's "
            "L-hop estimate, or pre-sampling counts), then write a copy of the dataset whose node "
            "ids follow descending score (Data Tiering, Algorithm 2): graph, features, labels and "
            "splits are relabelled together and the id maps are stored as arrays 'new2old' and "
            "'old2new'."
        ),
        formatter_class=HelpFormatter,
    )
    p.add_argument("dir", metavar="DIR", help="dataset directory to reorder")
    p.add_argument(
        "--by",
        required=True,
        choices=list(SCORES),
        metavar="SCORE",
        help=f"hotness score: {', '.join(SCORES)}",
    )
    p.add_argument("--out", required=True, metavar="DIR2", help="output dataset directory")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace DIR2 if it exists (DIR2 = DIR reorders DIR in place)",
    )
    p.add_argument(
        "--fanouts",
        type=fanouts_arg,
        default=None,
        help="per-hop fanouts (hop 1 first) for sj (their number: the layers), sj_fanout and "
        "presample (default: 15,10,5)",
    )
    p.add_argument(
        "--batch-size",
        type=int_range(1),
        default=None,
        help="seeds per batch (presample) (default: 1024)",
    )
    p.add_argument(
        "--epochs",
        type=int_range(1),
        default=None,
        help="epochs to pre-sample (presample) (default: 1)",
    )
    p.add_argument("--seed", type=int, default=None, help="random seed (presample) (default: 1)")
    p.add_argument(
        "--damping", type=_unit_float, default=None, help="damping d (rpr, wrpr; default 0.85)"
    )
    p.add_argument(
        "--iterations",
        type=int_range(0),
        default=None,
        help="iterations (rpr default 20, wrpr default 5)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="sampler threads (presample) (default: min(8, the CPU cores))",
    )
    p.add_argument(
        "--memory-budget",
        metavar="BYTES",
        default=None,
        help="score, relabel and copy in chunks that keep the pages this process holds within "
        "BYTES (e.g. 4GiB; the per-node arrays count, the interpreter does not; presample counts "
        "the whole CSR); same output files (default: half the available RAM; 'none': one pass "
        "in RAM)",
    )
    add_feature_dtype_argument(p)
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    p.add_argument("--quiet", action="store_true", help="no progress bars or summary")
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bars (the other output stays; also: GNNIO_NO_PROGRESS=1)",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    presample = args.by == "presample"
    refuse_without_effect(  # read by the pre-sampling pass only (as gnnio train's refuse_ignored)
        (opt, value, presample, "--by presample")
        for opt, value in (("--batch-size", args.batch_size), ("--epochs", args.epochs),
                           ("--seed", args.seed), ("--threads", args.threads))
    )  # fmt: skip
    refuse_without_effect([("--fanouts", args.fanouts, args.by in FANOUT_SCORES,
                            f"--by {', '.join(FANOUT_SCORES[:-1])} or {FANOUT_SCORES[-1]}")])  # fmt: skip
    given = {"fanouts": args.fanouts, "batch_size": args.batch_size, "epochs": args.epochs,
             "seed": args.seed}  # fmt: skip
    opts: dict = {k: v for k, v in given.items() if v is not None}  # (else reorder_path's own)
    opts["num_threads"] = args.threads
    if args.damping is not None:
        if args.by not in ("rpr", "wrpr"):
            raise UsageError(f"--damping: only applies to rpr and wrpr, not '{args.by}'")
        opts["damping"] = args.damping
    if args.iterations is not None:
        if args.by not in ("rpr", "wrpr"):
            raise UsageError(f"--iterations: only applies to rpr and wrpr, not '{args.by}'")
        opts[f"{args.by}_iterations"] = args.iterations
    from ..preprocess.chunked import resolve_budget

    budget = resolve_budget(args.memory_budget)
    with writing_as(args.feature_dtype):  # --feature-dtype: the writer recodes the rows
        summary = reorder_path(
            args.dir,
            args.by,
            out=args.out,
            overwrite=args.overwrite,
            progress=not args.quiet,
            memory_budget=budget,
            **opts,
        )
    if args.json:
        print(json.dumps(summary))
    elif not args.quiet:
        print(
            f"wrote {summary['out']}: {summary['num_nodes']:,} nodes reordered by {args.by} "
            f"(score {summary['score_s']:.2f} s, reorder {summary['reorder_s']:.2f} s)"
        )
    return 0
