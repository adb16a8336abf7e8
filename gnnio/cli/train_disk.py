"""``gnnio train``'s options for feature rows on disk (issue 25; :mod:`gnnio.train.setup_disk`)."""

from __future__ import annotations

from ..errors import UsageError

__all__ = ["add_disk_arguments", "refuse_store_with_disk", "store_kind"]


def add_disk_arguments(g) -> None:
    """``--features-on`` and ``--host-cache-size`` in the argument group ``g``."""
    g.add_argument(
        "--features-on",
        choices=["memory", "disk"],
        default=None,
        help="disk: read feature rows from the dataset's file with O_DIRECT (page-aware, in "
        "parallel; the page cache serves nothing) under a host cache of --host-cache-size; "
        "bytes_by_tier gets 'disk', the summary 'disk' and 'disk_read_bytes' (default: memory, "
        "or --store)",
    )
    g.add_argument(
        "--host-cache-size",
        type=float,
        metavar="F",
        default=None,
        help="--features-on disk: host cache rows as a fraction of the nodes (default: 0, none)",
    )


def refuse_store_with_disk(args) -> None:
    if args.features_on == "disk" and args.store is not None:
        raise UsageError("--store: not with --features-on disk (the rows stay in their file)")


def store_kind(args, ranks: int) -> str:
    """``TrainConfig.store``: "disk" for ``--features-on disk``, else ``--store`` or its default
    (mmap with several ranks: one page-cache copy per machine)."""
    if args.features_on == "disk":
        return "disk"
    return args.store or ("mmap" if ranks > 1 else "memory")
