"""Locality-aware LADIES: Song & Jiang's Eq. 8 applied to the layer distribution of
:class:`~gnnio.sampling.ladies.LadiesSampler` -- their own setting (§4, §5: layer-wise sampling,
``|Q'_l| = 8192``).

**Eq. 8 on a layer.** A LADIES hop gives each candidate ``j`` a probability ``q_j`` (``pi_j`` in
:mod:`gnnio.sampling.ladies`, summing to the layer size ``K``). Song & Jiang multiply the ``q_j`` of
the members of the layer's set ``Q'_l`` by ``s`` and renormalise so the sum is unchanged::

    q_j^new = s q_j M  (j in Q'_l),   q_j M  (otherwise),   M = sum_j q_j / (s sum_{Q'} q + sum_{not Q'} q)

(Eq. 8 prints ``s q_j / M``; only the multiplier form keeps ``sum q^new = sum q``, the property
the paper states, so ``M`` is read as a multiplier -- the reading
:mod:`gnnio.sampling.locality` documents for the node-wise case). Ratios inside ``Q'_l`` and inside
its complement are kept, as the paper requires. With uncapped ``q = c p`` that is exactly
``q^new = c' p'`` with ``p'_j = s p_j`` for members: the sampler multiplies the LADIES weights of
members by ``s`` and solves the budget again, which also covers the case Eq. 8 leaves open -- a
``q^new`` above 1 is capped at 1 and the excess spread over the rest, keeping ``sum q^new = K``.
``s = 1`` is LADIES exactly (same draws, same weights). Weights stay ``1 / q_j^new``, so the
estimate stays unbiased (the paper's ``E[sum xi_j w_ij x_j / q_j] = sum w_ij x_j``).

**Sets and layers** as :class:`~gnnio.sampling.locality.LocalitySampler`: ``Q'_1 = B`` (the
GPU-resident nodes), ``Q'_{l+1}`` = the ``q_size`` nodes with the largest ``v_{l+1} = v_l A``,
``A`` with every node's self-loop as in the paper's example (:func:`~gnnio.sampling.locality.las_sets`); layer ``l = 1`` is the input layer, so hop ``h``
(0-based, the seeds' hop first) uses ``Q'_{L - h}``: the last hop, whose new nodes are the rows
gathered from the feature store, favours ``B``. ``scale`` may be changed between epochs (e.g. by
:class:`~gnnio.sampling.AdaptiveScale`, Algorithm 2).

**On a GPU** (``device="cuda"``, or a graph on one): LADIES' torch path
(:mod:`gnnio.sampling.ladies_torch`) with each layer's member index -- the uniform
locality-aware GPU sampler's ``(qptr, qpos)``, built here and uploaded once (UVA sampling,
``graph_in="host"``: pinned host memory, as the CSR) -- tests each candidate's membership on the
device (:func:`~gnnio.sampling.ladies_torch.member_positions`), no host sync more than LADIES'.
The same batches as the numba kernels (bit for bit on CPU tensors; on CUDA the weights within
float rounding, as LADIES'). The scale is passed per batch, so a new one needs no upload.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..graph.csr import CSRGraph
from .adaptive import check_scale
from .base import MiniBatch
from .ladies import LadiesSampler
from .locality import LocalitySampler, _as_hot_ids, las_sets
from .uniform import UniformSampler

__all__ = ["LocalityLadiesSampler"]


class LocalityLadiesSampler(LadiesSampler):
    """LADIES with Song & Jiang's locality-aware Eq. 8 (see module docstring).

    Args:
        graph, layer_sizes, seed, weights, device, graph_in: as
            :class:`~gnnio.sampling.ladies.LadiesSampler` (on a GPU: the module docstring).
        hot_ids: the set ``B`` of GPU-resident nodes (global ids or a bool mask ``[N]``).
        scale: ``s`` in ``[1e-200, 1e200]`` (1 = LADIES); settable later through ``.scale``.
        q_size: ``|Q'_l|`` for ``l >= 2`` (default ``|B|``; Song & Jiang used 8192).

    Attributes:
        q_sets: ``Q'_1 .. Q'_L`` (sorted global ids; index ``l - 1`` = layer ``l``).
    """

    def __init__(
        self,
        graph: CSRGraph,
        layer_sizes: Sequence[int],
        hot_ids,
        scale: float = 1.0,
        seed: int = 0,
        q_size: int | None = None,
        weights: str = "ht",
        device: str | torch.device | None = None,
        graph_in: str = "gpu",
    ):
        # (the CPU CSR first: the sets, the member index and the kernels are built from it)
        super().__init__(graph, layer_sizes, seed=seed, weights=weights, device="cpu")
        self.scale = scale
        hot = _as_hot_ids(hot_ids, self.num_nodes)
        self.q_sets = las_sets(
            CSRGraph._trusted(self.indptr, self.indices), hot, self.num_layers, size=q_size
        )
        self._masks = []
        for qs in self.q_sets:
            m = np.zeros(self.num_nodes, dtype=np.uint8)
            m[qs] = 1
            self._masks.append(m)
        topo = UniformSampler._device_topology(self, graph, device, graph_in)  # type: ignore[arg-type]  # borrowed: sets graph_in and _pins here too
        if topo is not None:
            from .ladies_torch import TorchLadiesSampler

            # hop h uses Q'_{L - h}; the member index as LocalitySampler's (borrowed methods)
            member = LocalitySampler._member_index
            index = [member(self, qs) if qs.size else None for qs in self.q_sets[::-1]]  # type: ignore[arg-type]
            if graph_in == "host":  # (UVA: the member index stays in pinned host memory too)
                pin = LocalitySampler._pinned_index
                index = [pin(self, q, topo[0].device) for q in index]  # type: ignore[arg-type]
            self._torch = TorchLadiesSampler(*topo, self.layer_sizes, weights, member_index=index)

    @property
    def scale(self) -> float:
        """The factor ``s`` (in ``[1e-200, 1e200]``, :data:`~gnnio.sampling.adaptive.MAX_SCALE`;
        1 = LADIES). Read once per hop."""
        return self._scale

    @scale.setter
    def scale(self, value: float) -> None:
        self._scale = check_scale(value)  # (in [1e-200, 1e200]: Eq. 8's sums stay finite)

    def layer_of_hop(self, hop: int) -> int:
        """Song & Jiang's layer ``l`` (1 = input layer) of hop ``hop`` (0-based): ``L - hop``."""
        return self.num_layers - int(hop)

    def _layer_q(self, h: int) -> tuple[np.ndarray, bool, float]:
        return self._masks[self.layer_of_hop(h) - 1], True, self._scale

    def sample(self, seeds, epoch_seed: int | None = None) -> MiniBatch:
        """As :meth:`LadiesSampler.sample`; ``meta["scale"]`` is the ``s`` used."""
        s = self._scale
        if self._torch is not None:  # (the scale passed with the batch: read once)
            mb = self._torch.sample(seeds, self._next_key(epoch_seed), s)
        else:
            mb = super().sample(seeds, epoch_seed=epoch_seed)
        mb.meta["scale"] = s
        return mb
