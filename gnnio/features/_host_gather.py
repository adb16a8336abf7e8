"""The CPU stores' common call of the row gather, with as few Python steps as it can take.

:meth:`InMemoryFeatureStore.gather` and :meth:`MmapFeatureStore.gather` are called once per
mini-batch with a 1-D int64 (or int32) CPU tensor of ids and the loader's reused ``out=`` buffer.
For that call :class:`HostRowGather` goes straight to the prefetching kernel of
:mod:`gnnio.features._gather`: the ``out`` buffer is checked once and its byte view kept (until
its storage, shape, strides, dtype or device change), the kernel's per-source constants are
computed once, and the ids' range is checked inside the copy's pass as before. Any other call
(no ``out``, ids that are not such a tensor, a buffer too small, ``kernel="torch"``, a kernel
that has not compiled yet or cannot) takes the general path, which raises the errors.

Why: the Python between two kernel calls runs with cold caches, since each call streams tens of
megabytes through them. On the 2-core development VM the store's ~25 us of checks and views per
call took 270-400 us right after a 100k-row gather (25 us right after itself, 110-190 us after a
1 MB gather, also with one thread): 5-9 % of a 2^21-node graph's batch, where the bench's
ceiling loop calls its kernel back to back (docs/benchmarks.md).
"""

from __future__ import annotations

import numpy as np
import torch

from . import _gather as G

__all__ = ["HostRowGather"]

_INT_DTYPES = (torch.int64, torch.int32)


class HostRowGather:
    """``rows = HostRowGather(src_b, dim, dtype, kernel, num_threads)(ids, out)``:
    ``out[:len(ids)]`` with rows ``src[ids]`` written, or None when the call is not the common
    one (then nothing was read or written, and the caller takes
    :func:`~gnnio.features._gather.gather_rows`' path). Safe to call from several threads.

    Args:
        src_b: the store's rows as a ``[N, row_bytes]`` uint8 view (in RAM or a memmap).
        dim, dtype: the store's row width and torch dtype (what ``out`` must have).
        kernel: the store's gather kernel; only "auto" and "numba" take this path.
        num_threads: the store's kernel threads (set on the calling thread at each call, as
            ``gather_rows`` does), or None to keep numba's setting.
    """

    def __init__(
        self, src_b: np.ndarray, dim: int, dtype: torch.dtype, kernel: str, num_threads: int | None
    ) -> None:
        self.enabled = G.HAVE_NUMBA and kernel in ("auto", "numba") and src_b.size > 0
        self.num_rows = int(src_b.shape[0])
        self.dim, self.dtype = int(dim), dtype
        self._src_b = src_b
        if self.enabled:
            self._pf_lines = (min(self._src_b.shape[1], G.PREFETCH_MAX_BYTES) + 63) // 64
            self._last_off = G._last_line_offset(self._src_b)
        self._threads = None
        if num_threads is not None and G.HAVE_NUMBA:
            self._threads = max(1, min(int(num_threads), G.numba.config.NUMBA_NUM_THREADS))
        # ((data_ptr, shape, strides, dtype, device), [rows, row_bytes] uint8 view) of the last
        # checked buffer: one tuple, replaced whole, so that threads never pair a key and a view
        # of two buffers
        self._out: tuple | None = None

    def __call__(self, ids, out: torch.Tensor | None) -> torch.Tensor | None:
        if (
            not self.enabled
            or G._prefetch_ok is not True  # (the first call compiles, or falls back, there)
            or out is None
            or type(ids) is not torch.Tensor
            or ids.dtype not in _INT_DTYPES
            or ids.dim() != 1
            or ids.device.type != "cpu"
            or not ids.is_contiguous()
        ):
            return None
        idx = ids.numpy()
        n = idx.shape[0]
        if n == 0:
            return None
        out_b = self._out_view(out)
        if out_b is None or n > out_b.shape[0]:
            return None
        if self._threads is not None:  # (per thread in numba: set at every call)
            G.numba.set_num_threads(self._threads)
            chunks = 4 * self._threads
        else:
            chunks = 4 * G.numba.get_num_threads()
        bad = G._gather_rows_prefetch(
            self._src_b, idx, out_b, chunks, self._pf_lines, self._last_off
        )
        if bad:
            G.check_range(idx, self.num_rows)  # raises, naming the id
        G.kernel_ran("host_rows", "numba")
        return out[:n]

    def _out_view(self, out) -> np.ndarray | None:
        """The checked byte view of ``out`` (kept while ``out`` keeps its storage and layout),
        or None where ``out`` is not a whole contiguous CPU buffer of this store's rows."""
        if type(out) is not torch.Tensor:
            return None
        key = (out.data_ptr(), out.shape, out.stride(), out.dtype, out.device)
        cur = self._out
        if cur is not None and cur[0] == key:
            return cur[1]
        if (
            out.dim() != 2
            or out.shape[1] != self.dim
            or out.dtype != self.dtype
            or out.device.type != "cpu"
            or not out.is_contiguous()
            or out.numel() == 0
        ):
            return None
        view = G.row_bytes_view(out)
        self._out = (key, view)
        return view
