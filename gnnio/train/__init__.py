"""Training: configuration, the store/sampler/order factories, the epoch loop, evaluation and the
run summary; GNN models in :mod:`.models`, the embedded default dataset in :mod:`.defaults`."""

from __future__ import annotations

from .loop import (
    TrainConfig,
    check_device,
    evaluate_full,
    evaluate_sampled,
    load_checkpoint,
    make_node_loader,
    train,
)

__all__ = [
    "TrainConfig",
    "check_device",
    "evaluate_full",
    "evaluate_sampled",
    "load_checkpoint",
    "make_node_loader",
    "train",
]
