"""The names :mod:`.models` builds and its normalisations, apart from the models so that checking
``gnnio train``'s options (:mod:`.config`, a ``--nproc`` launcher) does not import PyTorch
Geometric (and ``torch._dynamo`` with it: ~2.5 s of CPU per process)."""

from __future__ import annotations

__all__ = ["EDGE_WEIGHT_NORMS", "FEATURE_NORMS", "MODELS"]

MODELS = ("sage", "gcn", "gat", "gin")
FEATURE_NORMS = ("none", "row")
EDGE_WEIGHT_NORMS = ("mean", "sum")
