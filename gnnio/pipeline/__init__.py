"""The per-batch pipeline: seed order -> sampler -> feature gather -> device, as overlapped stages
with bounded queues and per-stage timers (:class:`NodeLoader`)."""

from __future__ import annotations

from .loader import NodeLoader

__all__ = ["NodeLoader"]
