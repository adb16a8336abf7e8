"""Device names resolved in one place.

``torch.device("cuda")`` has no index, while every CUDA tensor reports the device it lives on with
one (``cuda:0``), and ``torch.device("cuda:0") != torch.device("cuda")``. A store that kept the name
it was given would reject every real CUDA ``out=`` buffer, miss "ids already on my device" and send
ids on a round trip through the host. So every gnnio component that is handed a device resolves it
here once, at construction, and compares devices with :func:`same_device`.
"""

from __future__ import annotations

import torch

__all__ = ["resolve_device", "same_device"]


def resolve_device(device: str | torch.device | int | None) -> torch.device:
    """The device tensors made on ``device`` report: ``"cuda"`` becomes ``cuda:<current device>``
    when CUDA is available (it stays ``cuda`` without CUDA: nothing can be allocated there anyway,
    and the caller's availability check names the problem); ``None`` is the CPU; an int is a CUDA
    device index; everything else is ``torch.device(device)`` unchanged (ValueError naming
    ``device`` where torch cannot parse it)."""
    if device is None:
        return torch.device("cpu")
    try:
        dev = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device: unknown device {device!r} (use cpu, cuda or cuda:N)") from None
    if dev.type == "cuda" and dev.index is None and torch.cuda.is_available():
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def same_device(a: str | torch.device, b: str | torch.device) -> bool:
    """``a`` and ``b`` name the same device once resolved (``cuda`` and ``cuda:0`` are the same
    device while device 0 is current)."""
    return resolve_device(a) == resolve_device(b)
