"""``gnnio`` command line: prepare, info, train, bench (and more as they land)."""

from __future__ import annotations

import argparse
import sys

from .. import __version__
from ..errors import GnnioError
from . import bench, info, plan, prepare, reorder, train

SUBCOMMANDS = (prepare, info, reorder, plan, train, bench)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gnnio",
        description=(
            "Fast mini-batch GNN training on graphs whose features do not fit in GPU memory. "
            "Run 'gnnio COMMAND --help' for each command's options."
        ),
    )
    parser.add_argument("--version", action="version", version=f"gnnio {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for mod in SUBCOMMANDS:
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    try:
        rc = args.func(args)
    except GnnioError as e:
        print(f"gnnio: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gnnio: interrupted", file=sys.stderr)
        return 130
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
