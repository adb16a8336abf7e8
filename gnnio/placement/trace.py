"""A pre-sampled access trace: how often each GPU's mini-batches read each node in one epoch.

Data-parallel training (Song & Jiang §3): every GPU samples its own mini-batches; with a global
shuffle the epoch's batches (:class:`gnnio.ordering.RandomOrder`) are dealt round-robin, batch
``b`` to GPU ``b mod n``. (Training shards the shuffled seeds into contiguous per-rank slices
instead; each GPU gets a uniformly random share of the seeds either way, so the read distribution
is the same, but the batches are not identical. Round-robin makes :func:`regroup` exact.) With ``seed_parts`` (partition-local training, as PaGraph and DistDGL do)
GPU ``d`` instead takes the batches of its own training nodes (``seed_parts[t] == d``).

The trace runs the real sampler (:class:`gnnio.sampling.UniformSampler`); batch ``b`` is sampled
with ``epoch_seed = epoch * 2**32 + b`` (per device in ``seed_parts`` mode), so the trace depends
only on the arguments. Counts are exact reads: a node appears at most once in a batch's
``input_nodes``, and every row of ``input_nodes`` is one feature read.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import DatasetError
from ..graph.csr import CSRGraph
from ..utils.progress import bar

__all__ = ["AccessTrace", "sample_trace", "epoch_batches", "regroup"]


@dataclass
class AccessTrace:
    """Reads of one sampled epoch.

    Attributes:
        counts: int32 ``[n, N]``: number of GPU ``d``'s batches whose ``input_nodes`` hold node
            ``j`` (= rows of ``j`` that GPU ``d`` reads), summed over ``epochs`` epochs.
        batches: number of batches per GPU (all epochs).
        seeds_mode: ``"global"`` (shared shuffle, round-robin) or ``"parts"`` (partition-local).
        sample_s: wall-clock seconds spent sampling (measured).
        fanouts, batch_size, seed: how it was made.
        epoch: the first epoch sampled.
        epochs: number of consecutive epochs sampled (``per_epoch`` divides by it).
    """

    counts: np.ndarray
    batches: list[int]
    seeds_mode: str
    sample_s: float
    fanouts: list[int]
    batch_size: int
    seed: int
    epoch: int
    epochs: int = 1

    @property
    def per_epoch(self) -> np.ndarray:
        """float64 ``[n, N]``: mean reads per epoch."""
        return self.counts / float(self.epochs)

    @property
    def rows_per_device(self) -> np.ndarray:
        """Rows each GPU reads per epoch (float64 ``[n]``)."""
        return self.counts.sum(axis=1, dtype=np.int64) / float(self.epochs)

    def to_dict(self) -> dict:
        rows = self.rows_per_device
        return {
            "seeds_mode": self.seeds_mode,
            "batches_per_device": list(self.batches),
            "rows_per_device": [float(r) for r in rows],
            "mean_rows_per_batch": float(
                self.counts.sum(dtype=np.int64) / max(1, sum(self.batches))
            ),
            "sample_s": self.sample_s,
            "fanouts": list(self.fanouts),
            "batch_size": self.batch_size,
            "seed": self.seed,
            "epoch": self.epoch,
            "epochs": self.epochs,
        }


def epoch_batches(train_idx: np.ndarray, batch_size: int, seed: int, epoch: int) -> Iterator:
    """The seed batches of one epoch from :class:`gnnio.ordering.RandomOrder`."""
    from ..ordering import RandomOrder

    return iter(RandomOrder(train_idx, batch_size, seed=seed).batches(epoch))


def sample_trace(
    graph: CSRGraph,
    train_idx: np.ndarray,
    fanouts: Sequence[int],
    batch_size: int,
    num_devices: int,
    seed: int = 0,
    epoch: int = 0,
    epochs: int = 1,
    seed_parts: np.ndarray | None = None,
    num_threads: int | None = None,
    progress: bool = True,
) -> AccessTrace:
    """Sample one epoch and count every GPU's reads (see module docstring).

    Args:
        graph: CSR of in-neighbours.
        train_idx: int64 global ids of the training nodes.
        fanouts: per-hop fanouts (``fanouts[0]`` = hop 1).
        batch_size: seeds per mini-batch (per GPU).
        num_devices: ``n``.
        seed: seed of the order and of the sampler.
        epoch: the first epoch of the order to sample.
        epochs: how many consecutive epochs to sample (more = less noise on small graphs).
        seed_parts: optional int ``[N]`` device of each node; training nodes are then seeded on
            their own device (nodes with a part outside ``[0, n)`` are not trained on).
        num_threads: sampler threads (None = numba's setting).
        progress: progress bar over batches.
    """
    from ..sampling import UniformSampler

    n = graph.num_nodes
    train = np.asarray(train_idx, dtype=np.int64)
    if train.size == 0:
        raise DatasetError("the dataset has no training nodes; cannot sample an access trace")
    sampler = UniformSampler(graph, fanouts, seed=seed, num_threads=num_threads)
    counts = np.zeros((num_devices, n), dtype=np.int32)
    batches = [0] * num_devices
    t0 = time.perf_counter()
    if seed_parts is None:
        mode = "global"
        jobs: list[tuple[int | None, np.ndarray]] = [(None, train)]
    else:
        mode = "parts"
        sp = np.asarray(seed_parts)[train]
        jobs = [(d, train[sp == d]) for d in range(num_devices)]
    if epochs < 1:
        raise ValueError(f"epochs: must be >= 1, got {epochs}")
    total = epochs * sum(-(-t.size // batch_size) for _, t in jobs)
    with bar(total, desc=f"sample trace ({mode})", unit="batch", enabled=progress) as pb:
        for ep in range(epoch, epoch + epochs):
            for dev, seeds_all in jobs:
                if seeds_all.size == 0:
                    continue
                for b, seeds in enumerate(epoch_batches(seeds_all, batch_size, seed, ep)):
                    d = b % num_devices if dev is None else dev
                    key = (ep << 32) + b if dev is None else (ep << 32) + (dev << 24) + b
                    mb = sampler.sample(seeds, epoch_seed=key)
                    counts[d][mb.input_nodes.numpy()] += 1  # distinct within a batch
                    batches[d] += 1
                    pb.update(1)
    return AccessTrace(
        counts=counts,
        batches=batches,
        seeds_mode=mode,
        sample_s=time.perf_counter() - t0,
        fanouts=[int(f) for f in fanouts],
        batch_size=int(batch_size),
        seed=int(seed),
        epoch=int(epoch),
        epochs=int(epochs),
    )


def regroup(trace: AccessTrace, num_devices: int) -> AccessTrace:
    """The same epoch dealt to fewer GPUs: slot ``s`` of a global-mode trace sampled for ``m``
    GPUs goes to GPU ``s mod num_devices`` (exact when ``num_devices`` divides ``m``, since batch
    ``b`` went to slot ``b mod m`` and ``(b mod m) mod n == b mod n``)."""
    m = trace.counts.shape[0]
    if trace.seeds_mode != "global":
        raise ValueError("regroup: only a global-mode trace can be dealt to other GPU counts")
    if num_devices < 1 or m % num_devices:
        raise ValueError(f"regroup: {num_devices} GPUs does not divide the trace's {m} slots")
    if num_devices == m:
        return trace
    counts = trace.counts.reshape(m // num_devices, num_devices, -1).sum(axis=0, dtype=np.int32)
    batches = [sum(trace.batches[s] for s in range(d, m, num_devices)) for d in range(num_devices)]
    return AccessTrace(
        counts=counts,
        batches=batches,
        seeds_mode="global",
        sample_s=trace.sample_s,
        fanouts=trace.fanouts,
        batch_size=trace.batch_size,
        seed=trace.seed,
        epoch=trace.epoch,
        epochs=trace.epochs,
    )
