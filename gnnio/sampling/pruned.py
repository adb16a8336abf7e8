"""HyDRA's threshold pruning (§III-A3) with uniform sampling: :class:`PrunedUniformSampler`, a
:class:`~gnnio.sampling.locality.LocalitySampler` without a hot set (that module's docstring
explains the circular windows and why their weights equal the unpruned ones), on the CPU or, with
``device="cuda"``, the GPU (:mod:`gnnio.sampling.pruned_torch`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..graph.csr import CSRGraph
from .base import MiniBatch
from .locality import WEIGHT_MODES, LocalitySampler, prune_pair, prune_thresholds

__all__ = ["PrunedUniformSampler"]


class PrunedUniformSampler(LocalitySampler):
    """Uniform sampling with HyDRA threshold pruning (``prune=(alpha, beta)``, default (1, 1)) and
    HT weights: a :class:`LocalitySampler` without a hot set. Inclusion probabilities stay
    ``min(deg, fanout) / deg`` (circular windows; module docstring), so the weights equal the
    unpruned ones.

    ``device="cuda"`` (or a graph of CUDA tensors) samples on that GPU with
    :class:`~gnnio.sampling.pruned_torch.TorchPrunedSampler`: the same batches (nodes, edges,
    order, weights) as the CPU kernels with the same seed and call key, one host sync per batch;
    ``graph_in`` and ``cuda_graph`` as :class:`~gnnio.sampling.UniformSampler`'s."""

    def __init__(
        self,
        graph: CSRGraph,
        fanouts: Sequence[int],
        prune: tuple[float, float] = (1.0, 1.0),
        seed: int = 0,
        num_threads: int | None = None,
        weights: str = "ht",
        device: str | torch.device | None = None,
        graph_in: str = "gpu",
        cuda_graph: bool = False,
    ):
        from .uniform import UniformSampler

        self._torch = None  # the CSR placed as the uniform sampler places it (same options)
        topo = UniformSampler._device_topology(self, graph, device, graph_in)  # type: ignore[arg-type]  # borrowed: sets graph_in and _pins on this sampler too
        if topo is None:
            super().__init__(
                graph, fanouts, None, 1.0, seed=seed, num_threads=num_threads, prune=prune,
                weights=weights,
            )  # fmt: skip
            return
        from .pruned_torch import TorchPrunedSampler

        self._init_threads(fanouts, seed, num_threads)
        if weights not in WEIGHT_MODES:
            raise ValueError(f"weights: choose from {', '.join(WEIGHT_MODES)}, got {weights!r}")
        self.weights, self._scale, self.q_sets = weights, 1.0, None
        ip = topo[0]
        self.num_nodes = int(ip.shape[0]) - 1
        self.avg_degree = int(ip[-1]) / self.num_nodes if self.num_nodes > 0 else 0.0
        self.prune = prune_pair(prune)
        self.thresholds = prune_thresholds(self.avg_degree, self.fanouts, self.prune)
        self._torch = TorchPrunedSampler(*topo, self.fanouts, self.thresholds, weights,
                                         cuda_graph=cuda_graph)  # fmt: skip

    def sample(self, seeds, epoch_seed: int | None = None) -> MiniBatch:
        """As :meth:`LocalitySampler.sample`; on the GPU path the same batch, sampled there."""
        if self._torch is None:
            return super().sample(seeds, epoch_seed)
        return self._torch.sample(seeds, self._next_key(epoch_seed))
