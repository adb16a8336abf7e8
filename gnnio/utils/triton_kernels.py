"""When gnnio's Triton kernels run (the GPU sampler's hop, the GPU row gather), and what happens
when one cannot be built: a warning, once per kernel, and the torch ops from then on (same
results, slower).

A kernel runs on CUDA tensors when Triton is installed (CUDA builds of PyTorch bring it), unless
``GNNIO_TRITON=0``; on CPU tensors only under ``TRITON_INTERPRET=1`` (Triton's interpreter, what
the tests use: it must be set before Triton is imported).

Which implementation ran is recorded per kernel (:func:`kernel_ran`) and reported in a training
summary's ``kernels`` and by ``gnnio bench step`` (:func:`kernels_report`), so a run that fell
back to a slower path says so instead of being silently slow.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch

from .capture import capturing
from .warnings_at import warn

__all__ = [
    "kernel_config",
    "kernel_failed",
    "kernel_ran",
    "kernels_report",
    "reset_kernel_record",
    "triton_available",
]

_FAILED: dict[str, str] = {}  # kernel name -> the first error
_RAN: dict[str, set[str]] = {}  # kernel name -> implementations that ran since the last reset
_CONFIGS: dict[str, dict[str, str]] = {}  # kernel name -> {key (row width): chosen variant}


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
    """Record that ``kernel`` failed; warn once (``what``: what runs instead). Called from the
    ``except`` of a failed launch; inside a CUDA graph capture (:func:`gnnio.utils.capture.
    capturing`) it re-raises ``error`` instead: the capture failed, not the kernel."""
    if capturing():
        raise error
    if kernel in _FAILED:
        return
    _FAILED[kernel] = f"{type(error).__name__}: {error}"
    warn(f"the Triton kernel {kernel!r} failed ({_FAILED[kernel][:200]}); {what}", RuntimeWarning)


def kernel_ran(kernel: str, impl: str) -> None:
    """Record that ``impl`` (``triton``, ``torch``, ``numba``) ran for ``kernel``."""
    got = _RAN.get(kernel)
    if got is None:
        _RAN[kernel] = {impl}
    elif impl not in got:
        got.add(impl)


def kernel_config(kernel: str, key: str, config: str) -> None:
    """Record the variant of ``kernel`` chosen for ``key`` (the row kernel's per row width, made
    once per process by measurement: :mod:`gnnio.features._row_variants`)."""
    _CONFIGS.setdefault(kernel, {})[key] = config


def reset_kernel_record() -> None:
    """Forget which implementations ran (failures and chosen variants stay: a failed kernel is
    not tried again, a choice holds for the process)."""
    _RAN.clear()


def kernels_report() -> dict:
    """``{kernel: impl}`` for every kernel that ran since the last reset (several
    implementations joined with ``+``, e.g. ``triton+torch`` when one fell back mid-run), plus
    ``fallbacks`` (how many Triton kernels failed and fell back), ``failed`` (their errors) and,
    once a variant has been chosen, ``configs`` (``{"rows": {"512B": "t16k_w4"}}``: the variant
    per row width that this process measured fastest)."""
    out: dict = {k: "+".join(sorted(v)) for k, v in sorted(_RAN.items())}
    out["fallbacks"] = len(_FAILED)
    out["failed"] = dict(_FAILED)
    if _CONFIGS:
        out["configs"] = {k: dict(v) for k, v in sorted(_CONFIGS.items())}
    return out
