"""A feature store reading rows from a memory-mapped file (tier "disk")."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np
import torch

from ...errors import DatasetError
from .._gather import KERNELS, as_index_array, check_out, gather_rows
from .._host_gather import HostRowGather
from ..base import FeatureStore

__all__ = ["MmapFeatureStore"]

_ADVICE = {
    "normal": getattr(mmap, "MADV_NORMAL", None),
    "random": getattr(mmap, "MADV_RANDOM", None),
    "sequential": getattr(mmap, "MADV_SEQUENTIAL", None),
}


class MmapFeatureStore(FeatureStore):
    """Feature rows in a file, mapped into memory; each :meth:`gather` touches only its rows.

    Nothing is read when the store opens. A gather runs the same parallel row-copy kernel as the
    in-memory store directly over the mapping, so the OS pages in only the pages holding the
    requested rows (plus its readahead; ``advice="random"`` turns readahead off, which cuts read
    amplification on a cold disk). Pages stay in the OS page cache afterwards, so a warm store
    reads at memory speed; the counters still book every row under tier ``"disk"`` because that
    is where the store serves from. Rows are returned in host memory (``device`` is the CPU);
    the loader moves them to a GPU.

    Args:
        features: a ``np.memmap`` (e.g. ``gnnio.load(path).features``), or the path of a ``.npy``
            file, or of a raw row-major file (then ``dtype`` and ``shape`` are required).
        dtype, shape: layout of a raw file; ignored otherwise.
        num_threads: CPU threads of the gather kernel (per calling thread); None = numba's setting.
        kernel: "auto" (numba when installed), "numba" or "torch" (index_select over the mapping).
        advice: optional ``madvise`` hint for the mapping: "random", "sequential" or "normal".
    """

    tier = "disk"

    def __init__(
        self,
        features: np.ndarray | str | os.PathLike,
        dtype=None,
        shape: tuple[int, int] | None = None,
        num_threads: int | None = None,
        kernel: str = "auto",
        advice: str | None = None,
    ) -> None:
        super().__init__()
        if kernel not in KERNELS:
            raise ValueError(
                f"unknown gather kernel {kernel!r}; choose one of {', '.join(KERNELS)}"
            )
        self.path: Path | None = None
        if isinstance(features, (str, os.PathLike)):
            self.path = Path(features)
            features = _open(self.path, dtype, shape)
        if not isinstance(features, np.memmap):
            raise TypeError(
                "MmapFeatureStore needs a np.memmap or a file path; "
                "use InMemoryFeatureStore for arrays held in RAM"
            )
        if features.ndim != 2:
            raise ValueError(f"features must be 2-D [num_rows, dim], got shape {features.shape}")
        if features.shape[1] == 0:
            raise ValueError("features have no columns (dim 0)")
        if not features.flags.c_contiguous:
            raise ValueError("memory-mapped features must be row-major (C-contiguous)")
        if advice is not None:
            _madvise(features, advice)
        self._mm = features
        self._src = np.asarray(features)  # plain ndarray view of the same mapping (no read)
        self.num_rows, self.dim = int(features.shape[0]), int(features.shape[1])
        self.dtype = torch.from_numpy(np.empty(0, dtype=features.dtype)).dtype
        self.device = torch.device("cpu")
        self.num_threads = num_threads
        self.kernel = kernel
        rows_b = self._src.view(np.uint8).reshape(self.num_rows, self.row_bytes)
        self._fast = HostRowGather(rows_b, self.dim, self.dtype)

    def __repr__(self) -> str:
        where = f", path={str(self.path)!r}" if self.path else ""
        return (
            f"MmapFeatureStore(num_rows={self.num_rows}, dim={self.dim}, dtype={self.dtype}{where})"
        )

    def gather(self, ids, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rows ``ids`` (global ids; int32/int64; repeats allowed) as a ``[len(ids), dim]`` CPU
        tensor, written into ``out[:len(ids)]`` when given. Reads only the pages of those rows.
        Raises IndexError for ids outside ``[0, num_rows)``, TypeError for non-integer ids."""
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
        gather_rows(self._src, idx, dst, self.kernel, self.num_threads)
        self.counters.add(self.tier, n, self.row_bytes)
        return dst


def _open(path: Path, dtype, shape) -> np.memmap:
    if not path.is_file():
        raise DatasetError(f"{path}: no such feature file")
    with open(path, "rb") as f:
        is_npy = f.read(6) == b"\x93NUMPY"
    if is_npy:
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            raise DatasetError(f"{path}: not a readable .npy file ({e})") from None
        return arr
    if dtype is None or shape is None:
        raise DatasetError(f"{path}: not a .npy file; give dtype= and shape= to map a raw file")
    need = int(np.prod(shape)) * np.dtype(dtype).itemsize
    have = path.stat().st_size
    if have < need:
        raise DatasetError(
            f"{path}: {have} bytes, but shape {tuple(shape)} of {dtype} needs {need}"
        )
    return np.memmap(path, dtype=dtype, mode="r", shape=tuple(shape))


def _madvise(arr: np.memmap, advice: str) -> None:
    if advice not in _ADVICE:
        raise ValueError(f"unknown advice {advice!r}; choose one of {', '.join(_ADVICE)}")
    m = getattr(arr, "_mmap", None)
    flag = _ADVICE[advice]
    if m is not None and flag is not None and hasattr(m, "madvise"):
        m.madvise(flag)
