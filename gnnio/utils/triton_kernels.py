"""When gnnio's Triton kernels run (the GPU sampler's hop, the GPU row gather), and what happens
when one cannot be built: a warning, once per kernel, and the torch ops from then on (same
results, slower).

A kernel runs on CUDA tensors when Triton is installed (CUDA builds of PyTorch bring it), unless
``GNNIO_TRITON=0``; on CPU tensors only under ``TRITON_INTERPRET=1`` (Triton's interpreter, what
the tests use: it must be set before Triton is imported).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import warnings

import torch

__all__ = ["kernel_failed", "triton_available"]

_FAILED: dict[str, str] = {}  # kernel name -> the first error


@functools.cache
def _importable() -> bool:
    return importlib.util.find_spec("triton") is not None


def triton_available(device: torch.device, kernel: str) -> bool:
    """Whether ``kernel`` runs as Triton on ``device`` (see the module docstring)."""
    if kernel in _FAILED or os.environ.get("GNNIO_TRITON", "1") == "0":
        return False
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return False
    return _importable()


def kernel_failed(kernel: str, error: BaseException, what: str) -> None:
    """Record that ``kernel`` failed; warn once (``what``: what runs instead)."""
    if kernel in _FAILED:
        return
    _FAILED[kernel] = f"{type(error).__name__}: {error}"
    warnings.warn(
        f"the Triton kernel {kernel!r} failed ({_FAILED[kernel][:200]}); {what}",
        RuntimeWarning,
        stacklevel=3,
    )
