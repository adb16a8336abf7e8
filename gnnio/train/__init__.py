"""Training: options (:mod:`.config`), the store/sampler/order factories (:mod:`.setup`), the epoch
loop (:mod:`.loop`), evaluation (:mod:`.evaluate`) and the run summary (:mod:`.summary`); GNN
models in :mod:`.models`, the embedded default dataset in :mod:`.defaults`."""

from __future__ import annotations

from .config import TrainConfig, check_device
from .evaluate import evaluate_full, evaluate_sampled, load_checkpoint, make_node_loader
from .loop import train

__all__ = [
    "TrainConfig",
    "check_device",
    "evaluate_full",
    "evaluate_sampled",
    "load_checkpoint",
    "make_node_loader",
    "train",
]
