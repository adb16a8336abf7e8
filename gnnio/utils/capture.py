"""CUDA graph captures and device-wide waits, kept apart across threads.

gnnio captures CUDA graphs on two threads: the training step on the main thread
(:mod:`gnnio.train.graphed`) and the GPU sampler's batch on a loader thread
(:mod:`gnnio.sampling.gpu_graphed`). Three rules of CUDA and torch bind them:

* ``cudaDeviceSynchronize`` (``torch.cuda.synchronize``) from *any* thread breaks a capture
  underway in another, whatever the capture mode (the other thread's call fails too: NVIDIA's
  TensorRT#2888, llama.cpp#14033), and ``torch.cuda.graph`` itself begins with one;
* torch supports one capture underway at a time in a process (its RNG capture state is global:
  pytorch#137844);
* destroying a graph beside another thread's capture can fail as well (pytorch#176754 guards
  torch's own destructor for that reason).

So every capture (:func:`capture`), every device-wide wait in gnnio's training path
(:func:`device_sync`) and the sampler's dropping of an evicted buffer set's graph hold one
process-wide lock. A capture is rare (once per buffer set and the step's one; its length not
yet timed on a GPU) and the waits are at epoch ends and in benchmarks, so nobody waits long. Stream
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

__all__ = ["CAPTURE_LOCK", "capture", "capture_stream", "capturing", "device_sync"]

#: held by a capture and by gnnio's device-wide waits (module docstring)
CAPTURE_LOCK = threading.Lock()
_LOCAL = threading.local()  # .on: this thread is inside capture()


def capturing() -> bool:
    """Whether this thread is inside :func:`capture` (module docstring)."""
    return getattr(_LOCAL, "on", False)


_STREAMS: dict[int, torch.cuda.Stream] = {}  # device index -> the stream captures run on
_STREAMS_LOCK = threading.Lock()


def capture_stream(device) -> torch.cuda.Stream:
    """The stream gnnio captures on, one per device, made at the first call. Why one, kept:
    ``torch.cuda.Stream()`` hands out torch's pool of 32 streams in turn, so after 32 a new one
    is a stream someone already uses -- a loader's sampling or gather stream, whose work would
    then be queued into the capture (lost from its batch, or the capture invalidated). gnnio's
    own streams (:meth:`gnnio.utils.streams.CudaStreams.new_stream`) skip this one, and captures
    take turns on it (:data:`CAPTURE_LOCK`)."""
    d = torch.device(device)
    idx = d.index if d.index is not None else torch.cuda.current_device()
    with _STREAMS_LOCK:
        s = _STREAMS.get(idx)
        if s is None:
            s = _STREAMS[idx] = torch.cuda.Stream(torch.device("cuda", idx))
        return s


def device_sync(device) -> None:
    """``torch.cuda.synchronize(device)``, never while a capture is underway in this process."""
    with CAPTURE_LOCK:
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def capture(graph, device) -> Iterator[None]:
    """Capture the block's work on ``device`` into ``graph`` (``torch.cuda.CUDAGraph``): on
    :func:`capture_stream`, which no other gnnio thread queues work on, thread-local (the other
    threads' own calls go on), with the lock held (module docstring)."""
    with CAPTURE_LOCK:
        side = capture_stream(device)
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
