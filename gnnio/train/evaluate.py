"""Evaluation of a model during training: the loaders over the evaluation splits, accuracy on
sampled neighbourhoods (:func:`evaluate_sampled`) or by exact full-neighbour inference
(:func:`evaluate_full`), and reading back a checkpoint."""

from __future__ import annotations

import os

import numpy as np
import torch

from ..graph.dataset import Dataset
from ..utils.progress import bar
from .models import BlockGNN

__all__ = [
    "evaluate_full",
    "evaluate_sampled",
    "evaluate_sampled_counts",
    "load_checkpoint",
    "make_node_loader",
]


def make_node_loader(
    sampler, store, seeds, labels, batch_size, seed, device, prefetch=2, order=None,
    stall_timeout=None, ring=None,
):  # fmt: skip
    """A :class:`gnnio.pipeline.loader.NodeLoader` over ``seeds`` (global ids) in ``order`` (a
    :class:`~gnnio.ordering.shuffle.SeedOrder`; None = a seeded random order of ``seeds``);
    ``stall_timeout``: seconds without a batch before the run ends naming the stuck stage;
    ``ring``: a :class:`~gnnio.pipeline.loader.BufferRing` shared with loaders run at other
    times."""
    from ..ordering import RandomOrder
    from ..pipeline.loader import NodeLoader

    if order is None:
        order = RandomOrder(
            torch.from_numpy(np.asarray(seeds, dtype=np.int64)), batch_size, seed=seed
        )
    return NodeLoader(sampler, store, order, labels=labels, device=device, prefetch=prefetch,
                      stall_timeout=stall_timeout, ring=ring)  # fmt: skip


def evaluate_sampled(model: BlockGNN, loader, epoch: int = 0, progress: str | None = None) -> float:
    """Accuracy of ``model`` over every seed of ``loader`` (sampled neighbourhoods); ``epoch``
    selects the loader's epoch, i.e. the seed order and the sampler's random stream, so the same
    ``(loader seeds, epoch)`` gives the same batches again; ``progress``: a bar's title (None:
    no bar)."""
    correct, total = evaluate_sampled_counts(model, loader, epoch, progress)
    return correct / max(total, 1)


@torch.no_grad()
def evaluate_sampled_counts(
    model: BlockGNN, loader, epoch: int = 0, progress: str | None = None
) -> tuple[int, int]:
    """``(correct, labelled)`` predictions of ``model`` over ``loader``'s seeds (see
    :func:`evaluate_sampled`); ranks of a distributed run add these up."""
    was = model.training
    model.eval()
    correct = total = None  # summed on the batches' device, read once: no host sync per batch
    n = loader.order.num_batches if hasattr(loader, "order") else None
    pb = bar(n, progress or "", "batch", enabled=progress is not None)
    try:
        for batch in loader.epoch(epoch):
            pred = model(batch.x, batch.blocks).argmax(dim=1)
            y = batch.labels
            mask = y >= 0
            c, t = ((pred == y) & mask).sum(), mask.sum()
            correct = c if correct is None else correct + c
            total = t if total is None else total + t
            pb.update(1)
    finally:
        pb.close()
        model.train(was)
    if correct is None or total is None:  # (both set by the first batch)
        return 0, 0
    return int(correct), int(total)


def evaluate_full(
    model: BlockGNN,
    ds: Dataset,
    splits: dict[str, np.ndarray],
    chunk: int,
    device: torch.device,
    progress: bool,
) -> dict[str, float]:
    """Accuracy per split from exact layer-wise full-neighbour inference over all nodes."""
    logits = model.inference(
        ds.graph, ds.features, batch_size=chunk, device=device, progress=progress
    )
    pred = logits.argmax(dim=1).numpy()
    labels = np.asarray(ds.labels)
    out = {}
    for name, idx in splits.items():
        idx = np.asarray(idx, dtype=np.int64)
        y = labels[idx]
        m = y >= 0
        out[name] = float((pred[idx][m] == y[m]).mean()) if m.any() else 0.0
    return out


def load_checkpoint(path: str | os.PathLike, model: torch.nn.Module) -> torch.nn.Module:
    """Load a checkpoint written by :func:`train` into ``model`` (``weights_only=True``)."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state)
    return model
