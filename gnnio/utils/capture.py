"""CUDA graph captures and device-wide waits, kept apart across threads.

gnnio captures CUDA graphs on two threads: the training step on the main thread
(:mod:`gnnio.train.graphed`) and the GPU sampler's batch on a loader thread
(:mod:`gnnio.sampling.gpu_graphed`). Two rules of CUDA and torch bind them:

* ``cudaDeviceSynchronize`` (``torch.cuda.synchronize``) from *any* thread breaks a capture
  underway in another, whatever the capture mode (the other thread's call fails too: NVIDIA's
  TensorRT#2888, llama.cpp#14033), and ``torch.cuda.graph`` itself begins with one;
* torch supports one capture underway at a time in a process (its RNG capture state is global:
  pytorch#137844).

* destroying a graph beside another thread's capture can fail as well (pytorch#176754 guards
  torch's own destructor for that reason).

So every capture (:func:`capture`), every device-wide wait in gnnio's training path
(:func:`device_sync`) and the sampler's dropping of an evicted buffer set's graph hold one
process-wide lock. A capture is short (tens of milliseconds, once
per buffer set) and the waits are at epoch ends and in benchmarks, so nobody waits long. Stream
and event waits (``Event.synchronize``, ``.tolist()`` on one stream) do not break a capture in
another thread under ``capture_error_mode="thread_local"`` and take no lock.

Inside a capture nothing runs: an error raised there (a Triton launch refused while the stream
captures, a host read) is the capture's, not the kernel's. :func:`capturing` tells gnnio's
kernel fallbacks so (:func:`gnnio.utils.triton_kernels.kernel_failed` re-raises it): the capture
fails as a whole and its caller runs the batch eagerly, where the kernel is tried again, instead
of a torch fallback being captured and the kernel given up for the rest of the process.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

__all__ = ["CAPTURE_LOCK", "capture", "capturing", "device_sync"]

#: held by a capture and by gnnio's device-wide waits (module docstring)
CAPTURE_LOCK = threading.Lock()
_LOCAL = threading.local()  # .on: this thread is inside capture()


def capturing() -> bool:
    """Whether this thread is inside :func:`capture` (module docstring)."""
    return getattr(_LOCAL, "on", False)


def device_sync(device) -> None:
    """``torch.cuda.synchronize(device)``, never while a capture is underway in this process."""
    with CAPTURE_LOCK:
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def capture(graph, device) -> Iterator[None]:
    """Capture the block's work on ``device`` into ``graph`` (``torch.cuda.CUDAGraph``): on a
    stream of its own (torch's default capture stream is one per process), thread-local (the
    other threads' own calls go on), with the lock held (module docstring)."""
    with CAPTURE_LOCK:
        side = torch.cuda.Stream(device)
        prev, prev_dev = torch.cuda.current_stream(device), torch.cuda.current_device()
        _LOCAL.on = True
        try:
            with torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"):
                yield
        finally:
            _LOCAL.on = False
            # torch.cuda.graph's exit ends the capture, then leaves the stream: where ending
            # raises (an invalidated capture) ``side`` (and its device) stays current, and this
            # thread's eager fallback and every later batch would run there
            if torch.cuda.current_stream(device) != prev:
                torch.cuda.set_stream(prev)  # (sets the device too: set it back after)
                torch.cuda.set_device(prev_dev)
