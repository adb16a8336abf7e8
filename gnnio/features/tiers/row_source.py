"""Read access on the CPU to the rows behind a tiered store, whatever holds them: a CPU
:class:`~gnnio.features.base.FeatureStore`, a NumPy array (a ``np.memmap`` stays on disk) or a CPU
tensor. :class:`RowSource` reads rows by id or by range, and exposes the rows as one RAM tensor when
there is one (what :mod:`gnnio.features.tiers.tiered_cold` pins for zero-copy reads).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ...errors import UsageError
from .._gather import gather_rows, row_bytes_view, tensor_view
from ..base import FeatureStore

__all__ = ["RowSource", "num_rows_of", "unique_in_order"]


class RowSource:
    """Read access to the backing rows on the CPU, whatever the backing is.

    Attributes:
        host: a contiguous CPU tensor holding all rows in RAM (indexable by global id), or None
            when the rows are not in RAM as one tensor (memory-mapped file, opaque store).
    """

    def __init__(self, backing: Any):
        self.store: FeatureStore | None = None
        self.host: torch.Tensor | None = None
        self._np: np.ndarray | None = None  # a memory-mapped array gather_rows reads from
        self._host_bytes: np.ndarray | None = None  # uint8 [N, row_bytes] view of ``host``
        if isinstance(backing, FeatureStore):
            if backing.device.type != "cpu":
                raise UsageError(
                    f"backing store gathers to {backing.device}; TieredFeatureStore places rows "
                    "on the GPU itself, give it a store on the CPU"
                )
            self.store = backing
            self.num_rows, self.dim, self.dtype = backing.num_rows, backing.dim, backing.dtype
            getter = getattr(backing, "host_tensor", None)
            host = getter() if callable(getter) else None
            if (
                isinstance(host, torch.Tensor)
                and host.device.type == "cpu"
                and host.is_contiguous()
                and tuple(host.shape) == (self.num_rows, self.dim)
                and host.dtype == self.dtype
            ):
                self.host = host
            return
        if isinstance(backing, np.memmap):
            arr = np.asarray(backing)  # plain ndarray view of the mapping; nothing is read
            if arr.ndim != 2 or not arr.flags.c_contiguous:
                raise ValueError("memory-mapped features must be 2-D and row-major (C-contiguous)")
            self._np = arr
            self.num_rows, self.dim = int(arr.shape[0]), int(arr.shape[1])
            self.dtype = tensor_view(arr[:0]).dtype
            return
        if isinstance(backing, np.ndarray):
            backing = tensor_view(np.ascontiguousarray(backing))
        if not isinstance(backing, torch.Tensor):
            raise TypeError(
                "backing must be a FeatureStore, a NumPy array or a torch tensor, "
                f"got {type(backing).__name__}"
            )
        if backing.device.type != "cpu":
            raise UsageError(
                f"backing tensor is on {backing.device}; TieredFeatureStore places rows on the "
                "GPU itself, give it a CPU tensor"
            )
        if backing.dim() != 2:
            raise ValueError(
                f"features must be 2-D [num_rows, dim], got shape {tuple(backing.shape)}"
            )
        self.host = backing.detach().contiguous()
        self.num_rows, self.dim = int(self.host.shape[0]), int(self.host.shape[1])
        self.dtype = self.host.dtype

    @property
    def kind(self) -> str:
        if self.store is not None:
            return type(self.store).__name__
        return "memmap" if self._np is not None else "tensor"

    def read(self, ids: np.ndarray, out: torch.Tensor) -> None:
        """Rows ``ids`` (validated int32/int64 global ids) into the CPU tensor ``out[:len(ids)]``."""
        if ids.shape[0] == 0 or self.dim == 0:
            return
        if self.store is not None:
            self.store.gather(torch.from_numpy(ids), out=out)
        elif self.host is not None:
            if self._host_bytes is None:
                self._host_bytes = row_bytes_view(self.host)
            gather_rows(self._host_bytes, ids, out[: ids.shape[0]], src_tensor=self.host)
        else:
            assert self._np is not None  # (the one source left: a mapped array)
            gather_rows(self._np, ids, out[: ids.shape[0]])

    def read_range(self, start: int, stop: int, out: torch.Tensor) -> torch.Tensor:
        """Rows ``[start, stop)`` as a CPU tensor (a view of ``host`` when there is one, else
        written into ``out``)."""
        if self.host is not None:
            return self.host[start:stop]
        if self._np is not None:
            out[: stop - start].copy_(tensor_view(self._np[start:stop]))
            return out[: stop - start]
        self.read(np.arange(start, stop, dtype=np.int64), out)
        return out[: stop - start]


def num_rows_of(backing: Any) -> int:
    """Rows of ``backing`` (a store, a 2-D array or tensor, or anything :class:`RowSource` reads)."""
    if isinstance(backing, FeatureStore):
        return int(backing.num_rows)
    if isinstance(backing, (np.ndarray, torch.Tensor)) and backing.ndim == 2:
        return int(backing.shape[0])
    return RowSource(backing).num_rows


def unique_in_order(ids: np.ndarray) -> np.ndarray:
    """``ids`` without repeats, first occurrences kept in their order."""
    _, first = np.unique(ids, return_index=True)
    return ids[np.sort(first)]
