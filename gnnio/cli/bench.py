"""``gnnio bench KIND DIR ...``: reproducible benchmarks; ``--json`` prints one JSON object last."""

from __future__ import annotations

import importlib
import re

from ..bench import KINDS
from . import COMMANDS, HelpFormatter

#: benchmark name -> module under gnnio.bench providing HELP, add_arguments(p) and run(args) -> dict
BENCHES = {name: f"gnnio.bench.{name.replace('-', '_')}" for name in KINDS}


_ROLE = re.compile(r":(?:func|class|mod|meth|attr|data|exc):`(~?)([^`]+)`")


def plain(text: str) -> str:
    """A module docstring as a ``--help`` description: Sphinx roles, double-backquoted literals
    and bold as the plain text they mark (``:func:`~a.b``` -> ``b``)."""
    text = _ROLE.sub(lambda m: m.group(2).rsplit(".", 1)[-1] if m.group(1) else m.group(2), text)
    return text.replace("``", "").replace("**", "")


def register(sub, kind: str | None = None) -> None:
    """``gnnio bench`` and its benchmarks; with ``kind`` (the benchmark a command line runs,
    ``""`` for none) only that one's module is imported, the others stand in by name and help
    line (:data:`gnnio.bench.KINDS`), so ``gnnio bench --help`` imports no benchmark (nor
    torch); without, every one."""
    p = sub.add_parser(
        "bench",
        help=COMMANDS["bench"],
        description="Benchmarks report the median of several timed passes after a warm-up, "
        "next to a ceiling measured in the same run where one applies.",
    )
    kinds = p.add_subparsers(dest="bench", metavar="KIND", required=True)
    for name, modname in BENCHES.items():
        if kind is not None and name != kind:
            kinds.add_parser(name, help=KINDS[name])  # (never parses: the command runs another)
            continue
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
