"""The cold path of a :class:`~gnnio.features.tiers.tiered.TieredFeatureStore`: how the rows outside the
GPU tier reach the device (the modes are described in :mod:`gnnio.features.tiers.tiered`).

* zero-copy: the host rows are pinned in place and read by a GPU gather through a CUDA view
  (:mod:`gnnio.features.tiers.uva`; simulated: the host tensor is indexed directly);
* CPU gather + copy: the CPU gathers the rows through the :class:`~gnnio.features.tiers.row_source.RowSource`
  into a reused (pinned) staging buffer, which is copied to the device.

:class:`ColdPath` chooses between them (``cold_mode``), pins, falls back with a
:class:`TieringWarning` when pinning fails, gathers, and releases the pinned memory.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import torch

from ...utils.warnings_at import warn
from .._gather import copy_rows
from . import uva
from .row_source import RowSource
from .simdevice import simulated_pin

__all__ = ["ColdPath", "TieringWarning"]

log = logging.getLogger("gnnio.features.tiers.tiered")  # the store's logger


class TieringWarning(RuntimeWarning):
    """The store did something other than asked: fewer hot rows (budget) or no zero-copy (pin)."""


class ColdPath:
    """Cold rows of one tiered store, read from ``src`` and delivered on ``device``.

    Attributes:
        mode_used: ``"zero_copy"``, ``"cpu_gather"`` or ``"none"`` (no cold rows), after
            :meth:`setup`; ``reason`` says why (one line).
        view: the zero-copy view of the pinned host rows (None on the CPU-gather path).

    Threads: concurrent :meth:`gather` calls are safe (the reused staging buffer of the CPU-gather
    path is guarded by a lock).
    """

    def __init__(self, src: RowSource, device: torch.device, simulated: bool) -> None:
        self.src = src
        self.device = device
        self.simulated = simulated
        self.row_bytes = src.dim * torch.empty((), dtype=src.dtype).element_size()
        self.mode_used = "none"
        self.reason = ""
        self.view: torch.Tensor | None = None
        self._pin_handle: Any = None
        self._staging: torch.Tensor | None = None
        self._staging_event: Any = None
        self._lock = threading.Lock()

    def setup(
        self, cold_mode: str, pin_fn: Callable[[torch.Tensor], Any] | None, all_hot: bool
    ) -> None:
        """Choose the cold path; pin + build the zero-copy view when it is zero-copy.

        Warnings point at the caller of the store's constructor (call this from ``__init__``)."""
        if all_hot:
            self.mode_used, self.reason = "none", "every row is in the GPU tier"
            return
        if cold_mode == "cpu_gather":
            self.mode_used, self.reason = "cpu_gather", "cold_mode='cpu_gather'"
            return
        if self.row_bytes == 0:  # nothing to read; never pin zero bytes
            self.mode_used, self.reason = "cpu_gather", "rows are zero bytes wide"
            return
        host = self.src.host
        if host is None:
            if cold_mode == "auto":
                self.mode_used = "cpu_gather"
                self.reason = (
                    f"backing ({self.src.kind}) does not hold its rows in one RAM tensor; "
                    "cold rows are gathered through it"
                )
                return
            host = self._materialize_host()
        pin = pin_fn
        if pin is None:
            pin = (
                simulated_pin if self.simulated else (lambda t: uva.pin_host_tensor(t, self.device))
            )
        handle = None
        try:
            handle = pin(host)
            view = host if self.simulated else uva.device_view(host, self.device)
        except Exception as e:  # noqa: BLE001 - any pin failure: report it in one line
            if handle is not None and hasattr(handle, "release"):
                handle.release()
            if not self.simulated:
                uva.clear_last_cuda_error(self.device)
            msg = _pin_failure_message(e, host)
            if cold_mode == "zero_copy":
                raise uva.PinError(
                    f"{msg}; pass cold_mode='auto' or 'cpu_gather' to gather cold rows on the CPU"
                ) from e
            warn(
                f"TieredFeatureStore: {msg}; falling back to cold_mode='cpu_gather' "
                "(CPU gather + copy)",
                TieringWarning,
            )
            log.warning("zero-copy cold tier unavailable, using CPU gather + copy: %s", msg)
            self.mode_used = "cpu_gather"
            self.reason = f"pin failed: {msg}"
            return
        self._pin_handle = handle
        self.view = view
        self.mode_used = "zero_copy"
        self.reason = (
            "pinned host rows read by the GPU (simulated)"
            if self.simulated
            else "pinned host rows read by the GPU over PCIe (UVA)"
        )

    def _materialize_host(self) -> torch.Tensor:
        """cold_mode='zero_copy' over a backing without a RAM tensor: read all rows into one host
        tensor (to be pinned). Costs ``num_rows * row_bytes`` of RAM."""
        src = self.src
        n = src.num_rows
        log.info(
            "zero-copy over a %s backing: reading %s of rows into host memory",
            src.kind,
            uva.format_bytes(n * self.row_bytes),
        )
        host = torch.empty((n, src.dim), dtype=src.dtype)
        step = 1 << 16
        for s in range(0, n, step):
            e = min(n, s + step)
            rows = src.read_range(s, e, host[s:e])
            if rows.data_ptr() != host[s:e].data_ptr():
                host[s:e].copy_(rows)
        return host

    def gather(self, res: torch.Tensor, pos: torch.Tensor | None, ids: torch.Tensor) -> None:
        """Cold rows ``ids`` into ``res[pos]`` (``pos=None``: into all of ``res``)."""
        if self.view is not None:
            # zero-copy: a GPU gather kernel reading pinned host memory (simulated: CPU index)
            copy_rows(self.view, ids, res, pos)
            self.note_use()
            return
        ids_np = ids.cpu().numpy()
        k = int(ids_np.shape[0])
        if self.simulated and pos is None:
            self.src.read(ids_np, res)  # gather straight into the output (both on the CPU)
            return
        with self._lock:
            buf = self._staging_buffer(k)
            self.src.read(ids_np, buf)
            rows = buf[:k]
            if not self.simulated:
                # Host->device copy from the pinned staging buffer. The copy is asynchronous: the
                # event lets the next call wait before it overwrites the buffer the DMA engine
                # may still be reading.
                rows = rows.to(self.device, non_blocking=True)
                self._staging_event.record()
            if pos is None:
                res.copy_(rows)
            else:
                res.index_copy_(0, pos, rows)

    def note_use(self) -> None:
        """Record a zero-copy read just queued: :meth:`release` waits for it before unpinning."""
        if not self.simulated and self._pin_handle is not None:
            note = getattr(self._pin_handle, "note_use", None)
            if note is not None:
                note()

    def _staging_buffer(self, k: int) -> torch.Tensor:
        """A reused CPU buffer of at least ``k`` rows (pinned on a GPU so the copy is a DMA)."""
        if self._staging_event is not None:
            self._staging_event.synchronize()  # the previous copy out of the buffer is done
        if self._staging is None or self._staging.shape[0] < k:
            cap = max(k, 2 * (0 if self._staging is None else self._staging.shape[0]), 1024)
            pin = not self.simulated
            dim, dtype = self.src.dim, self.src.dtype
            try:
                self._staging = torch.empty((cap, dim), dtype=dtype, pin_memory=pin)
            except RuntimeError:  # pinned allocation refused: pageable still works, slower
                self._staging = torch.empty((cap, dim), dtype=dtype)
            if not self.simulated and self._staging_event is None:
                self._staging_event = torch.cuda.Event()
        return self._staging

    def release(self) -> None:
        """Unpin the host rows and drop the staging buffer (no more cold reads afterwards)."""
        self.view = None
        if self._pin_handle is not None and hasattr(self._pin_handle, "release"):
            self._pin_handle.release()
        self._pin_handle = None
        self._staging = None


def _pin_failure_message(e: BaseException, host: torch.Tensor) -> str:
    """One line naming the size and the limits, whatever the pin function raised."""
    if isinstance(e, uva.PinError):
        return str(e).splitlines()[0]
    first = (str(e).strip().splitlines() or [""])[0]
    return (
        f"cannot pin {uva.format_bytes(uva.nbytes_of(host))} of host memory for zero-copy reads "
        f"({type(e).__name__}: {first}); limit: {uva.host_memory_limits(host)}"
    )
