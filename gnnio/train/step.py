"""One optimisation step, eager (:func:`train_step`): what :func:`gnnio.train.train` runs per
batch, ``gnnio bench step`` times, and :class:`gnnio.train.graphed.GraphedStep` falls back to.
It reads nothing back to the host: the loop sums losses and accuracy on the device."""

from __future__ import annotations

import torch.nn.functional as F

__all__ = ["train_step"]


def train_step(net, opt, batch, timer=None):
    """One optimisation step on ``batch``: forward, cross-entropy (labels ``-1`` ignored),
    backward, optimizer step. Reads nothing back to the host. Returns ``(logits, loss)``
    (detached). ``timer``: brackets the step (:class:`~gnnio.train.timing.ComputeTimer`)."""
    if timer is not None:
        timer.start()
    logits = net(batch.x, batch.blocks)
    loss = F.cross_entropy(logits, batch.labels, ignore_index=-1)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if timer is not None:
        timer.stop()
    return logits.detach(), loss.detach()
