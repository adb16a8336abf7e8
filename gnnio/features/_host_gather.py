"""The CPU stores' common call of the row gather, with as few Python steps as it can take.

:meth:`InMemoryFeatureStore.gather` and :meth:`MmapFeatureStore.gather` are called once per
mini-batch with a 1-D int64 (or int32) CPU tensor of ids and the loader's reused ``out=`` buffer.
For that call :class:`HostRowGather` goes straight to the prefetching kernel of
:mod:`gnnio.features._gather`: a buffer is checked once and its byte view kept while the buffer
lives (the loader passes ``slot[:n]``: the slot is what is kept, so batches of any size up to it
hit), the kernel's per-source constants are computed once, and the ids' range is checked inside
the copy's pass as before. Any other call
(no ``out``, ids that are not such a tensor, a buffer too small, ``kernel="torch"``, a kernel
that has not compiled yet or cannot) takes the general path, which raises the errors.

Why: the Python between two kernel calls runs with cold caches, since each call streams tens of
megabytes through them. On the 2-core development VM the store's ~25 us of checks and views per
call took 270-400 us right after a 100k-row gather (25 us right after itself, 110-190 us after a
1 MB gather, also with one thread): 5-9 % of a 2^21-node graph's batch, where the bench's
ceiling loop calls its kernel back to back (docs/benchmarks.md).
"""

from __future__ import annotations

import weakref

import numpy as np
import torch

from . import _gather as G

__all__ = ["HostRowGather"]

_INT_DTYPES = (torch.int64, torch.int32)
_MAX_VIEWS = 16  # buffers kept checked at once (the loader's ring has prefetch + 2)


class HostRowGather:
    """``rows = HostRowGather(src_b, dim, dtype)(ids, out, kernel, num_threads)``:
    ``out[:len(ids)]`` with rows ``src[ids]`` written, or None when the call is not the common
    one (then nothing was read or written, and the caller takes
    :func:`~gnnio.features._gather.gather_rows`' path). Safe to call from several threads.

    Args:
        src_b: the store's rows as a ``[N, row_bytes]`` uint8 view (in RAM or a memmap).
        dim, dtype: the store's row width and torch dtype (what ``out`` must have).

    Each call takes the store's ``kernel`` (only "auto" and "numba" take this path) and
    ``num_threads`` as they are then (``--isolation auto`` sets a store's threads after it is
    built): the threads are set on the calling thread at each call, as ``gather_rows`` does;
    None keeps numba's setting.
    """

    def __init__(self, src_b: np.ndarray, dim: int, dtype: torch.dtype) -> None:
        self.enabled = G.HAVE_NUMBA and src_b.size > 0
        self.num_rows = int(src_b.shape[0])
        self.dim, self.dtype = int(dim), dtype
        self._src_b = src_b
        if self.enabled:
            self._pf_lines = G.prefetch_lines(self._src_b.shape[1])
            self._last_off = G._last_line_offset(self._src_b)
        # (data_ptr, strides, dtype, device) of a checked buffer -> (its rows, its [rows, row_bytes]
        # uint8 view); the loader passes ``slot[:n]``, so a buffer is cached as its base tensor's
        # rows, and an entry lives while that base tensor does (weakref.finalize)
        self._views: dict[tuple, tuple[int, np.ndarray]] = {}

    def __call__(
        self, ids, out: torch.Tensor | None, kernel: str, num_threads: int | None
    ) -> torch.Tensor | None:
        if (
            not self.enabled
            or (kernel != "auto" and kernel != "numba")
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
        out_b = self._out_view(out, n)
        if out_b is None:
            return None
        chunks = 4 * G.set_numba_threads(num_threads)  # (per thread in numba: set every call)
        bad = G._gather_rows_prefetch(
            self._src_b, idx, out_b, chunks, self._pf_lines, self._last_off
        )
        if bad:
            G.check_range(idx, self.num_rows)  # raises, naming the id
        G.kernel_ran("host_rows", "numba")
        return out if n == out.shape[0] else out[:n]  # (the loader's slot[:n]: out itself)

    def _out_view(self, out, n: int) -> np.ndarray | None:
        """A byte view of at least ``n`` rows starting where ``out`` starts, or None where
        ``out`` is not a contiguous 2-D CPU buffer of this store's rows with ``n`` rows or more.
        On a hit (same address, strides, dtype and device as a buffer checked before, and
        ``n`` within both) only the shape is read: those strides with this row width mean
        contiguous, so ``out``'s first ``n`` rows are the ``n`` rows at that address, which is
        all the kernel writes through the view, whichever tensor the entry was made from."""
        if type(out) is not torch.Tensor:
            return None
        shape = out.shape
        if len(shape) != 2 or shape[1] != self.dim or n > shape[0]:
            return None
        key = (out.data_ptr(), out.stride(), out.dtype, out.device)
        hit = self._views.get(key)
        if hit is not None and n <= hit[0]:
            return hit[1]
        if out.dtype != self.dtype or out.device.type != "cpu" or not out.is_contiguous():
            return None
        base = out._base  # (the loader's ``slot[:n]``: cache the whole slot)
        if not (
            type(base) is torch.Tensor
            and base.data_ptr() == key[0]
            and base.dim() == 2
            and base.shape[1] == self.dim
            and base.dtype == self.dtype
            and base.is_contiguous()
        ):
            base = out
        view = G.row_bytes_view(base)
        if len(self._views) >= _MAX_VIEWS:
            self._views.clear()
        self._views[key] = entry = (int(base.shape[0]), view)
        weakref.finalize(base, _forget, weakref.ref(self), key, entry)
        return view


def _forget(ref, key, entry) -> None:
    """Drop a cached view once its base tensor is gone (unless a newer entry took the key)."""
    self = ref()
    if self is not None and self._views.get(key) is entry:
        self._views.pop(key, None)
