"""Neighbour sampling: the contract in :mod:`.base`, strategies beside it.

* :class:`LaborSampler` -- LABOR-0 (Balın & Çatalyürek): node-wise marginals, one shared variate
  per source vertex, so far fewer distinct input nodes per batch.
* :class:`LadiesSampler` -- LADIES layer-wise importance sampling (Zou et al.; Song & Jiang's
  setting), Poisson draws with Horvitz-Thompson weights (numba on CPU, vectorized torch on CUDA:
  :mod:`.ladies_torch`); :class:`LocalityLadiesSampler` adds Song & Jiang's Eq. 8 on the layer
  distribution (both ways too).
* :class:`UniformSampler` -- GraphSAGE node-wise uniform sampling with per-hop fanouts (numba on
  CPU, vectorized torch on CUDA); :func:`reference.sample_reference` is its plain-Python twin.
* :class:`LocalitySampler` -- Song & Jiang's locality-aware sampling (neighbours near the GPU set B
  favoured by a scale ``s``) with Horvitz-Thompson edge weights and optional HyDRA threshold
  pruning; :class:`PrunedUniformSampler` is the pruning alone; :class:`AdaptiveScale` is their
  Algorithm 2, fed by a measured or :func:`modeled_loading_share`.
* :class:`FrontierSampler` -- PyG ``NeighborLoader``'s semantics (each hop expands only the nodes
  new at the hop before), for :mod:`gnnio.pyg`.
"""

from .adaptive import AdaptiveScale, modeled_loading_share, modeled_loading_time
from .base import Block, MiniBatch, Sampler
from .frontier import FrontierSampler
from .labor import LaborSampler
from .ladies import LadiesSampler, layer_probabilities
from .ladies_locality import LocalityLadiesSampler
from .locality import LocalitySampler, inclusion_probabilities, las_sets, prune_thresholds
from .pruned import PrunedUniformSampler
from .uniform import UniformSampler, parse_fanouts

__all__ = [
    "AdaptiveScale",
    "Block",
    "FrontierSampler",
    "LaborSampler",
    "LadiesSampler",
    "LocalityLadiesSampler",
    "LocalitySampler",
    "MiniBatch",
    "PrunedUniformSampler",
    "Sampler",
    "UniformSampler",
    "inclusion_probabilities",
    "las_sets",
    "layer_probabilities",
    "modeled_loading_share",
    "modeled_loading_time",
    "parse_fanouts",
    "prune_thresholds",
]
