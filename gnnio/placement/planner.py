"""Run every placement strategy on a dataset and a topology; model and compare their costs.

The steps of ``gnnio plan`` (all on CPU; the seconds it reports are **modeled** from bytes):

1. the access probabilities ``p`` (default: Song & Jiang §3.2, :func:`gnnio.preprocess.hotness.sj_estimate`
   via the ``"sj"`` score), timed as ``prob_s``;
2. one epoch of the real sampler, dealt to the GPUs (:mod:`gnnio.placement.trace`): every GPU's
   read count of every node;
3. each strategy's placement, timed as ``prep_s`` (partitioning included);
4. per strategy the Eq. 3 cost (:mod:`gnnio.placement.costmodel`) of the *trace* (``max_cost_s``,
   the slowest GPU's modeled loading seconds per epoch, and the local/peer/host shares of all rows
   read) and of ``p`` scaled to the same number of reads (``predicted_max_cost_s``);
5. ``best``: the strategy with the smallest ``max_cost_s``.

The trace uses a different seed from a ``presample`` score, so no strategy is scored on the very
batches it was built from.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import DatasetError, UsageError
from ..placement.topology import Topology
from ..train.config_dist import DEFAULT_BUFFER
from ..utils.counts import top_count
from . import Placement, PlacementRequest, place
from .costmodel import CostReport, expected_reads, placement_cost
from .trace import AccessTrace, regroup, sample_trace

__all__ = [
    "DEFAULT_STRATEGIES",
    "PARTITION_STRATEGIES",
    "StrategyOutcome",
    "PlanResult",
    "make_plan",
    "buffer_rows_from",
    "warm_up_kernels",
]

DEFAULT_STRATEGIES = ("alg1", "rule1", "interleaved", "mod", "naive", "random", "metis", "pagraph")
#: strategies that are graph partitionings (training seeds can be kept partition-local)
PARTITION_STRATEGIES = ("naive", "random", "metis", "pagraph")


@dataclass
class StrategyOutcome:
    """One strategy's placement and modeled costs (or why it was skipped)."""

    name: str
    placement: Placement | None = None
    trace_cost: CostReport | None = None
    predicted_cost: CostReport | None = None
    seeds_mode: str = "global"
    skipped: str | None = None

    @property
    def cost(self) -> CostReport:
        """The trace cost of a feasible outcome (set whenever it was not skipped)."""
        assert self.trace_cost is not None, f"{self.name}: skipped, no cost"
        return self.trace_cost

    def to_dict(self) -> dict[str, Any]:
        assert self.placement is not None and self.trace_cost is not None
        s = self.trace_cost.shares
        summ = self.placement.summary()
        return {
            "max_cost_s": self.trace_cost.max_s,
            "predicted_max_cost_s": (
                self.predicted_cost.max_s if self.predicted_cost is not None else None
            ),
            "local": s["local"],
            "peer": s["peer"],
            "host": s["host"],
            "prep_s": self.placement.prep_s,
            "max_remote_bytes": self.trace_cost.max_remote_bytes,
            "per_device_s": [d.seconds for d in self.trace_cost.devices],
            "distinct_rows": summ["distinct_rows"],
            "copies_per_row": summ["copies_per_row"],
            "seeds_mode": self.seeds_mode,
            "params": summ["params"],
        }


@dataclass
class PlanResult:
    """Everything ``gnnio plan`` prints."""

    dataset: str
    num_nodes: int
    topology: Topology
    buffer_rows: int
    row_bytes: int
    score: str
    prob_s: float
    trace: AccessTrace
    outcomes: dict[str, StrategyOutcome] = field(default_factory=dict)

    @property
    def feasible(self) -> dict[str, StrategyOutcome]:
        return {k: v for k, v in self.outcomes.items() if v.skipped is None}

    @property
    def best(self) -> str | None:
        f = self.feasible
        return min(f, key=lambda k: (f[k].cost.max_s, k)) if f else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "num_nodes": self.num_nodes,
            "topology": self.topology.to_dict(),
            "buffer_rows": self.buffer_rows,
            "buffer_fraction": self.buffer_rows / self.num_nodes if self.num_nodes else 0.0,
            "row_bytes": self.row_bytes,
            "score": self.score,
            "prob_s": self.prob_s,
            "trace": self.trace.to_dict(),
            "modeled": True,
            "strategies": {k: v.to_dict() for k, v in self.feasible.items()},
            "skipped": {k: v.skipped for k, v in self.outcomes.items() if v.skipped is not None},
            "best": self.best,
        }


def warm_up_kernels() -> None:
    """Compile (or load from numba's cache) the placement and hotness kernels on a tiny input, so
    that ``prep_s`` and ``prob_s`` measure the work and not the JIT."""
    from ..graph.csr import CSRGraph
    from ..preprocess.hotness import propagate
    from .alg1 import algorithm1
    from .baselines import pagraph_partition

    p = np.array([3.0, 2.0, 1.0, 0.5])
    algorithm1(p, 2, 2, 0.1)
    for dt in (np.int32, np.int64):
        g = CSRGraph(np.array([0, 1, 2, 3, 4], dtype=np.int64), np.array([1, 2, 3, 0], dtype=dt))
        pagraph_partition(g, np.array([0, 2]), 2, 2, progress=False)
        propagate(g, p)


def buffer_rows_from(
    buffer: float | None, num_nodes: int, row_bytes: int, topology: Topology
) -> int:
    """``BSIZE`` in rows: ``top_count(buffer, N)`` for a fraction in (0, 1]; with ``buffer``
    None the topology's ``feature_budget_bytes // row_bytes`` where it sets one (a topology
    file), else :data:`~gnnio.train.config_dist.DEFAULT_BUFFER` of the nodes (the presets and
    shorthands set none: ``gnnio train --nproc``'s ``--buffer`` default)."""
    if buffer is not None:
        b = float(buffer)
        if not 0.0 < b <= 1.0:
            raise UsageError(f"--buffer: a fraction of the nodes in (0, 1], got {buffer}")
        return top_count(b, num_nodes)
    rows = topology.buffer_rows(row_bytes)
    if rows is None:
        return top_count(DEFAULT_BUFFER, num_nodes)
    return min(rows, num_nodes)


def make_plan(
    dataset,
    topology: Topology,
    buffer_rows: int,
    strategies: Sequence[str] = DEFAULT_STRATEGIES,
    fanouts: Sequence[int] = (15, 10, 5),
    batch_size: int = 1024,
    score: str = "sj",
    alpha: float | None = None,
    replicate: float = 0.0,
    seed: int = 0,
    trace_epochs: int = 1,
    local_seeds: bool = False,
    pagraph_max_nodes: int = 200_000,
    probs: np.ndarray | None = None,
    prob_s: float | None = None,
    trace: AccessTrace | None = None,
    partition_cache: dict | None = None,
    local_trace_cache: dict | None = None,
    progress: bool = True,
    memory_budget: int | None = None,
) -> PlanResult:
    """Place with every strategy and model the costs (see module docstring).

    Args:
        dataset: a :class:`gnnio.graph.Dataset` with training nodes.
        topology: the machine.
        buffer_rows: ``BSIZE``, rows per GPU.
        strategies: names from :data:`gnnio.placement.STRATEGIES`.
        fanouts, batch_size: the sampler of the trace (and of fanout-aware scores).
        score: hotness score for ``p`` (:data:`gnnio.preprocess.hotness.SCORES`), unless ``probs`` is given.
        alpha: Algorithm 1's threshold; None = ``C_gpu / C_cpu`` of the topology.
        replicate: replicated fraction of the ``interleaved`` buffers.
        seed: seed of the trace (and of ``random``); a ``presample`` score uses ``seed + 1``.
        trace_epochs: epochs sampled for the trace (costs are per epoch, averaged).
        local_seeds: evaluate partitioning strategies with partition-local training seeds
            (PaGraph/DistDGL style, one extra sampled epoch each) instead of the global shuffle.
        pagraph_max_nodes: size cap of ``pagraph``.
        probs, prob_s: a precomputed ``p`` and the seconds it took (reused across plans).
        trace: a precomputed global-mode trace with a multiple of ``topology.num_gpus`` slots.
        partition_cache: reuse METIS/PaGraph partitions across calls (see
            :class:`~gnnio.placement.PlacementRequest`; ``prep_s`` still includes them).
        local_trace_cache: reuse the partition-local traces of ``local_seeds`` across calls
            (keyed by strategy and GPU count; valid while the partitions are reused too).
        progress: progress bars.
        memory_budget: bytes; a budget too small for the plan or its score is refused with one
            line before anything starts (:mod:`gnnio.placement.plan_budget`); the score runs in
            chunked passes and the CSR's pages are dropped after the trace.
    """
    from ..preprocess.hotness import compute_score
    from .plan_budget import check_plan_budget

    warm_up_kernels()
    ds = dataset
    if ds.train_idx is None or ds.train_idx.size == 0:
        raise DatasetError(f"{ds.path}: has no training nodes; placement needs them to model reads")
    n = ds.num_nodes
    row_bytes = int(ds.feat_dim * ds.features.dtype.itemsize)
    train = np.asarray(ds.train_idx, dtype=np.int64)
    check_plan_budget(memory_budget, ds, topology.num_gpus, buffer_rows, strategies, score)
    if probs is None:
        t0 = time.perf_counter()
        opts = {"seed": seed + 1} if score == "presample" else {}
        probs = compute_score(
            score, ds, fanouts=fanouts, batch_size=batch_size, progress=progress,
            memory_budget=memory_budget, **opts,
        )  # fmt: skip
        prob_s = time.perf_counter() - t0
    n_dev = topology.num_gpus
    if trace is None:
        trace = sample_trace(
            ds.graph,
            train,
            fanouts,
            batch_size,
            n_dev,
            seed=seed,
            epochs=trace_epochs,
            progress=progress,
        )
    elif trace.counts.shape[0] != n_dev:
        trace = regroup(trace, n_dev)
    if memory_budget is not None:  # the sampler's pages of the CSR are not kept
        from ..utils.pages import drop_pages

        drop_pages(ds.graph.indices)
        drop_pages(ds.graph.indptr)
    reads = float(trace.rows_per_device.mean())
    predicted_w = expected_reads(probs, reads)
    result = PlanResult(
        dataset=ds.name,
        num_nodes=n,
        topology=topology,
        buffer_rows=int(buffer_rows),
        row_bytes=row_bytes,
        score=score,
        prob_s=float(prob_s or 0.0),
        trace=trace,
    )
    for name in strategies:
        req = PlacementRequest(
            probs=probs,
            topology=topology,
            buffer_rows=buffer_rows,
            graph=ds.graph,
            train_idx=train,
            num_layers=len(fanouts),
            seed=seed,
            alpha=alpha,
            replicate=replicate,
            pagraph_max_nodes=pagraph_max_nodes,
            progress=progress,
            partition_cache=partition_cache,
        )
        try:
            pl = place(name, req)
        except UsageError as e:
            if name == "pagraph" and "cap" in str(e):
                result.outcomes[name] = StrategyOutcome(name, skipped=str(e))
                continue
            raise
        pl.check(capacity=buffer_rows)
        tr, mode = trace, "global"
        if local_seeds and name in PARTITION_STRATEGIES and pl.parts is not None:
            key = (name, n_dev)
            if local_trace_cache is not None and key in local_trace_cache:
                tr = local_trace_cache[key]
            else:
                tr = sample_trace(
                    ds.graph,
                    train,
                    fanouts,
                    batch_size,
                    n_dev,
                    seed=seed,
                    epochs=trace.epochs,
                    seed_parts=pl.parts,
                    progress=progress,
                )
                if local_trace_cache is not None:
                    local_trace_cache[key] = tr
            mode = "parts"
        result.outcomes[name] = StrategyOutcome(
            name=name,
            placement=pl,
            trace_cost=placement_cost(pl, topology, tr.per_epoch, row_bytes),
            predicted_cost=placement_cost(pl, topology, predicted_w, row_bytes),
            seeds_mode=mode,
        )
    return result
