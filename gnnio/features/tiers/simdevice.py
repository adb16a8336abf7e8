"""Simulated devices: the same multi-tier code on machines without a GPU.

A :class:`SimulatedDevice` stands in for one GPU: what would live in its memory (a hot shard, a
lookup table) is held in CPU memory, allocated through :meth:`SimulatedDevice.empty`, which
enforces the device's capacity and counts allocated bytes. The stores built on it still count every
row and byte they serve per tier / link in their :class:`~gnnio.features.base.TierCounters`, so
traffic figures from a simulated run are exact counts; only *times* are not those of a GPU (turn
counted bytes into modeled time with a topology's link bandwidths, and say that they are modeled).

The pin stand-ins mirror :func:`gnnio.features.tiers.uva.pin_host_tensor`:

* :func:`simulated_pin` pins nothing but checks what the real call checks (contiguous CPU tensor,
  refuses zero bytes) and records the size;
* :func:`pin_limit` returns a pin function that fails like ``cudaHostRegister`` does for requests
  above a limit (very large or shared-memory tensors, dgl#3939 / dgl#4237), for testing the
  fallback paths of the stores without a GPU.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable

import torch

from ...errors import GnnioError
from .uva import PinError, format_bytes, host_memory_limits, nbytes_of

__all__ = ["SimulatedDevice", "SimulatedOutOfMemory", "SimulatedPin", "pin_limit", "simulated_pin"]


class SimulatedOutOfMemory(GnnioError):
    """An allocation on a :class:`SimulatedDevice` would exceed its capacity."""


class SimulatedDevice:
    """One GPU simulated in CPU memory.

    Args:
        name: how reports name it, e.g. ``"sim:cuda:0"``.
        capacity_bytes: memory of the simulated device; None = unlimited.

    Attributes:
        allocated_bytes: bytes currently held by live tensors allocated here.
        peak_bytes: the maximum of ``allocated_bytes`` so far.
        storage_device: where its tensors really are (always the CPU).
    """

    storage_device = torch.device("cpu")

    def __init__(self, name: str = "sim:cuda:0", capacity_bytes: int | None = None):
        if capacity_bytes is not None and capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        self.name = name
        self.capacity_bytes = capacity_bytes
        self.allocated_bytes = 0
        self.peak_bytes = 0
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        cap = "unlimited" if self.capacity_bytes is None else format_bytes(self.capacity_bytes)
        return (
            f"SimulatedDevice({self.name!r}, capacity={cap}, "
            f"allocated={format_bytes(self.allocated_bytes)})"
        )

    def _free(self, nbytes: int) -> None:
        with self._lock:
            self.allocated_bytes -= nbytes

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised CPU tensor counted against this device until it is garbage collected.

        Raises:
            SimulatedOutOfMemory: the allocation would exceed ``capacity_bytes``.
        """
        t = torch.empty(shape, dtype=dtype)
        nbytes = nbytes_of(t)
        with self._lock:
            if (
                self.capacity_bytes is not None
                and self.allocated_bytes + nbytes > self.capacity_bytes
            ):
                raise SimulatedOutOfMemory(
                    f"{self.name}: cannot allocate {format_bytes(nbytes)} "
                    f"({format_bytes(self.allocated_bytes)} of {format_bytes(self.capacity_bytes)} "
                    "in use)"
                )
            self.allocated_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.allocated_bytes)
        if nbytes:
            weakref.finalize(t, self._free, nbytes)
        return t


class SimulatedPin:
    """What :func:`simulated_pin` returns: the tensor and the bytes a real pin would lock."""

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor
        self.nbytes = nbytes_of(tensor)
        self.registered = False

    def release(self) -> None:
        """Nothing to undo (kept for the same interface as :class:`~.uva.PinnedHost`)."""

    def __repr__(self) -> str:
        return f"SimulatedPin({format_bytes(self.nbytes)})"


def simulated_pin(t: torch.Tensor) -> SimulatedPin:
    """Pin stand-in: validates like :func:`~.uva.pin_host_tensor` (contiguous CPU tensor, never
    zero bytes) and pins nothing."""
    if t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError("simulated_pin: need a contiguous CPU tensor")
    if nbytes_of(t) == 0:
        raise ValueError("simulated_pin: refusing a zero-byte pin (CUDA rejects it)")
    return SimulatedPin(t)


def pin_limit(
    limit_bytes: int, reason: str = "out of memory"
) -> Callable[[torch.Tensor], SimulatedPin]:
    """A pin function that fails, like ``cudaHostRegister``, for tensors above ``limit_bytes``.

    The failure is a :class:`~.uva.PinError` with the same one-line message shape as the real one
    (size asked for, the simulated limit and the host's memory). Requests within the limit succeed
    as :func:`simulated_pin`.
    """

    def pin(t: torch.Tensor) -> SimulatedPin:
        nbytes = nbytes_of(t)
        if nbytes > limit_bytes:
            raise PinError(
                f"cannot pin {format_bytes(nbytes)} of host memory for zero-copy reads "
                f"(simulated cudaHostRegister: {reason}); limit: {format_bytes(limit_bytes)} "
                f"pinnable (simulated), {host_memory_limits(t)}"
            )
        return simulated_pin(t)

    return pin
