"""The data-parallel model's side of a run: a communication hook that counts the gradient bytes
handed to all-reduce (and times each bucket), and a digest of the parameters to check that every
rank holds the same model."""

from __future__ import annotations

import time

import torch

__all__ = ["GradCounter", "counting_allreduce", "param_digest"]


def param_digest(model: torch.nn.Module) -> str:
    """sha256 of a model's parameters and buffers, in ``state_dict`` order (bit-exact)."""
    import hashlib

    h = hashlib.sha256()
    for k, v in model.state_dict().items():
        h.update(k.encode())
        h.update(v.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class GradCounter:
    """State of the DDP communication hook: gradient bytes handed to all-reduce, and seconds
    from each bucket's hand-off to its future's completion, host time (buckets overlap, so the
    sum can exceed the backward time). On gloo that is the all-reduce's end. On NCCL the future
    completes, and its callback runs, as soon as later work can be ordered after the collective
    on a stream, not when the collective has run (PyTorch's CUDA-aware futures): there the
    seconds are the hand-off's, and the collective's own time would need CUDA events (not
    measured yet: the NCCL path has not run on a GPU)."""

    def __init__(self, world_size: int, ctx=None) -> None:
        self.world_size = world_size
        self.ctx = ctx  # the rank context, through which the all-reduce is issued
        self.bytes = 0
        self.seconds = 0.0


def counting_allreduce(state: GradCounter, bucket):
    buf = bucket.buffer()
    state.bytes += buf.numel() * buf.element_size()
    t0 = time.perf_counter()
    buf.div_(state.world_size)
    if state.ctx is not None:  # the default group: DDP's own (gnnio.distributed.context)
        fut = state.ctx.all_reduce(buf, group="default", async_op=True).get_future()
    else:
        import torch.distributed as dist

        fut = dist.all_reduce(buf, async_op=True).get_future()

    def done(f):
        state.seconds += time.perf_counter() - t0
        return f.value()[0]

    return fut.then(done)
