"""``--device``: checked and resolved (``auto``: CUDA when present) in one place."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import UsageError

if TYPE_CHECKING:  # (imported where used: TrainConfig, and so gnnio plan, load without torch)
    import torch

__all__ = ["check_device"]


def check_device(device: str) -> torch.device:
    """``torch.device(device)``, or a one-line UsageError if it is malformed or CUDA is missing;
    ``"auto"`` is CUDA when present, else the CPU (:func:`gnnio.train.gpu_plan.resolve_device`)."""
    import torch

    if device == "auto":
        from .gpu_plan import resolve_device

        device = resolve_device(device)
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise UsageError(
            f"--device: unknown device '{device}' (use cpu, cuda, cuda:N or auto)"
        ) from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(
                "--device cuda: CUDA is not available on this machine (use --device cpu)"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise UsageError(
                f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) present"
            )
    elif dev.type != "cpu":
        raise UsageError(f"--device: unsupported device '{device}' (use cpu, cuda, cuda:N or auto)")
    return dev
