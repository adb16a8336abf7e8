"""``gnnio prepare SOURCE ... --out DIR``: import a dataset into gnnio's format."""

from __future__ import annotations

import argparse

from ..graph.dataset import info_stats, load
from ..importers import IMPORTERS


def register(sub) -> None:
    p = sub.add_parser(
        "prepare",
        help="import a dataset (synthetic, planetoid, facebook, ogb, npy) into gnnio's format",
        description=(
            "Import a dataset, validate it and write it atomically into gnnio's on-disk format "
            "(see docs/format.md). Run 'gnnio prepare SOURCE --help' for each source's options."
        ),
    )
    src = p.add_subparsers(dest="source", metavar="SOURCE", required=True)
    for name, mod in IMPORTERS.items():
        sp = src.add_parser(
            name,
            help=mod.HELP,
            description=mod.DESCRIPTION,
            formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        )
        mod.add_arguments(sp)
        sp.add_argument("--out", required=True, metavar="DIR", help="output dataset directory")
        sp.add_argument(
            "--overwrite", action="store_true", help="replace DIR if it already exists"
        )
        sp.add_argument("--quiet", action="store_true", help="no progress bars or summary")
        sp.set_defaults(func=run, importer=mod)


def run(args) -> int:
    out = args.importer.run(args)
    if not args.quiet:
        s = info_stats(load(out))
        print(
            f"wrote {out}: {s['num_nodes']:,} nodes, {s['num_edges']:,} edges, "
            f"{s['feat_dim']} features, {s['num_classes']} classes, "
            f"split {s['num_train']}/{s['num_valid']}/{s['num_test']}"
        )
    return 0
