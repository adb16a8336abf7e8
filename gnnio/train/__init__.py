"""Training: options (:mod:`.config`), the store/sampler/order factories (:mod:`.setup`), the epoch
loop (:mod:`.loop`), evaluation (:mod:`.evaluate`) and the run summary (:mod:`.summary`); GNN
models in :mod:`.models`, the embedded default dataset in :mod:`.defaults`."""

from __future__ import annotations

import importlib

from .config import TrainConfig, check_device

#: imported on first use: the epoch loop and the models bring in PyTorch Geometric (and with it
#: ``torch._dynamo``, ~2.5 s of CPU), which a ``gnnio train --nproc N`` launcher -- it only checks
#: the options and starts the ranks -- never needs
_LAZY = {
    "evaluate_full": ".evaluate",
    "evaluate_sampled": ".evaluate",
    "load_checkpoint": ".evaluate",
    "make_node_loader": ".evaluate",
    "train": ".loop",
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "TrainConfig",
    "check_device",
    "evaluate_full",
    "evaluate_sampled",
    "load_checkpoint",
    "make_node_loader",
    "train",
]
