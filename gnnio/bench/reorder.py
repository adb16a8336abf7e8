"""``gnnio bench reorder``: throughput of the CSR relabel (Data Tiering Algorithm 2).

Times :func:`gnnio.preprocess.reorder.relabel_csr` with each implementation -- numba-parallel (default),
vectorized numpy, and the plain row-by-row reference (the sequential approach the paper compares
against) -- on one graph relabelled by descending paper out-degree (what reordering by a hotness
score produces: long rows first). Reports the median wall time of ``--passes`` timed passes after
``--warmup`` untimed ones, and edges relabelled per second.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

from ..errors import UsageError
from ..graph.csr import CSRGraph
from ..preprocess.reorder import IMPLS, order_by_score, relabel_csr
from . import KINDS
from ._timing import median, time_passes

__all__ = ["HELP", "DESCRIPTION", "add_arguments", "run"]

HELP = KINDS["reorder"]
DESCRIPTION = (
    "Relabel a graph (a dataset's, or a generated synthetic power-law graph) by descending "
    "out-degree with each relabel implementation and report median seconds and edges/s."
)


def add_arguments(p) -> None:
    p.add_argument(
        "dir",
        metavar="DIR",
        nargs="?",
        default=None,
        help="dataset directory (default: generate a synthetic graph)",
    )
    p.add_argument("--num-nodes", type=int, default=1 << 20, help="generated graph: nodes")
    p.add_argument("--avg-degree", type=float, default=16, help="generated graph: edges per node")
    p.add_argument("--seed", type=int, default=0, help="generated graph: seed")
    p.add_argument("--impls", default=",".join(IMPLS), help="implementations to time")
    p.add_argument("--passes", type=int, default=3, help="timed passes per implementation")
    p.add_argument("--warmup", type=int, default=1, help="untimed passes first (JIT, page cache)")
    p.add_argument("--threads", type=int, default=None, help="numba threads (default: all)")


def _graph(args) -> tuple[CSRGraph, str]:
    if args.dir:
        from ..graph.dataset import load

        ds = load(args.dir)
        return CSRGraph(np.asarray(ds.graph.indptr), np.asarray(ds.graph.indices)), ds.name
    from ..importers.synthetic import generate_graph

    indptr, indices, _ = generate_graph(args.num_nodes, avg_degree=args.avg_degree, seed=args.seed)
    return CSRGraph(indptr, indices), f"synthetic(n={args.num_nodes}, deg={args.avg_degree:g})"


def run(args) -> dict[str, Any]:
    impls = list(dict.fromkeys(s.strip() for s in str(args.impls).split(",") if s.strip()))
    bad = [s for s in impls if s not in IMPLS]
    if bad or not impls:  # before the graph is built (the default one takes seconds)
        raise UsageError(
            f"--impls: {'unknown ' + repr(bad[0]) if bad else 'give at least one'} "
            f"(choose from {', '.join(IMPLS)})"
        )
    g, name = _graph(args)
    perm = order_by_score(g.out_degrees().astype(np.float64))
    old_threads = numba.get_num_threads()
    if args.threads is not None:
        numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))  # type: ignore[attr-defined]  # set by numba.config at import
    try:
        results: dict[str, dict[str, float]] = {}
        for impl in impls:
            # the reference is slow (one Python step per row): one warm-up at most
            times = time_passes(
                lambda impl=impl: relabel_csr(g.indptr, g.indices, perm, impl=impl),  # type: ignore[misc]  # default-bound lambda
                warmup=min(args.warmup, 1) if impl == "reference" else args.warmup,
                passes=args.passes,
            )
            med = median(times)
            results[impl] = {"median_s": med, "edges_per_s": g.num_edges / med if med else 0.0}
        threads = numba.get_num_threads()
    finally:
        numba.set_num_threads(old_threads)
    out: dict[str, Any] = {
        "graph": name,
        "num_nodes": g.num_nodes,
        "num_edges": g.num_edges,
        "threads": threads,
        "passes": args.passes,
        "results": results,
    }
    if "reference" in results:
        ref = results["reference"]["median_s"]
        out["speedup_vs_reference"] = {
            k: ref / v["median_s"] for k, v in results.items() if k != "reference" and v["median_s"]
        }
    return out
