"""Partitioning the topology over ranks or machines (preprocessing, done once per dataset).

:func:`partition_dataset` runs one method and measures the result; :func:`save_partition` /
:func:`load_partition` keep it next to the dataset (``gnnio partition DIR --parts M --method ...
--out PDIR``). Methods (:data:`METHODS`):

=============== ==================================================================================
``random``      seeded random equal parts
``range``       consecutive id ranges
``metis``       METIS k-way (pymetis) on the symmetrized graph
``bfs-block``   BGL §3.3: multi-source BFS blocks, multi-level coarsening, greedy assignment with
                j-hop block neighbours x training-node penalty x node penalty
                (:mod:`.bfs_block`)
``hdr``         HyDRA Algorithm 1: replicate the top ``p_r`` nodes by degree on every part, assign
                the rest greedily in groups by degree sum (``base="greedy"``) or by another
                method (``base="metis"|"bfs-block"|"random"|"range"``) (:mod:`.methods`)
=============== ==================================================================================

``replicate`` also applies to the other methods (their parts, plus the top-degree replicated
set), which is how HDR composes with any base. ``refine=R`` (off by default; not in either paper)
follows any method with ``R`` rounds of size-constrained label propagation (:mod:`.refine`).
``memory_budget`` (``--memory-budget``) bounds ``random``, ``range`` and ``hdr`` over them and
``greedy``; ``metis`` and ``bfs-block`` stay in memory and are refused when they would not fit
(:mod:`.bounded`).
"""

from __future__ import annotations

import time

import numpy as np

from ...errors import UsageError
from .methods import hdr_greedy_parts, hdr_replicated, metis_parts, random_parts, range_parts
from .store import PARTITION_FORMAT, Partition, load_partition, save_partition, shard_of

__all__ = [
    "BASES",
    "METHODS",
    "PARTITION_FORMAT",
    "Partition",
    "load_partition",
    "metis_parts",
    "partition_dataset",
    "save_partition",
    "shard_of",
]

METHODS = ("random", "range", "metis", "bfs-block", "hdr")
BASES = ("greedy", "metis", "bfs-block", "random", "range")


def _parts(method: str, ds, nparts: int, hops: int, seed: int, rep: np.ndarray):
    g = ds.graph
    if method == "random":
        return random_parts(g.num_nodes, nparts, seed), {}
    if method == "range":
        return range_parts(g.num_nodes, nparts), {}
    if method == "metis":
        return metis_parts(g, nparts), {}
    if method == "bfs-block":
        from .bfs_block import bfs_block_parts

        return bfs_block_parts(g, nparts, ds.train_idx, hops=hops, seed=seed)
    if method == "greedy":
        return hdr_greedy_parts(g, nparts, rep), {}
    raise UsageError(f"--method: unknown '{method}' (choose from {', '.join(METHODS)})")


def partition_dataset(
    ds,
    nparts: int,
    method: str,
    replicate: float = 0.0,
    base: str = "greedy",
    hops: int = 2,
    seed: int = 0,
    fanouts=(15, 10, 5),
    batch_size: int = 1024,
    measure: bool = True,
    threads: int | None = None,
    refine: int = 0,
    memory_budget: int | None = None,
) -> Partition:
    """Partition ``ds`` into ``nparts`` with ``method`` (module docstring); with ``measure`` the
    quality report (one sampled epoch for ``remote_fraction``) is attached. ``refine``: rounds of
    label-propagation refinement after the method (0 = none, the papers' algorithms as printed).
    ``memory_budget``: bytes (:mod:`.bounded`; refused with one line before starting when the
    method cannot run within it; the same parts and report)."""
    n = ds.num_nodes
    if method not in METHODS:
        raise UsageError(f"--method: unknown '{method}' (choose from {', '.join(METHODS)})")
    if not 1 <= nparts <= max(n, 1) or nparts > 32767:
        raise UsageError(f"--parts: must be in [1, {min(max(n, 1), 32767)}], got {nparts}")
    if not 0.0 <= replicate < 1.0:
        raise UsageError(f"--replicate: must be in [0, 1), got {replicate}")
    if hops < 1:
        raise UsageError(f"--hops: must be >= 1, got {hops}")
    if not 0 <= refine <= 1000:
        raise UsageError(f"--refine: must be in [0, 1000] rounds, got {refine}")
    if method == "hdr" and base not in BASES:
        raise UsageError(f"--base: unknown '{base}' (choose from {', '.join(BASES)})")
    if refine > 0 and memory_budget is not None:
        raise UsageError("--refine: not with --memory-budget (it keeps the transposed CSR in RAM)")
    from .bounded import check_budget

    chunk = check_budget(memory_budget, ds.graph, method, base)
    t0 = time.perf_counter()
    rep = hdr_replicated(ds.graph, replicate)
    parts, facts = _parts(base if method == "hdr" else method, ds, nparts, hops, seed, rep)
    if refine > 0:
        from .refine import refine_parts

        facts = dict(facts)
        facts["prep_before_refine_s"] = time.perf_counter() - t0
        parts, more = refine_parts(ds.graph, parts, nparts, ds.train_idx, refine, seed=seed)
        facts.update(more)
    prep = time.perf_counter() - t0
    params = {"replicate": replicate, "hops": hops, "seed": seed, **facts}
    if method == "hdr":
        params["base"] = base
    p = Partition(
        parts=np.asarray(parts, dtype=np.int16),
        replicated=rep,
        num_parts=nparts,
        method=method,
        params=params,
        prep_s=prep,
        dataset=ds.name,
        fingerprint=ds.fingerprint,
    )
    if measure:
        from .quality import partition_quality

        p.quality = partition_quality(
            ds.graph, p.parts, rep, ds.train_idx, fanouts, batch_size, seed, threads, chunk
        )
        p.quality["prep_s"] = prep
    return p
