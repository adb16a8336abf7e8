"""One optimisation step, eager (:func:`train_step`): what :func:`gnnio.train.train` runs per
batch, ``gnnio bench step`` times, and :class:`gnnio.train.graphed.GraphedStep` falls back to.
It reads nothing back to the host: the loop sums losses and accuracy on the device."""

from __future__ import annotations

import torch.nn.functional as F

__all__ = ["seed_loss", "train_step"]


def seed_loss(logits, y):
    """``(loss, labelled, count)``: cross-entropy over the seeds labelled ``>= 0`` (``labelled``
    their mask, ``count`` its sum), the sum over them by their count -- PyTorch's mean bit for bit
    (its sum, then one division), and 0 / 1 rather than 0 / 0 for a batch of unlabelled seeds only
    (a train split may hold unlabelled nodes; padded rows of a graphed step are labelled -1)."""
    lab = y >= 0
    n = lab.sum()
    return F.cross_entropy(logits, y, ignore_index=-1, reduction="sum") / n.clamp_min(1), lab, n


def train_step(net, opt, batch, timer=None):
    """One optimisation step on ``batch``: forward, cross-entropy (labels ``-1`` ignored: the
    mean over the labelled seeds, 0 with gradients 0 for a batch without one, where PyTorch's
    mean would be NaN -- a train split may hold unlabelled nodes), backward, optimizer step.
    Reads nothing back to the host. Returns ``(logits, loss)`` (detached). ``timer``: brackets
    the step (:class:`~gnnio.train.timing.ComputeTimer`)."""
    if timer is not None:
        timer.start()
    logits = net(batch.x, batch.blocks)
    loss = seed_loss(logits, batch.labels)[0]
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if timer is not None:
        timer.stop()
    return logits.detach(), loss.detach()
