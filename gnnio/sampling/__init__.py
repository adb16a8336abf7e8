"""Neighbour sampling: the contract in :mod:`.base`, strategies beside it.

* :class:`UniformSampler` -- GraphSAGE node-wise uniform sampling with per-hop fanouts (numba on
  CPU, vectorized torch on CUDA); :func:`reference.sample_reference` is its plain-Python twin.
"""

from .base import Block, MiniBatch, Sampler
from .uniform import UniformSampler, parse_fanouts

__all__ = ["Block", "MiniBatch", "Sampler", "UniformSampler", "parse_fanouts"]
