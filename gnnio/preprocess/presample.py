"""The ``presample`` hotness score: access counts from running the real sampler over the real
seed order for some epochs (the measured counterpart of the estimates in
:mod:`gnnio.preprocess.graph_scores`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import UsageError
from ..graph.csr import CSRGraph
from ..utils.progress import bar
from .graph_scores import _check_train_idx

__all__ = ["presample_counts"]


def presample_counts(
    graph: CSRGraph,
    train_idx: np.ndarray,
    fanouts: Sequence[int] = (15, 10, 5),
    batch_size: int = 1024,
    epochs: int = 1,
    seed: int = 1,
    num_threads: int | None = None,
    progress: bool = True,
) -> np.ndarray:
    """Access counts from running the real sampler: how many mini-batches read each node.

    Runs :class:`gnnio.sampling.UniformSampler` over the batches of
    :class:`gnnio.ordering.shuffle.RandomOrder` for ``epochs`` epochs (epochs ``0 .. epochs-1`` of the
    order seeded with ``seed``; the sampler is seeded with ``seed`` too) and counts, per node, the
    batches whose ``input_nodes`` contain it (a node appears at most once per batch). Batch ``b``
    of epoch ``e`` is sampled with ``epoch_seed = e * 2**32 + b``, so the counts do not depend on
    thread count or on earlier calls.

    Args:
        graph: CSR of in-neighbours.
        train_idx: int64 global ids of the training nodes (the seeds).
        fanouts: per-hop fanouts (``fanouts[0]`` = hop 1).
        batch_size: seeds per mini-batch.
        epochs: number of epochs to sample (>= 1).
        seed: seed of the order and of the sampler. Use a different one from the run you want to
            predict, otherwise the "prediction" is that run itself.
        num_threads: numba threads for the sampler (None = current setting).
        progress: progress bar over batches.

    Returns:
        float64 ``[N]`` access counts (number of batches) by global id.
    """
    from ..ordering import RandomOrder
    from ..sampling import UniformSampler

    n = graph.num_nodes
    t = _check_train_idx(train_idx, n)
    if epochs < 1:
        raise UsageError(f"epochs: must be >= 1, got {epochs}")
    if batch_size < 1:
        raise UsageError(f"batch_size: must be >= 1, got {batch_size}")
    sampler = UniformSampler(graph, fanouts, seed=seed, num_threads=num_threads)
    order = RandomOrder(t, batch_size, seed=seed)
    counts = np.zeros(n, dtype=np.int64)
    nb = -(-t.size // batch_size)
    with bar(epochs * nb, desc="presample", unit="batch", enabled=progress) as pb:
        for ep in range(epochs):
            for b, seeds in enumerate(order.batches(ep)):
                mb = sampler.sample(seeds, epoch_seed=(ep << 32) + b)
                counts[mb.input_nodes.numpy()] += 1  # input_nodes are distinct within a batch
                pb.update(1)
    return counts.astype(np.float64)
