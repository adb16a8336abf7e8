"""Per-batch operations of the feature-store wrappers (caches, cross-batch reuse): validated ids on
the wrapper's device (:func:`ids_on`), first-occurrence dedup of a batch (:class:`FirstOccurrence`)
and row copies between tensors (:func:`move_rows`, a parallel numba byte copy on the CPU)."""

from __future__ import annotations

import numpy as np
import torch

from ._gather import HAVE_NUMBA, as_index_array, copy_rows, word_views
from .base import FeatureStore, ids_vouched

__all__ = ["FirstOccurrence", "ids_on", "move_rows"]

_I32_MAX = 2**31 - 1


class FirstOccurrence:
    """Vectorized dedup keeping first occurrences, with a dense ``[num_rows]`` int32 scratch array
    (reset after every call, so it costs O(batch), not O(num_rows), per call)."""

    def __init__(self, num_rows: int, device: torch.device):
        self.pos = torch.full((num_rows,), _I32_MAX, dtype=torch.int32, device=device)

    def __call__(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(unique, inverse)``: the distinct ids of int64 ``ids`` in order of first occurrence,
        and ``inverse`` (int64, ``unique[inverse] == ids``), or None when ``ids`` had no repeats
        (then ``unique`` is ``ids`` itself)."""
        n = ids.numel()
        if n >= _I32_MAX:
            raise ValueError(f"a batch of {n} ids is too large (limit {_I32_MAX - 1})")
        first, is_first = first_positions(self.pos, ids)
        if bool(is_first.all()):
            return ids, None
        uniq = ids[is_first]
        rank = torch.cumsum(is_first, 0) - 1
        return uniq, rank.index_select(0, first.long())

    def nbytes(self) -> int:
        return self.pos.numel() * self.pos.element_size()


def first_positions(pos: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(first, is_first)``: for each entry of int64 ``ids``, the position of its id's first
    occurrence (int32), and whether it is that occurrence. ``pos`` is a dense int32 scratch of
    ``[num_rows]`` entries all ``2^31 - 1``, left so (O(batch) work, no host sync)."""
    ar = torch.arange(ids.numel(), dtype=torch.int32, device=ids.device)
    pos.scatter_reduce_(0, ids, ar, "amin")
    first = pos.index_select(0, ids)
    pos.index_fill_(0, ids, _I32_MAX)
    return first, first == ar


def ids_on(store: FeatureStore, ids, device: torch.device) -> torch.Tensor:
    """Validated int64 ids on ``device`` (validated on the device when already there)."""
    if isinstance(ids, torch.Tensor) and ids.device == device and device.type != "cpu":
        if ids.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"feature ids must be int32/int64, got a tensor of {ids.dtype}")
        if ids.dim() != 1:
            raise ValueError(f"feature ids must be 1-D, got shape {tuple(ids.shape)}")
        if ids.numel() and not ids_vouched():
            lo, hi = (int(v) for v in torch.aminmax(ids))
            if lo < 0 or hi >= store.num_rows:
                raise IndexError(
                    f"feature id {lo if lo < 0 else hi} out of range [0, {store.num_rows})"
                )
        return ids.long()
    arr = as_index_array(ids, store.num_rows)
    return torch.from_numpy(arr).to(device=device, dtype=torch.int64)


if HAVE_NUMBA:
    from numba import njit, prange

    @njit(parallel=True, nogil=True, cache=True)
    def _move_bytes(src, src_idx, dst, dst_idx):  # pragma: no cover - compiled
        for i in prange(src_idx.shape[0]):
            dst[dst_idx[i], :] = src[src_idx[i], :]


def _bytes2d(t: torch.Tensor) -> np.ndarray:
    return t.view(torch.uint8).numpy().reshape(t.shape[0], t.shape[1] * t.element_size())


def move_rows(
    src: torch.Tensor, src_idx: torch.Tensor, dst: torch.Tensor, dst_idx: torch.Tensor | None
) -> None:
    """``dst[dst_idx[i]] = src[src_idx[i]]`` for every ``i`` (``dst_idx=None``: ``dst[i]``).

    On the CPU a parallel numba byte-copy kernel (one pass, no temporary); on one GPU
    :func:`~gnnio.features._gather.copy_rows` (the Triton row kernel where Triton is installed);
    across devices ``index_select`` + ``index_copy_``. ``src`` and ``dst`` are contiguous 2-D
    tensors of the same width and dtype; indices int64 on their device.
    """
    if src_idx.numel() == 0:
        return
    cpu = src.device.type == "cpu" and dst.device.type == "cpu"
    if HAVE_NUMBA and cpu and src.is_contiguous() and dst.is_contiguous():
        di = np.arange(src_idx.numel(), dtype=np.int64) if dst_idx is None else dst_idx.numpy()
        s_w, d_w = word_views(_bytes2d(src), _bytes2d(dst))  # 8-byte words where rows allow
        _move_bytes(s_w, src_idx.numpy(), d_w, di)
        return
    if src.device == dst.device:
        copy_rows(
            src, src_idx.to(src.device), dst, None if dst_idx is None else dst_idx.to(dst.device)
        )
        return
    rows = src.index_select(0, src_idx.to(src.device)).to(dst.device)
    if dst_idx is None:
        dst[: rows.shape[0]].copy_(rows)
    else:
        dst.index_copy_(0, dst_idx.to(dst.device), rows)
