"""A feature store holding the whole matrix in RAM (tier "host") or in GPU memory (tier "gpu")."""

from __future__ import annotations

import numpy as np
import torch

from ...utils.devices import resolve_device
from ...utils.rss import available_ram
from .._gather import (
    KERNELS,
    as_index_array,
    check_out,
    copy_masked,
    copy_rows,
    gather_rows,
    host_empty,
    row_bytes_view,
    tensor_view,
)
from .._host_gather import HostRowGather
from ..base import DeviceRows, FeatureStore, ids_vouched

__all__ = ["InMemoryFeatureStore"]


class InMemoryFeatureStore(FeatureStore):
    """All ``[num_rows, dim]`` feature rows resident in one tensor.

    On the CPU the rows are copied by the parallel gather kernel of :mod:`gnnio.features._gather`
    (numba, GIL released); on a GPU by ``torch.index_select``. Every call counts ``len(ids)`` rows
    (repeats included) and ``len(ids) * row_bytes`` bytes under tier ``"host"`` (CPU) or ``"gpu"``.

    Host memory: a ``np.memmap`` or a non-contiguous input is copied once into a buffer from
    :func:`~gnnio.features._gather.host_empty` (first row on a 2 MiB boundary, so 64-byte rows
    do not straddle cache lines and huge pages cover the array). So is an in-RAM array or CPU
    tensor of 1 MiB or more whose first byte is not on a 64-byte boundary (NumPy's large
    allocations start 16 bytes past one; a 512-byte-row gather from such an array measured about
    5-12% slower), as long as the copy takes at most half of the memory available; other arrays
    and tensors are shared, not copied. Allocate with ``host_empty`` to avoid the copy.

    Zero-width rows (``F == 0``) and empty tables (``N == 0``) are allowed: ids are still checked
    and counted, and :meth:`gather` returns ``[len(ids), 0]``.

    Args:
        features: ``[N, F]`` NumPy array or torch tensor. A ``np.memmap`` is read into RAM (this is
            the in-memory store; use :class:`~gnnio.features.MmapFeatureStore` to keep it on disk).
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
        self.device = resolve_device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {self.device} asked for but CUDA is not available; use 'cpu'")
        if not isinstance(features, torch.Tensor):
            arr = features if isinstance(features, np.memmap) else np.asarray(features)
            if arr.ndim != 2:
                raise ValueError(
                    f"features must be 2-D [num_rows, dim], got shape {tuple(arr.shape)}"
                )
            if self.device.type == "cpu" and (
                isinstance(arr, np.memmap)
                or not arr.flags.c_contiguous
                or _worth_realigning(arr.__array_interface__["data"][0], arr.nbytes)
            ):
                arr = _aligned_copy(arr)  # read into RAM once / to C order / realigned
            t = tensor_view(np.asarray(arr))
        else:
            t = features
            if t.dim() != 2:
                raise ValueError(
                    f"features must be 2-D [num_rows, dim], got shape {tuple(t.shape)}"
                )
        t = t.detach().to(self.device)
        nbytes = t.numel() * t.element_size()
        if not t.is_contiguous() or (
            self.device.type == "cpu" and _worth_realigning(t.data_ptr(), nbytes)
        ):
            if self.device.type == "cpu":
                t = _aligned_tensor_copy(t)
            else:
                t = t.contiguous()
        self._t = t
        self.num_rows, self.dim = int(t.shape[0]), int(t.shape[1])
        self.dtype = t.dtype
        self.kernel = kernel
        self.num_threads = num_threads
        self.tier = "host" if self.device.type == "cpu" else "gpu"
        # uint8 [N, row_bytes] view for the byte-copy kernel (shares memory with self._t)
        self._bytes = row_bytes_view(t) if self.device.type == "cpu" else None
        self._fast = (
            HostRowGather(self._bytes, self.dim, self.dtype) if self._bytes is not None else None
        )

    def __repr__(self) -> str:
        return (
            f"InMemoryFeatureStore(num_rows={self.num_rows}, dim={self.dim}, dtype={self.dtype}, "
            f"device={self.device})"
        )

    def host_tensor(self) -> torch.Tensor | None:
        """All rows as one ``[num_rows, dim]`` contiguous CPU tensor (shared with the store, not
        a copy; do not write to it), or None when the rows live on a GPU."""
        return self._t if self.device.type == "cpu" else None

    def gather(self, ids, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rows ``ids`` (global ids; int32/int64; repeats allowed) as ``[len(ids), dim]`` on
        ``self.device``, written into ``out[:len(ids)]`` when ``out`` is given. Raises IndexError
        for ids outside ``[0, num_rows)``, TypeError for non-integer ids."""
        if self._fast is None or self._bytes is None:  # (on a GPU)
            return self._gather_device(ids, out)
        # the loader's call (an int tensor and a reused buffer), straight to the kernel
        dst = self._fast(ids, out, self.kernel, self.num_threads)
        if dst is not None:
            self.counters.add(self.tier, ids.shape[0], self.row_bytes)
            return dst
        idx = as_index_array(ids, self.num_rows, check=False)  # (gather_rows checks)
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
            if idx.numel() and not ids_vouched():
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
        copy_rows(self._t, idx, dst)
        self.counters.add(self.tier, n, self.row_bytes)
        return dst

    def device_rows(self) -> DeviceRows:
        """:meth:`FeatureStore.device_rows`: every row in the one tensor, on the store's device."""
        t = self._t
        return DeviceRows(t, t, None, self.num_rows, self.tier, self.tier, self.counters, _no_op)

    def gather_into(self, ids, out, mask):
        """:meth:`FeatureStore.gather_into`: a masked copy on the store's device (one Triton kernel
        on a GPU; torch ops elsewhere, which read a row for every id)."""
        if ids.device != self.device or out.device != self.device:
            return None
        copy_masked(self._t, torch.where(mask, ids, -1), out)
        n = mask.sum()
        self.counters.add_device(self.tier, n, self.row_bytes)
        return [(self.tier, n)]


def _no_op() -> None:
    pass


def _worth_realigning(addr: int, nbytes: int) -> bool:
    """Copy an in-RAM feature array to an aligned buffer? Yes when it is big enough to matter
    (>= 1 MiB), starts off a 64-byte boundary, and the copy fits in half of ``MemAvailable``."""
    if addr % 64 == 0 or nbytes < (1 << 20):
        return False
    avail = available_ram()
    return avail is not None and nbytes <= avail // 2  # (unknown: share, not risk a large copy)


def _aligned_copy(a: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of a 2-D array (a memmap is read 64 MiB at a time) in a
    :func:`host_empty` buffer."""
    out = host_empty(a.shape, a.dtype)
    step = max(1, (64 << 20) // max(1, a.shape[1] * a.dtype.itemsize))
    for s in range(0, a.shape[0], step):
        out[s : s + step] = a[s : s + step]
    return out


def _aligned_tensor_copy(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of a 2-D CPU tensor (any dtype, bfloat16 included) in a
    :func:`host_empty` buffer."""
    if t.numel() == 0:
        return torch.empty(tuple(t.shape), dtype=t.dtype)
    raw = torch.from_numpy(host_empty((t.shape[0], t.shape[1] * t.element_size()), np.uint8))
    dst = raw.view(t.dtype)
    dst.copy_(t)
    return dst
