"""``gnnio info DIR [--json] [--verify]``."""

from __future__ import annotations

import json

from ..errors import DatasetError
from ..graph.dataset import info_stats, load
from . import COMMANDS


def register(sub) -> None:
    p = sub.add_parser(
        "info",
        help=COMMANDS["info"],
        description=(
            "Open a prepared dataset, check its invariants (CSR, id ranges, shapes/dtypes, disjoint "
            "splits, label range) and print node/edge counts, degree statistics, feature bytes, "
            "split sizes and, for a reordered dataset, the score it was reordered by."
        ),
    )
    p.add_argument("dir", metavar="DIR", help="dataset directory written by 'gnnio prepare'")
    p.add_argument("--json", action="store_true", help="print the statistics as one JSON object")
    p.add_argument(
        "--verify",
        action="store_true",
        help="also recompute every array's sha256 and scan the features for NaN/Inf (reads all data)",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    ds = load(args.dir, verify=args.verify)
    stats = info_stats(ds, check_values=args.verify)
    if args.verify and (stats["features_nan"] or stats["features_inf"]):
        f = ds.path / ds.meta["arrays"]["features"]["file"]
        raise DatasetError(
            f"{f}: features contain {stats['features_nan']} NaN and {stats['features_inf']} Inf values"
        )
    if "reordered_by" in ds.meta:  # gnnio reorder's record (docs/format.md)
        stats["reordered_by"] = ds.meta["reordered_by"]
        stats["reorder_score"] = ds.meta.get("reorder_score")  # None: not recorded (older)
    if args.json:
        print(json.dumps(stats))
        return 0
    d = stats["in_degree"]
    gib = stats["feature_bytes"] / 2**30
    lines = [
        f"dataset     {stats['name']}  ({stats['path']}, format v{stats['format_version']})",
        f"nodes       {stats['num_nodes']:,}",
        f"edges       {stats['num_edges']:,} directed",
        f"in-degree   min {d['min']}  median {d['median']:g}  mean {d['mean']:.2f}  max {d['max']}",
        f"            top 1% of nodes hold {100 * d['top1pct_edge_share']:.1f}% of edges;"
        f" {stats['isolated_nodes']:,} isolated nodes",
        f"features    {stats['feat_dim']} x {stats['feat_dtype']}  ({gib:.3f} GiB)",
        f"classes     {stats['num_classes']}  ({stats['num_labeled']:,} labeled nodes)",
        f"splits      train {stats['num_train']:,} / valid {stats['num_valid']:,} / test {stats['num_test']:,}",
    ]
    if "reordered_by" in stats:
        rec = stats["reorder_score"]
        how = (
            "parameters not recorded"
            if rec is None
            else ", ".join(f"{k} {v}" for k, v in rec.items() if k != "name")
        )
        lines.append(f"reordered   by {stats['reordered_by']}" + (f" ({how})" if how else ""))
    if args.verify:
        lines.append("verified    checksums OK, no NaN/Inf in features")
    print("\n".join(lines))
    return 0
