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
  torch's own destructor for that reason);
* every capture registers torch's default CUDA generator, whose state is one per device, not
  one per thread (torch 2.11, the GPU image's): while any capture is underway, a random draw
  outside it -- an eager ``F.dropout`` on another thread, or the replay of a graph that draws
  (its prologue advances the generator) -- fails with "Offset increment outside graph capture
  encountered unexpectedly"; and the capture's prologue resets the generator's device-side
  seed and offset (which a graph's dropout kernels read) on the capture stream.

So every capture (:func:`capture`), every device-wide wait in gnnio's training path
(:func:`device_sync`), the sampler's dropping of an evicted buffer set's graph, every eager
random draw on a GPU in the training step (:func:`gnnio.train.dropout.dropout`) and the step
graph's replay hold one process-wide lock, reentrant (the step's capture runs its dropout), and
a capture waits for its stream before it lets go (its generator resets done before the next
replay sets them). A capture is rare (once per buffer set and the step's one; its length not
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


class _Lock:
    """A reentrant lock that tells whether some thread holds it (``RLock.locked`` is Python
    3.13's)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._depth = 0  # (changed by the holder only)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        ok = self._lock.acquire(blocking, timeout)
        if ok:
            self._depth += 1
        return ok

    def release(self) -> None:
        self._depth -= 1
        self._lock.release()

    def locked(self) -> bool:
        """Whether a thread holds it (this one or another)."""
        return self._depth > 0

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


#: held by a capture, by gnnio's device-wide waits, eager GPU random draws and the step graph's
#: replay (module docstring)
CAPTURE_LOCK = _Lock()
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
            side.synchronize()  # the generator's resets (capture prologue) done: see above
        finally:
            _LOCAL.on = False
            # torch.cuda.graph's exit ends the capture, then leaves the stream: where ending
            # raises (an invalidated capture) ``side`` (and its device) stays current, and this
            # thread's eager fallback and every later batch would run there
            if torch.cuda.current_stream(device) != prev:
                torch.cuda.set_stream(prev)  # (sets the device too: set it back after)
                torch.cuda.set_device(prev_dev)
