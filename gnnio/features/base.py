"""The feature-store contract.

A feature store maps global node ids to feature rows. ``gather(ids)`` returns the rows on the
store's target device. Every store counts the rows and bytes it served *per tier* (``"gpu"``,
``"host"``, ``"disk"``, ``"peer"``, ...), so hit ratios and traffic come from the code that moved the
data. Caches and tiered stores are wrappers over another store (composition, as in GraphBolt).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import defaultdict
from dataclasses import dataclass, field

import torch

__all__ = ["FeatureStore", "TierCounters"]


@dataclass
class TierCounters:
    """Rows and bytes served per tier since the last reset."""

    rows: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    bytes: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def add(self, tier: str, rows: int, row_bytes: int) -> None:
        self.rows[tier] += int(rows)
        self.bytes[tier] += int(rows) * int(row_bytes)

    def reset(self) -> None:
        self.rows.clear()
        self.bytes.clear()

    def snapshot(self) -> dict[str, dict[str, int]]:
        return {"rows": dict(self.rows), "bytes": dict(self.bytes)}


class FeatureStore(ABC):
    """Maps global ids to feature rows on ``self.device``.

    Subclasses set ``num_rows``, ``dim``, ``dtype``, ``device`` and implement :meth:`gather`.
    """

    num_rows: int
    dim: int
    dtype: torch.dtype
    device: torch.device

    def __init__(self) -> None:
        self.counters = TierCounters()

    @property
    def row_bytes(self) -> int:
        return self.dim * torch.empty((), dtype=self.dtype).element_size()

    @abstractmethod
    def gather(self, ids: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rows ``ids`` (int64 global ids, any order, repeats allowed) as a ``[len(ids), dim]``
        tensor on ``self.device``. With ``out`` the rows are written into ``out[:len(ids)]`` (a
        reused buffer avoids page faults from a fresh allocation per batch) and that view returned.
        Raises IndexError for ids outside ``[0, num_rows)``."""
