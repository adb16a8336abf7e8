"""Zero-copy (UVA) reads of pinned host memory by GPU kernels.

Why (Data Tiering, Min et al., §4.1): cold feature rows are small scattered reads (512 B-4 KB).
Gathering them on the CPU and then copying the packed batch with the DMA engine costs CPU memory
bandwidth, a staging buffer and a CPU-GPU synchronisation per batch. With zero-copy access the GPU's
own gather kernel dereferences host addresses and each row crosses PCIe directly, with no CPU in the
data path (DGL's ``UnifiedTensor`` does the same).

How, in three steps, all through the CUDA runtime that PyTorch ships (``torch.cuda.cudart()``):

1. **pin** (:func:`pin_host_tensor`): ``cudaHostRegister(ptr, nbytes, Portable | Mapped)``
   page-locks the tensor's existing host allocation *in place* (no copy, no second buffer) and maps
   it into the GPU address space. With unified virtual addressing (every 64-bit CUDA system) the
   device address of a registered host page equals its host address, so no
   ``cudaHostGetDevicePointer`` call is needed.
2. **view** (:func:`device_view`): the host address is wrapped in a tiny object exposing
   ``__cuda_array_interface__`` and handed to ``torch.as_tensor``, which builds a CUDA tensor that
   *aliases* the host memory (PyTorch asks ``cudaPointerGetAttributes`` which device the pointer
   belongs to; registered host memory answers with the device that was current at registration).
3. **read**: ``view.index_select(0, ids)`` is PyTorch's ordinary GPU gather kernel; its loads from
   the view travel over PCIe to host memory.

Failure modes handled here (seen in DGL and Quiver issue trackers): registering a very large or a
shared-memory (``/dev/shm``) tensor can fail; a zero-byte registration is rejected by CUDA
(``cudaErrorInvalidValue``); a failed runtime call stays the runtime's "last error" and would be
reported by PyTorch's check after its *next* kernel launch; unregistering memory that another user
still reads breaks them, and freeing memory without unregistering it makes the next registration of
the same pages fail ("already mapped"). Hence: :class:`PinError` with a one-line message naming the
size and the host limits, a refusal of zero-byte pins, :func:`clear_last_cuda_error` after a
failure, and reference-counted registrations released by a finalizer that holds the tensor alive.

Large and repeated pins (dgl#3939, dgl#4237, pytorch#152335: big pins failing with "invalid
argument" or "operation not supported", and page-locked memory outliving a failure): one
``cudaHostRegister`` call is refused by some drivers above a size (2-4 GiB on some, 512 GiB on
all), so a range is registered in adjacent chunks of :data:`REGISTER_CHUNK` bytes (with UVA the
device addresses of adjacent registrations are adjacent too, so one view spans them), and a
failed chunk unregisters the ones before it. Before any call, the request is checked against the
pinned-memory budget (:func:`pin_limit`: ``GNNIO_PIN_LIMIT`` or 90 % of host RAM, less what gnnio
has pinned already): page-locked memory cannot be swapped or reclaimed, so over-pinning stalls
the whole machine rather than failing cleanly. The error names the size and the limit.

Registrations are address *ranges*: a pin request inside a registered range shares it, one that
only overlaps a registered range is refused (CUDA cannot register the rest, and a larger tensor at
the same address must not pass as registered because its first page is). Readers note their
queued reads (:meth:`PinnedHost.note_use`: an event on the reading stream), and the last release
waits for those events, only them, before ``cudaHostUnregister``: a zero-copy gather still queued
when a store is closed (or collected) reads memory that is still mapped.

Everything here needs CUDA; :mod:`gnnio.features.tiers.simdevice` provides the simulated stand-ins used on
machines without a GPU.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

import torch

from ...errors import GnnioError
from ...utils.devices import resolve_device

__all__ = [
    "PinError",
    "PinnedHost",
    "clear_last_cuda_error",
    "cuda_available",
    "device_view",
    "format_bytes",
    "host_memory_limits",
    "nbytes_of",
    "pin_host_tensor",
    "pin_limit",
    "pinned_bytes",
]

# cudaHostRegister flags (cuda_runtime_api.h). With UVA, Default already means mapped + portable;
# we spell both out so the intent is visible and the same call also works without UVA.
CUDA_HOST_REGISTER_PORTABLE = 0x01  # usable from every CUDA context / device
CUDA_HOST_REGISTER_MAPPED = 0x02  # mapped into the device address space (zero-copy reads)
#: bytes registered per cudaHostRegister call (module docstring)
REGISTER_CHUNK = 1 << 30
#: share of host RAM gnnio pins at most unless GNNIO_PIN_LIMIT says otherwise
PIN_RAM_SHARE = 0.9
_UNITS = {"": 1, "b": 1, "k": 2**10, "kib": 2**10, "m": 2**20, "mib": 2**20, "g": 2**30,
          "gib": 2**30, "t": 2**40, "tib": 2**40}  # fmt: skip


class PinError(GnnioError):
    """Page-locking (pinning) host memory for zero-copy reads failed. One-line message naming the
    size asked for and the host's memory limits."""


def cuda_available() -> bool:
    """True when PyTorch was built with CUDA and sees at least one device."""
    return torch.cuda.is_available()


def nbytes_of(t: torch.Tensor) -> int:
    """Bytes spanned by a tensor's elements (``numel * element_size``)."""
    return int(t.numel()) * int(t.element_size())


def format_bytes(n: int | float) -> str:
    """``1536 -> '1.50 KiB'`` (binary units, two decimals; plain bytes below 1 KiB)."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _meminfo() -> dict[str, int]:
    """``/proc/meminfo`` as bytes (Linux); empty elsewhere."""
    out: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if parts and parts[0].isdigit():
                    out[key] = int(parts[0]) * (1024 if len(parts) > 1 else 1)
    except OSError:
        pass
    return out


def host_memory_limits(t: torch.Tensor | None = None) -> str:
    """One line describing the limits a pin request runs into: host RAM available / total, and for
    a tensor in shared memory the free space of ``/dev/shm`` (a too-small ``/dev/shm`` makes
    registration of shared tensors fail, quiver#102)."""
    info = _meminfo()
    parts = []
    if "MemTotal" in info:
        avail = info.get("MemAvailable", info.get("MemFree", 0))
        parts.append(
            f"host RAM available {format_bytes(avail)} of {format_bytes(info['MemTotal'])}"
        )
    else:
        parts.append("host RAM size unknown")
    if t is not None and t.is_shared():
        try:
            st = os.statvfs("/dev/shm")
            free, total = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
            parts.append(
                f"tensor is in shared memory, /dev/shm free {format_bytes(free)} of {format_bytes(total)}"
            )
        except OSError:
            parts.append("tensor is in shared memory")
    return ", ".join(parts)


def pin_limit() -> tuple[int | None, str]:
    """``(bytes, where the figure comes from)``: the most host memory gnnio keeps pinned at
    once. ``GNNIO_PIN_LIMIT`` (bytes, or with a unit: ``512MiB``, ``8G``) when set, else
    :data:`PIN_RAM_SHARE` of host RAM; ``(None, ...)`` when RAM size is unknown (no check)."""
    import re

    env = os.environ.get("GNNIO_PIN_LIMIT")
    if env:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", env)
        size = (
            float(m.group(1)) * _UNITS[m.group(2).lower()]
            if m and m.group(2).lower() in _UNITS
            else -1
        )
        if not 0 <= size <= 2**60:  # (1e400 reads as infinity)
            raise PinError(f"GNNIO_PIN_LIMIT: not a size in bytes (e.g. 8GiB, 1e9): {env!r}")
        return int(size), "GNNIO_PIN_LIMIT"
    total = _meminfo().get("MemTotal")
    if total is None:
        return None, "host RAM size unknown"
    return int(total * PIN_RAM_SHARE), f"{PIN_RAM_SHARE:.0%} of host RAM {format_bytes(total)}"


def pinned_bytes() -> int:
    """Bytes gnnio holds registered (pinned) now, over all its registrations."""
    with _lock:
        return sum(r.nbytes for r in _registrations.values())


def _check_budget(nbytes: int, t: torch.Tensor) -> None:
    """PinError naming the size and the limit when pinning ``nbytes`` more goes past
    :func:`pin_limit` (called with ``_lock`` held)."""
    limit, where = pin_limit()
    held = sum(r.nbytes for r in _registrations.values())
    if limit is not None and held + nbytes > limit:
        raise PinError(
            f"cannot pin {format_bytes(nbytes)} of host memory: over the pinned-memory limit "
            f"{format_bytes(limit)} ({where}; {format_bytes(held)} already pinned by gnnio); "
            f"{host_memory_limits(t)}. Set GNNIO_PIN_LIMIT, or keep fewer rows in pinned "
            "host memory"
        )


def clear_last_cuda_error(device: torch.device | str | int | None = None) -> None:
    """Consume a stale CUDA runtime error left by a failed API call (e.g. ``cudaHostRegister``).

    The runtime keeps the last error of *any* call until ``cudaGetLastError`` reads it; PyTorch
    calls ``cudaGetLastError`` after each kernel launch, so a failed registration we already handled
    would otherwise surface as a bogus error from the next, unrelated kernel. ``torch.cuda.cudart()``
    does not expose ``cudaGetLastError``, so we launch one tiny kernel (a fill) and ignore the error
    its launch check reports; that check reads, and thereby clears, the stale error.
    """
    if not cuda_available():
        return
    try:
        torch.empty(1, device=device if device is not None else "cuda").fill_(1)
    except RuntimeError:
        pass


# --- reference-counted registrations -------------------------------------------------------------
# Two stores over the same backing tensor must share one registration: unregistering it while the
# other still reads through its view would make the GPU read unmapped memory.
_lock = threading.Lock()


class _Registration:
    """The registration of ``[ptr, ptr + nbytes)`` (``cudaHostRegister`` calls at ``chunks``),
    shared by the handles inside it."""

    def __init__(self, ptr: int, nbytes: int, chunks: tuple[int, ...] | None = None) -> None:
        self.ptr, self.nbytes = ptr, nbytes
        self.chunks = chunks if chunks is not None else (ptr,)
        self.refs = 1
        self.uses: dict[int, Any] = {}  # stream id -> event after its last queued read

    @property
    def end(self) -> int:
        return self.ptr + self.nbytes


_registrations: dict[int, _Registration] = {}  # start address -> registration


def _cudart():
    """The CUDA runtime bindings (a seam: tests replace it with a recording fake)."""
    return torch.cuda.cudart()


def _is_pinned(t: torch.Tensor) -> bool:
    """Whether ``t``'s first *and* last byte are page-locked (someone else's pin or a pinned
    allocation); a tensor reaching past a pinned range is not pinned."""
    if not t.is_pinned():
        return False
    last = t.view(torch.uint8).view(-1)[-1:]
    return bool(last.is_pinned())


def _find(ptr: int, nbytes: int) -> _Registration | None:
    """The registration holding ``[ptr, ptr + nbytes)``; PinError when one only overlaps it."""
    for reg in _registrations.values():
        if reg.ptr <= ptr and ptr + nbytes <= reg.end:
            return reg
        if ptr < reg.end and reg.ptr < ptr + nbytes:
            raise PinError(
                f"cannot pin {format_bytes(nbytes)} of host memory at {ptr:#x}: it overlaps a "
                f"registered range of {format_bytes(reg.nbytes)} at {reg.ptr:#x} without lying "
                "inside it (pin the larger tensor first, or release the smaller pin)"
            )
    return None


def _release(reg: _Registration, tensor: torch.Tensor) -> None:  # noqa: ARG001 - kept alive
    """Drop one reference to ``reg``; on the last one wait for the reads queued on it (their
    events, not the device) and unregister.

    ``tensor`` is an argument only so the finalizer holds it: its memory is freed after this ran,
    never before (freeing registered pages without unregistering them breaks later registrations).
    """
    with _lock:
        reg.refs -= 1
        if reg.refs > 0 or _registrations.get(reg.ptr) is not reg:
            return
        del _registrations[reg.ptr]
        uses, reg.uses = list(reg.uses.values()), {}
    try:
        for ev in uses:
            ev.synchronize()  # a gather still queued reads through the mapping: let it finish
        rt = _cudart()
        for chunk in reg.chunks:
            rt.cudaHostUnregister(chunk)
    except Exception:  # noqa: BLE001 - interpreter shutdown or driver gone: nothing to do
        pass


class PinnedHost:
    """A handle on a pinned (page-locked, device-mapped) host tensor.

    Attributes:
        tensor: the CPU tensor (contiguous) whose memory is pinned.
        nbytes: bytes pinned.
        registered: True when this handle holds a ``cudaHostRegister`` registration (shared with
            other handles on the same memory, released with the last); False when the memory was
            already pinned by someone else (e.g. allocated with ``pin_memory()``).

    Call :meth:`release` when done; the garbage collector does it otherwise.
    """

    def __init__(self, tensor: torch.Tensor, registration: _Registration | None):
        self.tensor = tensor
        self.nbytes = nbytes_of(tensor)
        self.registered = registration is not None
        self._reg = registration
        self._finalizer = (
            weakref.finalize(self, _release, registration, tensor) if registration else None
        )

    def note_use(self, stream=None) -> None:
        """A read of the pinned memory was queued on ``stream`` (default: the current stream):
        the registration is not dropped before it has run. Keeps one event per stream."""
        reg = self._reg
        if reg is None:
            return
        s = stream if stream is not None else torch.cuda.current_stream()
        ev = torch.cuda.Event()
        ev.record(s)
        with _lock:
            reg.uses[getattr(s, "cuda_stream", id(s))] = ev

    def release(self) -> None:
        """Drop this handle's registration (idempotent); the last handle of a registration waits
        for the reads noted on it, then unregisters."""
        if self._finalizer is not None:
            self._finalizer()

    def __repr__(self) -> str:
        return f"PinnedHost({format_bytes(self.nbytes)}, registered={self.registered})"


def pin_host_tensor(t: torch.Tensor, device: torch.device | str | None = None) -> PinnedHost:
    """Pin ``t``'s host memory in place so GPU kernels can read it (zero-copy).

    Args:
        t: contiguous CPU tensor with at least one byte.
        device: the CUDA device that will read it (current during registration, so the pointer's
            "owning" device, which ``torch.as_tensor`` uses in :func:`device_view`, is this one).

    Returns:
        A :class:`PinnedHost`; keep it alive as long as any view of the memory is in use.

    Raises:
        ValueError: ``t`` is not a contiguous CPU tensor, or spans zero bytes (CUDA rejects a
            zero-byte registration, quiver#97: callers must skip pinning empty tiers).
        PinError: CUDA is unavailable or ``cudaHostRegister`` failed (message: size and limits).
    """
    if t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError("pin_host_tensor: need a contiguous CPU tensor")
    nbytes = nbytes_of(t)
    if nbytes == 0:
        raise ValueError("pin_host_tensor: refusing a zero-byte pin (CUDA rejects it)")
    if not cuda_available():
        raise PinError(f"cannot pin {format_bytes(nbytes)} of host memory: CUDA is not available")
    ptr = t.data_ptr()
    with _lock:  # held through the registration: the budget check and the calls are one step
        reg = _find(ptr, nbytes)  # PinError on a partial overlap with one of ours
        if reg is not None:
            reg.refs += 1
            return PinnedHost(t, reg)
        if _is_pinned(t):  # allocated pinned (cudaHostAlloc) or registered by someone else
            return PinnedHost(t, None)
        _check_budget(nbytes, t)
        dev = resolve_device("cuda" if device is None else device)
        chunks = _register_chunks(ptr, nbytes, dev, t)
        reg = _Registration(ptr, nbytes, chunks)
        _registrations[ptr] = reg
    return PinnedHost(t, reg)


def _register_chunks(ptr: int, nbytes: int, dev, t: torch.Tensor) -> tuple[int, ...]:
    """``cudaHostRegister`` of ``[ptr, ptr + nbytes)`` in :data:`REGISTER_CHUNK`-byte calls;
    on a failure the chunks registered so far are unregistered and PinError names the size,
    the failing chunk and the host limits."""
    rt = _cudart()
    flags = CUDA_HOST_REGISTER_PORTABLE | CUDA_HOST_REGISTER_MAPPED
    done: list[int] = []
    step = max(1, int(REGISTER_CHUNK))
    with torch.cuda.device(dev):
        for off in range(0, nbytes, step):
            err = int(rt.cudaHostRegister(ptr + off, min(step, nbytes - off), flags))
            if err == 0:
                done.append(ptr + off)
                continue
            for c in done:  # no half-registered range is left behind
                rt.cudaHostUnregister(c)
            clear_last_cuda_error(dev)
            reason = str(torch.cuda.CudaError(err))
            where = f", at byte {off:,} of it" if nbytes > step else ""
            raise PinError(
                f"cannot pin {format_bytes(nbytes)} of host memory for zero-copy reads "
                f"(cudaHostRegister: {reason}{where}); limit: {host_memory_limits(t)}"
            )
    return tuple(done)


class _CudaArrayView:
    """Exposes a device-accessible address as ``__cuda_array_interface__`` (version 3) and keeps
    the owning host tensor alive for as long as torch's view holds this object."""

    def __init__(self, owner: torch.Tensor, shape: tuple[int, ...]):
        self.owner = owner
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": "|u1",  # raw bytes: works for every dtype, bfloat16 included
            "data": (owner.data_ptr(), False),  # (pointer, read_only)
            "version": 3,
            "strides": None,  # C-contiguous
            "stream": None,  # no synchronisation needed: host memory written before the view
        }


def device_view(host: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A CUDA tensor on ``device`` aliasing the pinned, contiguous 2-D host tensor ``host``
    (same shape and dtype, no copy). Its kernels read host memory over PCIe.

    Raises:
        PinError: the view could not be built without a copy (memory not registered for this
            device, or PyTorch copied it).
    """
    if host.dim() != 2 or not host.is_contiguous() or nbytes_of(host) == 0:
        raise ValueError("device_view: need a non-empty contiguous 2-D host tensor")
    dev = resolve_device(device)
    raw = host.view(torch.uint8)  # [rows, row_bytes]
    with torch.cuda.device(dev):
        view = torch.as_tensor(_CudaArrayView(host, tuple(raw.shape)), device=dev)
    if view.data_ptr() != host.data_ptr() or view.device != dev:
        raise PinError(
            f"zero-copy view of {format_bytes(nbytes_of(host))} of host memory failed: "
            f"torch placed it at {view.device} instead of aliasing it on {dev}"
        )
    return view.view(host.dtype)
