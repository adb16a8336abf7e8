"""One optimisation step, eager (:func:`train_step`): what :func:`gnnio.train.train` runs per
batch, ``gnnio bench step`` times, and :class:`gnnio.train.graphed.GraphedStep` falls back to.
It reads nothing back to the host: the loop sums losses and accuracy on the device."""

from __future__ import annotations

import torch.nn.functional as F

__all__ = ["train_step"]


def train_step(net, opt, batch, timer=None):
    """One optimisation step on ``batch``: forward, cross-entropy (labels ``-1`` ignored: the
    mean over the labelled seeds, 0 with gradients 0 for a batch without one, where PyTorch's
    mean would be NaN -- a train split may hold unlabelled nodes), backward, optimizer step.
    Reads nothing back to the host. Returns ``(logits, loss)`` (detached). ``timer``: brackets
    the step (:class:`~gnnio.train.timing.ComputeTimer`)."""
    if timer is not None:
        timer.start()
    logits = net(batch.x, batch.blocks)
    y = batch.labels
    # the sum over the labelled seeds by their count: PyTorch's mean bit for bit (its sum, then
    # one division), and 0 / 1 rather than 0 / 0 for a batch of unlabelled seeds only
    labelled = (y >= 0).sum().clamp_min(1)
    loss = F.cross_entropy(logits, y, ignore_index=-1, reduction="sum") / labelled
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if timer is not None:
        timer.stop()
    return logits.detach(), loss.detach()
