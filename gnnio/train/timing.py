"""Timing the training step without a device-wide synchronisation.

``torch.cuda.synchronize()`` after every step (what the loop did) waits for *every* stream of the
device, the loader's copies of the next batches included, so the measurement itself cancels the
overlap it is meant to show. :class:`ComputeTimer` records a CUDA event on the training stream
before and after each step instead and reads the device time between them once, at the end of the
epoch, waiting only for the last event. On the CPU it is a wall clock.
"""

from __future__ import annotations

import time

import torch

__all__ = ["ComputeTimer"]


class ComputeTimer:
    """Summed seconds of the steps bracketed by :meth:`start` / :meth:`stop` on ``device``."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device
        self._pairs: list = []
        self._t0 = 0.0
        self._start: torch.cuda.Event | None = None
        self._wall = 0.0

    def start(self) -> None:
        if self.cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record(torch.cuda.current_stream(self.device))
        else:
            self._t0 = time.perf_counter()

    def stop(self) -> None:
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record(torch.cuda.current_stream(self.device))
            self._pairs.append((self._start, end))
        else:
            self._wall += time.perf_counter() - self._t0

    def total_s(self) -> float:
        """Seconds of all steps so far (CUDA: waits for the last step's end event only)."""
        if not self.cuda:
            return self._wall
        if self._pairs:
            self._pairs[-1][1].synchronize()
            self._wall += sum(a.elapsed_time(b) for a, b in self._pairs) / 1e3
            self._pairs = []
        return self._wall
