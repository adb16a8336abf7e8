"""A feature store holding the whole matrix in RAM (tier "host") or in GPU memory (tier "gpu")."""

from __future__ import annotations

import numpy as np
import torch

from ._gather import KERNELS, as_index_array, check_out, gather_rows, row_bytes_view, tensor_view
from .base import FeatureStore

__all__ = ["InMemoryFeatureStore"]


class InMemoryFeatureStore(FeatureStore):
    """All ``[num_rows, dim]`` feature rows resident in one tensor.

    On the CPU the rows are copied by the parallel gather kernel of :mod:`gnnio.features._gather`
    (numba, GIL released); on a GPU by ``torch.index_select``. Every call counts ``len(ids)`` rows
    (repeats included) and ``len(ids) * row_bytes`` bytes under tier ``"host"`` (CPU) or ``"gpu"``.

    Args:
        features: ``[N, F]`` NumPy array or torch tensor. A ``np.memmap`` is read into RAM (this is
            the in-memory store; use :class:`~gnnio.features.MmapFeatureStore` to keep it on disk);
            a non-contiguous input is copied once to C order; other arrays are shared, not copied.
        device: where the rows live and where :meth:`gather` returns them ("cpu", "cuda", ...).
        num_threads: CPU threads of the gather kernel (per calling thread); None = numba's setting.
        kernel: CPU kernel, "auto" (numba when installed), "numba" or "torch" (index_select).
    """

    def __init__(
        self,
        features: np.ndarray | torch.Tensor,
        device: str | torch.device = "cpu",
        num_threads: int | None = None,
        kernel: str = "auto",
    ) -> None:
        super().__init__()
        if kernel not in KERNELS:
            raise ValueError(
                f"unknown gather kernel {kernel!r}; choose one of {', '.join(KERNELS)}"
            )
        if isinstance(features, np.memmap):
            features = np.array(features, order="C")  # read into RAM once
        t = features if isinstance(features, torch.Tensor) else tensor_view(np.asarray(features))
        if t.dim() != 2:
            raise ValueError(f"features must be 2-D [num_rows, dim], got shape {tuple(t.shape)}")
        if t.shape[1] == 0:
            raise ValueError("features have no columns (dim 0)")
        self.device = torch.device(device)
        t = t.detach().to(self.device).contiguous()
        self._t = t
        self.num_rows, self.dim = int(t.shape[0]), int(t.shape[1])
        self.dtype = t.dtype
        self.kernel = kernel
        self.num_threads = num_threads
        self.tier = "host" if self.device.type == "cpu" else "gpu"
        # uint8 [N, row_bytes] view for the byte-copy kernel (shares memory with self._t)
        self._bytes = row_bytes_view(t) if self.device.type == "cpu" else None

    def __repr__(self) -> str:
        return (
            f"InMemoryFeatureStore(num_rows={self.num_rows}, dim={self.dim}, dtype={self.dtype}, "
            f"device={self.device})"
        )

    def gather(self, ids, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rows ``ids`` (global ids; int32/int64; repeats allowed) as ``[len(ids), dim]`` on
        ``self.device``, written into ``out[:len(ids)]`` when ``out`` is given. Raises IndexError
        for ids outside ``[0, num_rows)``, TypeError for non-integer ids."""
        if self.device.type != "cpu":
            return self._gather_device(ids, out)
        idx = as_index_array(ids, self.num_rows)
        n = int(idx.shape[0])
        if out is None:
            dst = torch.empty((n, self.dim), dtype=self.dtype)
        else:
            dst = check_out(out, n, self.dim, self.dtype, self.device)
        gather_rows(self._bytes, idx, dst, self.kernel, self.num_threads, src_tensor=self._t)
        self.counters.add(self.tier, n, self.row_bytes)
        return dst

    def _gather_device(self, ids, out: torch.Tensor | None) -> torch.Tensor:
        """GPU path: ids validated and gathered on the device (one sync for the bounds check)."""
        if isinstance(ids, torch.Tensor) and ids.device == self.device:
            if ids.dtype not in (torch.int32, torch.int64):
                raise TypeError(f"feature ids must be int32/int64, got a tensor of {ids.dtype}")
            if ids.dim() != 1:
                raise ValueError(f"feature ids must be 1-D, got shape {tuple(ids.shape)}")
            idx = ids
            if idx.numel():
                lo, hi = (int(v) for v in torch.aminmax(idx))
                if lo < 0 or hi >= self.num_rows:
                    bad = lo if lo < 0 else hi
                    raise IndexError(f"feature id {bad} out of range [0, {self.num_rows})")
        else:
            idx = torch.from_numpy(as_index_array(ids, self.num_rows)).to(self.device)
        n = int(idx.shape[0])
        if out is None:
            dst = torch.empty((n, self.dim), dtype=self.dtype, device=self.device)
        else:
            dst = check_out(out, n, self.dim, self.dtype, self.device)
        torch.index_select(self._t, 0, idx.long(), out=dst)
        self.counters.add(self.tier, n, self.row_bytes)
        return dst
