"""``gnnio plan ... --memory-budget BYTES`` (issue 25, item 1): what a plan holds, checked first.

A plan is made of per-node arrays: the access probabilities and their scaled copy, the sampled
epoch's read counts (int32 per GPU) and their per-epoch float copy, one GPU's lookup while its
cost is summed, every strategy's buffers (kept for the report), and the partitioning strategies'
node maps. The sampler of the trace reads the CSR at random, so the whole CSR counts. The
score before it runs in chunked passes within the same budget
(:func:`gnnio.preprocess.hotness.compute_score`). ``metis`` needs the symmetrized graph in RAM
(:data:`gnnio.preprocess.partition.bounded.IN_MEMORY`): under a budget it runs only when that
fits, else the plan is refused with one line before anything starts; every other strategy is
counted here.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..preprocess.budget import chunk_bytes

__all__ = ["plan_fixed_bytes", "check_plan_budget"]

#: per node, whatever the GPU count: probs, expected reads, the strategies' sort orders and
#: temporaries, one lookup (int16 device + int32 position) and its int64 index copy
BASE_NODE_BYTES = 64
#: per node and GPU: the trace's int32 counts and their float64 per-epoch copy, PaGraph's
#: membership bytes
GPU_NODE_BYTES = 13


def plan_fixed_bytes(graph, num_gpus: int, buffer_rows: int, strategies: Sequence[str]) -> int:
    """Bytes a plan holds besides its score's chunks (module docstring)."""
    from ..preprocess.partition.bounded import IN_MEMORY

    n, e = graph.num_nodes + 1, graph.num_edges
    csr = graph.indptr.nbytes + graph.indices.nbytes
    per_node = BASE_NODE_BYTES + GPU_NODE_BYTES * num_gpus + 2 * len(strategies)  # + node maps
    buffers = 8 * int(buffer_rows) * num_gpus * len(strategies)
    fixed = per_node * n + buffers + csr
    if "metis" in strategies:
        node_b, edge_b = IN_MEMORY["metis"]
        fixed += node_b * n + edge_b * e
    return int(fixed)


def check_plan_budget(
    budget: int | None, dataset, num_gpus: int, buffer_rows: int, strategies: Sequence[str],
    score: str,
) -> None:  # fmt: skip
    """Refuse with one line, before anything starts, a budget that cannot hold the plan or its
    score (None: no budget)."""
    if budget is None:
        return
    from ..preprocess.hotness import SCORES, score_fixed_bytes

    g = dataset.graph
    fixed = plan_fixed_bytes(g, num_gpus, buffer_rows, strategies)
    what = f"a plan of {len(strategies)} strategies on {num_gpus} GPUs and {g.num_nodes:,} nodes"
    if "metis" in strategies:
        what += " (metis runs in memory: leave it out of --strategies to need less)"
    chunk_bytes(budget, fixed, what)
    if score in SCORES:  # an unknown name is refused by compute_score
        chunk_bytes(budget, score_fixed_bytes(score, g), f"the '{score}' score")
