"""``gnnio bench KIND DIR ...``: reproducible benchmarks; ``--json`` prints one JSON object last."""

from __future__ import annotations

import importlib
import re

from . import COMMANDS, HelpFormatter

#: benchmark name -> module under gnnio.bench providing HELP, add_arguments(p) and run(args) -> dict
BENCHES = {
    "sampling": "gnnio.bench.sampling",
    "gather": "gnnio.bench.gather",
    "loader": "gnnio.bench.loader",
    "hotness": "gnnio.bench.hotness",
    "reorder": "gnnio.bench.reorder",
    "placement": "gnnio.bench.placement",
    "tiers": "gnnio.bench.tiers",
    "cache": "gnnio.bench.cache",
    "locality": "gnnio.bench.locality",
    "dist": "gnnio.bench.dist",
    "dist-sampling": "gnnio.bench.dist_sampling",
    "disk": "gnnio.bench.disk",
    "step": "gnnio.bench.step",
}


_ROLE = re.compile(r":(?:func|class|mod|meth|attr|data|exc):`(~?)([^`]+)`")


def plain(text: str) -> str:
    """A module docstring as a ``--help`` description: Sphinx roles, double-backquoted literals
    and bold as the plain text they mark (``:func:`~a.b``` -> ``b``)."""
    text = _ROLE.sub(lambda m: m.group(2).rsplit(".", 1)[-1] if m.group(1) else m.group(2), text)
    return text.replace("``", "").replace("**", "")


def register(sub) -> None:
    p = sub.add_parser(
        "bench",
        help=COMMANDS["bench"],
        description="Benchmarks report the median of several timed passes after a warm-up, "
        "next to a ceiling measured in the same run where one applies.",
    )
    kinds = p.add_subparsers(dest="bench", metavar="KIND", required=True)
    for name, modname in BENCHES.items():
        try:
            mod = importlib.import_module(modname)
        except ModuleNotFoundError as e:
            if e.name != modname:
                raise
            continue  # a benchmark module that is not part of this build
        sp = kinds.add_parser(
            name,
            help=mod.HELP,
            description=plain(getattr(mod, "DESCRIPTION", mod.HELP)),
            formatter_class=HelpFormatter,
        )
        mod.add_arguments(sp)
        sp.add_argument("--json", action="store_true", help="print the result as JSON (last line)")
        sp.set_defaults(func=_run, bench_module=mod)


def _run(args) -> int:
    import json

    from ..utils.outputs import check_figure_path

    if getattr(args, "plot", None):  # hotness, tiers, cache: one line now, not a traceback after
        check_figure_path(args.plot, "--plot")  # the run (a directory, inside the dataset, ...)
    result = args.bench_module.run(args)
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:24s} {v}")
    return 0
