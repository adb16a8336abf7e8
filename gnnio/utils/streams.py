"""The stream and event operations of the loader (and of the stores that hand rows across
streams), behind one small interface.

Why an interface: the loader's stages run on their own CUDA streams (sampling workers, the gather
and copy side stream, the consumer's stream) and hand tensors across them. A missing
``wait_event`` between two streams gives wrong rows or a device assert, silently, and only on a
GPU. So the loader speaks to streams only through the operations below, and
:class:`RecordingStreams` implements them on the CPU with the ordering rules of CUDA, so a CPU test
fails when a stage reads what another stream wrote without waiting for it (or the host overwrites
a staging buffer a queued copy still reads).

Operations (``stream`` arguments default to the calling thread's current stream):

* ``new_stream(name)`` / ``current()`` / ``use(stream)``: make a stream, the current one, and a
  context that makes ``stream`` current in this thread (``torch.cuda.stream``);
* ``record(stream, timing)`` -> event: marks everything queued on ``stream`` so far;
* ``wait(stream, event)``: work queued on ``stream`` afterwards starts after ``event``;
* ``synchronize(event)``: the host blocks until ``event`` has happened (only that stream, never the
  whole device);
* ``elapsed_s(start, end)``: seconds between two timing events (after ``end`` has happened);
* ``adopt(tensors, stream)``: tensors made on another stream are now used on ``stream``, so the
  caching allocator must not hand their memory out until ``stream``'s work is done
  (``Tensor.record_stream``; GraphBolt does the same when a tensor crosses streams);
* ``to_device(batch, device)``: an asynchronous copy of a batch, queued on the current stream;
* ``produce(*tensors)`` / ``check_read(*tensors)``: declarations that the current stream writes /
  reads these tensors; no-ops on CUDA, checked by :class:`RecordingStreams`.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any, TypeGuard

import torch

from .capture import capture_stream

__all__ = ["CudaStreams", "RecordingStreams", "StreamOrderError", "batch_tensors"]


def batch_tensors(mb: Any) -> list[torch.Tensor]:
    """Every tensor a :class:`~gnnio.sampling.base.MiniBatch` holds (seeds, input nodes, features,
    labels, block edges/weights/CSR pointers: a ``ptr`` made apart from the edges -- the CPU
    sampler's, copied up; a GPU fallback's -- is memory of its own that a consumer must adopt)."""
    out = [mb.seeds, mb.input_nodes, mb.x, mb.labels]
    for b in mb.blocks:
        out += [b.edge_index, b.edge_weight, b.ptr]
    return [t for t in out if t is not None]


class CudaStreams:
    """The real operations, on CUDA device ``device``."""

    timing = True  # events measure device time

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def new_stream(self, name: str = "") -> torch.cuda.Stream:  # noqa: ARG002 - names are for fakes
        """A stream from torch's pool, never the one CUDA graphs are captured on (torch hands
        its 32 pool streams out in turn: :func:`gnnio.utils.capture.capture_stream`)."""
        avoid = capture_stream(self.device)
        s = torch.cuda.Stream(self.device)
        while s == avoid:
            s = torch.cuda.Stream(self.device)
        return s

    def current(self) -> torch.cuda.Stream:
        return torch.cuda.current_stream(self.device)

    def use(self, stream) -> contextlib.AbstractContextManager:
        return torch.cuda.stream(stream)  # also makes the stream's device current in this thread

    def record(self, stream=None, timing: bool = False) -> torch.cuda.Event:
        ev = torch.cuda.Event(enable_timing=timing)
        ev.record(stream if stream is not None else self.current())
        return ev

    def wait(self, stream, event) -> None:
        stream.wait_event(event)

    def synchronize(self, event) -> None:
        event.synchronize()

    def elapsed_s(self, start, end) -> float:
        return start.elapsed_time(end) / 1e3

    def adopt(self, tensors: Iterable[torch.Tensor], stream) -> None:
        for t in tensors:
            if t is not None and t.is_cuda:
                t.record_stream(stream)

    def to_device(self, mb: Any, device: torch.device) -> Any:
        return mb.to(device, non_blocking=True)

    # declarations for RecordingStreams; nothing to do on a real device
    def produce(self, *tensors: torch.Tensor) -> None:
        pass

    def check_read(self, *tensors: torch.Tensor, what: str = "") -> None:
        pass


class StreamOrderError(AssertionError):
    """A stage used data another stream (or the host) had not finished with: a missing wait."""


class _Stream:
    """A fake stream: a name and a vector clock (how far it has seen each stream's work)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.vc: dict[str, int] = {name: 0}

    def __repr__(self) -> str:
        return f"stream({self.name})"


class _Event:
    def __init__(self, stream: str, vc: dict[str, int]) -> None:
        self.stream = stream
        self.vc = dict(vc)


def _merge(into: dict[str, int], other: dict[str, int]) -> None:
    for k, v in other.items():
        if into.get(k, 0) < v:
            into[k] = v


def _key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _tracked(t: torch.Tensor | None) -> TypeGuard[torch.Tensor]:
    return t is not None and t.numel() > 0  # empty tensors share address 0: nothing to order


class RecordingStreams:
    """CUDA's stream ordering rules, kept on the CPU, for tests (see the module docstring).

    Every stream has a vector clock; each operation queued on a stream advances its own entry,
    an event snapshots the clock, ``wait`` merges the event into the waiting stream's clock and
    ``synchronize`` into the host's. Test doubles declare what they touch:

    * :meth:`produce`: the current stream writes these tensors (a sampler's output, for example);
    * :meth:`check_read`: the current stream reads them; raises :class:`StreamOrderError` unless it
      has seen the write (same stream, or a wait on an event recorded after it);
    * :meth:`check_host_write`: the host is about to overwrite a tensor; raises unless every queued
      device read of it (a copy out of a staging slot) has been synchronized.

    ``to_device`` "copies" by cloning, queued on the current stream: it reads the source and
    writes the clone. ``log`` lists ``(operation, stream, detail)`` in order; ``violations`` the
    messages raised. Written tensors are kept alive, so their addresses are never reused.
    """

    timing = False

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tls = threading.local()
        self._ids = itertools.count()
        self.default = _Stream("default")
        self.host: dict[str, int] = {}
        self._writes: dict[int, tuple[str, int, torch.Tensor]] = {}
        self._reads: dict[int, list[tuple[str, int]]] = {}
        self.log: list[tuple[str, str, str]] = []
        self.violations: list[str] = []

    # ---- the interface the loader uses ---------------------------------------------------------
    def new_stream(self, name: str = "") -> _Stream:
        return _Stream(f"{name or 'stream'}#{next(self._ids)}")

    def current(self) -> _Stream:
        return getattr(self._tls, "stream", self.default)

    @contextlib.contextmanager
    def use(self, stream: _Stream) -> Iterator[None]:
        prev = self.current()
        self._tls.stream = stream
        try:
            yield
        finally:
            self._tls.stream = prev

    def record(self, stream: _Stream | None = None, timing: bool = False) -> _Event:  # noqa: ARG002
        s = stream if stream is not None else self.current()
        with self._lock:
            self.log.append(("record", s.name, ""))
            return _Event(s.name, s.vc)

    def wait(self, stream: _Stream, event: _Event) -> None:
        with self._lock:
            _merge(stream.vc, event.vc)
            self.log.append(("wait", stream.name, event.stream))

    def synchronize(self, event: _Event) -> None:
        with self._lock:
            _merge(self.host, event.vc)
            self.log.append(("synchronize", "host", event.stream))

    def elapsed_s(self, start: _Event, end: _Event) -> float:  # noqa: ARG002
        return 0.0

    def adopt(self, tensors: Iterable[torch.Tensor], stream: _Stream) -> None:
        with self._lock:
            self.log.append(("adopt", stream.name, str(sum(1 for _ in tensors))))

    def to_device(self, mb: Any, device: torch.device) -> Any:  # noqa: ARG002
        s = self.current()
        srcs = batch_tensors(mb)
        self.check_read(*srcs)
        with self._lock:
            pos = self._enqueue(s)
            for t in filter(_tracked, srcs):
                self._reads.setdefault(_key(t), []).append((s.name, pos))
            self.log.append(("copy", s.name, f"{len(srcs)} tensors"))
        x = None if mb.x is None else mb.x.clone()
        moved = replace(mb, x=x, meta=dict(mb.meta))
        if _tracked(x):
            self._mark_written(s, pos, x)
        return moved

    # ---- what test doubles declare ---------------------------------------------------------------
    def produce(self, *tensors: torch.Tensor) -> None:
        """The current stream writes ``tensors`` (queued work, e.g. a GPU sampler's kernels)."""
        s = self.current()
        with self._lock:
            pos = self._enqueue(s)
            self.log.append(("produce", s.name, str(len(tensors))))
        for t in filter(_tracked, tensors):
            self._mark_written(s, pos, t)

    def check_read(self, *tensors: torch.Tensor, what: str = "a tensor") -> None:
        """The current stream reads ``tensors``: it must have seen their last write."""
        s = self.current()
        with self._lock:
            for t in tensors:
                if not _tracked(t):
                    continue
                w = self._writes.get(_key(t))
                if w is not None and w[0] != s.name and s.vc.get(w[0], 0) < w[1]:
                    self._fail(f"{s.name} reads {what} written on {w[0]} without waiting for it")

    def check_host_write(self, t: torch.Tensor, what: str = "a buffer") -> None:
        """The host overwrites ``t``: every queued device read of it must be synchronized."""
        if not _tracked(t):
            return
        with self._lock:
            for stream, pos in self._reads.get(_key(t), []):
                if self.host.get(stream, 0) < pos:
                    self._fail(
                        f"the host overwrites {what} that a copy queued on {stream} still reads"
                    )

    # ---- internals ---------------------------------------------------------------------------
    def _enqueue(self, s: _Stream) -> int:
        s.vc[s.name] = s.vc.get(s.name, 0) + 1
        return s.vc[s.name]

    def _mark_written(self, s: _Stream, pos: int, t: torch.Tensor) -> None:
        with self._lock:
            self._writes[_key(t)] = (s.name, pos, t)
            self._reads.pop(_key(t), None)

    def _fail(self, msg: str) -> None:
        self.violations.append(msg)
        raise StreamOrderError(msg)


def streams_for(*devices: Any) -> CudaStreams | None:
    """:class:`CudaStreams` on the first CUDA device among ``devices``, or None when none is."""
    for d in devices:
        if d is not None and torch.device(d).type == "cuda":
            return CudaStreams(torch.device(d))
    return None
