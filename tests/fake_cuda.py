"""Test doubles that let CPU tests walk gnnio's CUDA code paths (issue 15).

* :func:`fake_cuda` makes ``torch.cuda`` report devices (``is_available``, ``current_device``,
  ``device_count``) without any being there;
* :class:`FakeCudaTensor` is a CPU tensor that reports ``cuda:<index>`` as its device, the way a
  real CUDA tensor does (always with an index);
* :class:`FakeEvent` / :class:`FakeStream` stand in for ``torch.cuda.Event`` / ``Stream`` and log
  what was recorded, waited on and synchronized, into a shared list.

Nothing here moves a byte to a GPU: these doubles check *which* device names, events and waits
gnnio's code uses; the ``gpu``-marked tests check the real thing.
"""

from __future__ import annotations

import contextlib

import torch


class FakeCudaTensor(torch.Tensor):
    """A CPU tensor whose ``device`` says ``cuda:0`` (set ``fake_index`` for another index)."""

    fake_index = 0

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cuda", self.fake_index)

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True


def fake_cuda(monkeypatch, current: int = 0, count: int = 2) -> None:
    """``torch.cuda`` reports ``count`` devices, ``current`` the current one."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "device", lambda dev=None: contextlib.nullcontext())


class FakeStream:
    """A named stream; records nothing itself."""

    def __init__(self, name: str = "default") -> None:
        import zlib

        self.name = name
        # like torch's handle: the same stream gives the same number, whichever object asks
        self.cuda_stream = zlib.crc32(name.encode())

    def __repr__(self) -> str:
        return f"FakeStream({self.name})"


class FakeEvent:
    """``torch.cuda.Event`` stand-in: ``record`` / ``synchronize`` / ``query`` / ``elapsed_time``
    append ``(action, event id, stream)`` to ``log``; ``elapsed_time`` is 1 ms per event id step."""

    log: list = []
    _next = 0
    synced_upto = 0  # events complete in order (one stream): a synchronize completes the earlier

    def __init__(self, enable_timing: bool = False, **_kw) -> None:
        FakeEvent._next += 1
        self.id = FakeEvent._next
        self.enable_timing = enable_timing
        self.recorded = False
        self.done = False

    def record(self, stream=None) -> None:
        self.recorded = True
        FakeEvent.log.append(("record", self.id, getattr(stream, "name", None)))

    def synchronize(self) -> None:
        self.done = True
        FakeEvent.synced_upto = max(FakeEvent.synced_upto, self.id)
        FakeEvent.log.append(("synchronize", self.id, None))

    def query(self) -> bool:
        return self.done or self.id <= FakeEvent.synced_upto

    def elapsed_time(self, end: FakeEvent) -> float:
        if not end.query():
            raise RuntimeError("elapsed_time before the end event completed")
        return float(end.id - self.id)


def fake_events(monkeypatch) -> list:
    """Replace ``torch.cuda.Event`` / ``current_stream`` with the fakes; forbid device-wide
    ``torch.cuda.synchronize``. Returns the shared log."""
    FakeEvent.log = []
    FakeEvent.synced_upto = FakeEvent._next
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: FakeStream("current"))

    def no_device_sync(device=None):
        raise AssertionError("torch.cuda.synchronize(): a device-wide sync cancels the overlap")

    monkeypatch.setattr(torch.cuda, "synchronize", no_device_sync)
    return FakeEvent.log


class FakeCudaRuntime:
    """``cudaHostRegister`` / ``cudaHostUnregister`` over address ranges, for :mod:`gnnio.features.tiers.uva`.

    ``calls`` records every call as ``(name, ptr, nbytes or None)``; ``log`` (default: ``calls``)
    receives the same entries, so a test can interleave them with :func:`fake_events`' log.
    ``fail_at``: the register call (0-based) that fails with ``cudaErrorMemoryAllocation``."""

    def __init__(self, log: list | None = None, fail_at: int | None = None) -> None:
        self.ranges: list[tuple[int, int]] = []
        self.calls: list[tuple[str, int, int | None]] = []
        self.log = self.calls if log is None else log
        self.fail_at = fail_at

    def _record(self, entry: tuple) -> None:
        self.calls.append(entry)
        if self.log is not self.calls:
            self.log.append(entry)

    def cudaHostRegister(self, ptr, nbytes, flags):  # noqa: N802 - CUDA's name
        n = sum(1 for c in self.calls if c[0] == "register")
        self._record(("register", ptr, nbytes))
        if n == self.fail_at:
            return 2  # cudaErrorMemoryAllocation
        self.ranges.append((ptr, ptr + nbytes))
        return 0

    def cudaHostUnregister(self, ptr):  # noqa: N802
        self._record(("unregister", ptr, None))
        self.ranges = [r for r in self.ranges if r[0] != ptr]
        return 0

    def pinned(self, t: torch.Tensor) -> bool:
        p = t.data_ptr()
        return any(a <= p < b for a, b in self.ranges)


def install_runtime(monkeypatch, rt: FakeCudaRuntime) -> FakeCudaRuntime:
    """Make ``uva`` register through ``rt``, ``Tensor.is_pinned`` ask it, and start with no
    registrations."""
    from gnnio.features.tiers import uva

    monkeypatch.setattr(uva, "_cudart", lambda: rt)
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self, device=None: rt.pinned(self))
    monkeypatch.setattr(uva, "_registrations", {})
    return rt


def record_sampler_builds(monkeypatch, name: str, second: str) -> dict:
    """:func:`fake_cuda` with 1 GiB of 2 free, and ``gnnio.sampling.NAME`` replaced by a recorder
    of its builds: the dict returned holds the last build's keyword arguments and its second
    positional one under ``second`` (``sizes``, ``fanouts``) -- what ``gnnio.train``'s
    ``build_sampler`` asked for, nothing sampled."""
    import gnnio.sampling

    fake_cuda(monkeypatch)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev=None: (1 << 30, 1 << 31))
    built: dict = {}

    class Recorder:
        def __init__(self, graph, arg, **kw):
            built.clear()
            built.update(kw)
            built[second] = arg

    monkeypatch.setattr(gnnio.sampling, name, Recorder)
    return built
