"""``gnnio prepare SOURCE ... --out DIR [--reorder SCORE]``: import a dataset into gnnio's format.

With ``--reorder SCORE`` the imported dataset is relabelled by descending hotness score (Data
Tiering Algorithm 2, :func:`gnnio.preprocess.reorder.reorder_path`) before it appears at ``DIR``: the importer
writes into a temporary sibling directory of ``DIR``, the reordered copy is written from there
atomically (through :class:`gnnio.graph.DatasetWriter`) to ``DIR``, and the temporary import is
removed. On any failure ``DIR`` is left as it was (absent, or the old dataset with
``--overwrite``). The claim of ``DIR`` (:func:`gnnio.graph.output_dir.claim`) is held from the
import to the reordered copy, so no other writer gets between them. The result is the same, array for array, as ``gnnio prepare ... --out A``
followed by ``gnnio reorder A --by SCORE --out DIR``, including the id maps ``new2old`` /
``old2new`` (original import ids <-> new ids).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from ..errors import GnnioError, UsageError
from ..graph import output_dir
from ..graph.dataset import info_stats, load
from ..graph.feature_dtype import writing_as
from ..importers import IMPORTERS
from ..preprocess.chunked import DEFAULT_BUDGET_FRACTION
from ..preprocess.hotness import FANOUT_SCORES, SCORES
from ..utils.argtypes import fanouts_arg
from . import COMMANDS, HelpFormatter, add_feature_dtype_argument, refuse_without_effect

#: sources whose import runs within ``--memory-budget`` (issue 25); the others run in RAM
BOUNDED_SOURCES = ("synthetic", "npy", "ogb")

#: scores accepted by ``--reorder`` (all of :data:`gnnio.preprocess.hotness.SCORES`, as ``gnnio reorder``)
REORDER_SCORES = tuple(SCORES)


def register(sub) -> None:
    p = sub.add_parser(
        "prepare",
        help=COMMANDS["prepare"],
        description=(
            "Import a dataset, validate it and write it atomically into gnnio's on-disk format "
            "(see docs/format.md), optionally reordered by a hotness score. Run "
            "'gnnio prepare SOURCE --help' for each source's options."
        ),
    )
    src = p.add_subparsers(dest="source", metavar="SOURCE", required=True)
    for name, mod in IMPORTERS.items():
        sp = src.add_parser(
            name,
            help=mod.HELP,
            description=mod.DESCRIPTION,
            formatter_class=HelpFormatter,
        )
        mod.add_arguments(sp)
        sp.add_argument("--out", required=True, metavar="DIR", help="output dataset directory")
        sp.add_argument("--overwrite", action="store_true", help="replace DIR if it already exists")
        sp.add_argument(
            "--reorder",
            default=None,
            metavar="SCORE",
            help=(
                "relabel nodes by descending hotness score before writing DIR (hottest node gets "
                "id 0; id maps stored as arrays 'new2old' and 'old2new'), as 'gnnio reorder' "
                f"does; SCORE is one of: {', '.join(REORDER_SCORES)}"
            ),
        )
        sp.add_argument(
            "--reorder-fanouts",
            type=fanouts_arg,
            default=None,
            metavar="K1,K2,..",
            help="per-hop fanouts (hop 1 first) for --reorder sj (their number: the layers), "
            "sj_fanout and presample (default: 15,10,5)",
        )
        sp.add_argument(
            "--reorder-batch-size",
            type=int,
            default=None,
            metavar="B",
            help="seeds per batch for --reorder presample (one epoch, seed 1) (default: 1024)",
        )
        if name in BOUNDED_SOURCES:
            sp.add_argument(
                "--memory-budget",
                metavar="BYTES",
                default=None,
                help="build the graph and write the features in chunks whose arrays and mapped "
                "pages stay within BYTES (e.g. 4GiB; the interpreter and its libraries, about "
                "0.4 GB, come on top); the same files as in RAM; 'none': all in RAM, one pass; "
                "a budget named here also bounds --reorder "
                f"(default: {int(DEFAULT_BUDGET_FRACTION * 100)}%% of the available RAM, "
                "MemAvailable at the start)",
            )
        add_feature_dtype_argument(sp)
        sp.add_argument("--quiet", "--no-progress", dest="quiet", action="store_true",
                        help="no progress bars or summary")  # fmt: skip
        sp.set_defaults(func=run, importer=mod)


def check_reorder_score(name: str | None) -> str | None:
    """``name`` if it is a score ``--reorder`` accepts (or None), else a one-line UsageError."""
    if name is not None and name not in REORDER_SCORES:
        raise UsageError(
            f"--reorder: score '{name}' is unknown; choose from {', '.join(REORDER_SCORES)}"
        )
    return name


def _import_and_reorder(args) -> Path:
    """Import into a temporary sibling of ``args.out``, write the reordered copy to ``args.out``
    atomically, and remove the temporary import whatever happens."""
    from ..preprocess.reorder import reorder_path

    out = Path(args.out)
    if args.reorder_batch_size is not None and args.reorder_batch_size < 1:
        raise UsageError(f"--reorder-batch-size: must be >= 1, got {args.reorder_batch_size}")
    given = {"fanouts": args.reorder_fanouts, "batch_size": args.reorder_batch_size}
    output_dir.check_out_dir(out, args.overwrite)
    with output_dir.claim(out):
        output_dir.check_out_dir(out, args.overwrite)
        output_dir.remove_stale(out)
        tmp = output_dir.make_temp_dir(out, "prepare")
        try:
            iargs = argparse.Namespace(**vars(args))
            # same folder name as DIR: importers that name the dataset after its folder (npy) agree
            iargs.out = str(tmp / out.name)
            iargs.overwrite = False
            imported = args.importer.run(iargs)
            summary = reorder_path(
                imported,
                args.reorder,
                out=out,
                overwrite=args.overwrite,
                progress=not args.quiet,
                memory_budget=args.memory_budget,  # the default budget too (issue 25)
                **{k: v for k, v in given.items() if v is not None},  # (else reorder_path's)
            )
        except GnnioError as e:  # name DIR, not the temporary import
            text = str(e).replace(str(tmp / out.name), str(out)).replace(str(tmp), str(out.parent))
            raise type(e)(text) from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if not args.quiet:
        print(
            f"reordered by {args.reorder} (score {summary['score_s']:.2f} s, "
            f"reorder {summary['reorder_s']:.2f} s)"
        )
    return out


def resolve_budget(args) -> None:
    """Turn ``--memory-budget`` into bytes (``args.memory_budget``: int, or None for 'none');
    ``args.memory_budget_given`` says whether the user named one."""
    from ..preprocess.chunked import resolve_budget as resolve

    text = getattr(args, "memory_budget", None)
    args.memory_budget_given = text is not None
    args.memory_budget = resolve(text, args.source in BOUNDED_SOURCES)


def run(args) -> int:
    reorder = check_reorder_score(getattr(args, "reorder", None))  # (an unknown score first)
    refuse_without_effect([("--reorder-batch-size", args.reorder_batch_size,
                            reorder == "presample", "--reorder presample"),
                           ("--reorder-fanouts", args.reorder_fanouts, reorder in FANOUT_SCORES,
                            f"--reorder {', '.join(FANOUT_SCORES[:-1])} or {FANOUT_SCORES[-1]}")])  # fmt: skip
    resolve_budget(args)
    with writing_as(args.feature_dtype):  # --feature-dtype: every writer recodes the rows
        if reorder is None:
            output_dir.check_out_dir(Path(args.out), args.overwrite)  # before reading any input
            out = args.importer.run(args)
        else:
            out = _import_and_reorder(args)
    if not args.quiet:
        s = info_stats(load(out))
        print(
            f"wrote {out}: {s['num_nodes']:,} nodes, {s['num_edges']:,} edges, "
            f"{s['feat_dim']} features, {s['num_classes']} classes, "
            f"split {s['num_train']}/{s['num_valid']}/{s['num_test']}"
        )
    return 0
