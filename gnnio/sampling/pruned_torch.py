"""HyDRA's threshold pruning on the GPU (``PrunedUniformSampler(..., device="cuda")``; issue 24).

The same sampler as :class:`~gnnio.sampling.pruned.PrunedUniformSampler`'s numba kernels
(:func:`gnnio.sampling._las_kernels.sample_rows` with ``theta > 0`` and no hot set), bit for bit:
nodes, edges, their order, the blocks' CSR pointers and the edge weights equal the CPU sampler's
with the same seed and call key, on any device (tested on CPU tensors and in Triton's
interpreter). Per hop ``h`` with threshold ``theta`` (:func:`~gnnio.sampling.locality.
prune_thresholds`; 0 = not pruned) a row of degree ``d``:

* ``d <= theta`` (or ``theta == 0``): a plain uniform row -- the uniform GPU sampler's draws;
* ``d > theta``: from the row's stream ``mix64(hop_key ^ v * GAMMA)`` a start ``st`` in
  ``[0, d)`` (Lemire, rejections redrawn), then ``k = min(theta, fanout)`` positions by Floyd's
  algorithm inside the circular window of ``theta`` positions from ``st`` (``p = st + pick``,
  minus ``d`` past the row's end); with ``fanout >= theta`` the whole window, in order.

The hop keys are the CPU sampler's, ``hop_key(call key, h)`` (:mod:`gnnio.sampling.threaded`),
the uniform ones. So the batch runs through the uniform GPU sampler's machinery: the Triton hop
kernel (:mod:`._triton_hop`) takes ``theta`` as a runtime argument (one compiled kernel for every
threshold, 0 = the uniform hop), the torch hop (:func:`gnnio.sampling.gpu_hop.sample_hop_torch`,
where Triton is missing or fails) its ``theta=``; the bounded batch
(:mod:`gnnio.sampling.gpu_bounded`, one host sync) and the synced path (``len(fanouts) + 1``
syncs: a fanout of -1, huge bounds, a rejected fast torch draw) read each hop's threshold from
``sampler.thresholds`` and cap each row's draws at ``sampler.k_fanouts`` (``min(fanout, theta)``).
:meth:`TorchPrunedSampler._weigh` then writes the edge weights from each edge's destination
degree, in the CPU kernel's float64 operations (so the float32 weights are the same bits):
``n`` = ``theta`` for a cut row, else ``d``; ``k = min(n, fanout)``; ``ws = d / n`` (``"ht"``)
or ``(d / n) / d`` (``"ht_mean"``); the weight is ``ws`` when ``k == n``, else ``ws * n / k``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .base import MiniBatch
from .gpu import TorchUniformSampler

__all__ = ["TorchPrunedSampler", "pruned_weights"]


class TorchPrunedSampler(TorchUniformSampler):
    """Uniform sampling with HyDRA threshold pruning over torch CSR tensors (any device; meant for
    CUDA), bit-identical to the numba :class:`~gnnio.sampling.pruned.PrunedUniformSampler`.

    Args:
        indptr: int64 ``[N + 1]``; indices: ``[E]`` -- CSR of in-neighbours on the sampling device
            (or pinned host memory viewed from the GPU: UVA sampling).
        fanouts: per hop, ``fanouts[0]`` = the seeds' hop.
        thresholds: the pruning window per hop (``fanouts`` order; 0 = not pruned), as
            :attr:`PrunedUniformSampler.thresholds <gnnio.sampling.locality.LocalitySampler>`.
        weights: ``"ht"`` (``1 / pi``), ``"ht_mean"`` (``1 / (deg pi)``) or ``"none"``.
        cuda_graph: replay each batch as a CUDA graph (:mod:`.gpu_graphed`, whose hop reads
            ``thresholds`` as the eager one does; the same batches).

    :meth:`sample` takes the 64-bit call key; :class:`~gnnio.sampling.pruned.
    PrunedUniformSampler` derives it from its seed and call counter / ``epoch_seed``.
    """

    def __init__(
        self,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        fanouts: Sequence[int],
        thresholds: Sequence[int],
        weights: str = "ht",
        cuda_graph: bool = False,
    ):
        super().__init__(indptr, indices, fanouts, cuda_graph=cuda_graph)
        thresholds = [int(t) for t in thresholds]
        if len(thresholds) != len(self.fanouts) or min(thresholds, default=0) < 0:
            raise ValueError(f"thresholds: need one >= 0 per hop, got {thresholds}")
        self.thresholds = thresholds
        if weights not in ("ht", "ht_mean", "none"):
            raise ValueError(f"weights: choose from ht, ht_mean, none, got {weights!r}")
        self.weights = weights

    def sample(self, seeds, key: int) -> MiniBatch:
        """Sample around ``seeds`` (distinct global ids) with the random stream of ``key``: the
        uniform GPU sampler's batch with the pruned hops, then the edge weights (no host sync)."""
        return self._weigh(super().sample(seeds, key))

    def _weigh(self, mb: MiniBatch) -> MiniBatch:
        """The blocks' edge weights (module docstring) and ``meta["scale"] = 1.0`` (the CPU
        sampler's: a locality-aware sampler without a hot set)."""
        if self.weights != "none":
            nodes, ip = mb.input_nodes, self.indptr
            deg = (ip[nodes + 1] - ip[nodes]).to(torch.float64)
            hops = zip(self.fanouts, self.thresholds, reversed(mb.blocks), strict=True)
            for f, theta, blk in hops:
                blk.edge_weight = pruned_weights(deg[blk.edge_index[1]], f, theta, self.weights)
        mb.meta["scale"] = 1.0
        return mb


def pruned_weights(d: torch.Tensor, fanout: int, theta: int, weights: str) -> torch.Tensor:
    """Float32 edge weights of a pruned uniform hop from each edge's destination degree ``d``
    (float64), in the CPU kernel's float64 operations (module docstring)."""
    n = d.clamp(max=theta) if theta > 0 and fanout >= 0 else d
    k = n if fanout < 0 else n.clamp(max=fanout)
    ws = d / n
    if weights == "ht_mean":
        ws = ws / d
    return torch.where(k == n, ws, ws * n / k).to(torch.float32)
