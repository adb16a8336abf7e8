"""Cross-batch feature reuse (HyDRA, §II-B2 and §III-B1): rows the previous batch already brought to
the device are copied from its tensor instead of being fetched again.

HyDRA's bookkeeping, vectorized. Two dense vectors over all ``N`` node ids:

* **ValPt** (int8): a node's presence mark. The ids of successive batches are marked alternately
  ``1`` and ``2``; adding the current batch's mark to the stored one gives ``3`` for a node the
  previous batch also had ("reuse within the same batch features") and the current mark alone for
  a node that must be fetched. Marks of the previous batch are cleared after each step, so both
  passes cost O(batch), never O(N).
* **LocPt** (int32/int64): the row of each node in the previous batch's feature tensor.

The **redundancy rate** ``eta1`` of a batch is the share of its (distinct) input nodes that the
previous batch also had (HyDRA Fig. 4); the first batch has no predecessor and is left out of
means.

:class:`CrossBatchReuse` wraps any feature store (a cache, a tiered or multi-device store): only
the rows the previous batch did not have reach ``backing``. It keeps a *reference* to the rows it
returned last (the caller's ``out`` buffer, if given): the caller must not modify them before the
next ``gather`` (a loader that recycles ``out`` buffers is fine -- only this store writes into them;
with ``keep="copy"`` the store keeps a private copy instead, one device-local copy per batch).
When ``out`` is the previous batch's own buffer the reused rows are read out first.
:func:`redundancy_rates` measures ``eta1`` for a sequence of batches without any features.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from ...utils.devices import resolve_device
from .._gather import output_rows
from ..accounting import EventLaps, _Timer
from ..base import FeatureStore
from ..batch_ops import FirstOccurrence, ids_on, move_rows

__all__ = ["CrossBatchReuse", "ReuseTracker", "redundancy_rates"]


class ReuseTracker:
    """HyDRA's ValPt / LocPt over ``num_rows`` ids on ``device`` (module docstring)."""

    def __init__(self, num_rows: int, device: str | torch.device = "cpu"):
        self.device = resolve_device(device)
        self.valpt = torch.zeros(num_rows, dtype=torch.int8, device=self.device)
        loc_dtype = torch.int32 if num_rows < 2**31 else torch.int64
        self.locpt = torch.zeros(num_rows, dtype=loc_dtype, device=self.device)
        self.mark = 1  # the mark of the next batch
        self.prev: torch.Tensor | None = None

    def step(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Register the next batch (distinct int64 ids on ``device``).

        Returns:
            ``(reuse, src, fetch)``: positions in ``ids`` of the nodes the previous batch had,
            their rows in the previous batch, and the positions of the other nodes.
        """
        cur, prev_mark = self.mark, 3 - self.mark
        score = self.valpt.index_select(0, ids) + cur  # 3: in both batches; cur: new
        both = score == prev_mark + cur
        reuse = torch.nonzero(both).flatten()
        fetch = torch.nonzero(~both).flatten()
        src = self.locpt.index_select(0, ids.index_select(0, reuse)).long()
        if self.prev is not None:
            self.valpt.index_fill_(0, self.prev, 0)
        self.valpt.index_fill_(0, ids, cur)
        self.locpt.index_copy_(
            0, ids, torch.arange(ids.numel(), dtype=self.locpt.dtype, device=self.device)
        )
        self.prev = ids
        self.mark = prev_mark
        return reuse, src, fetch

    def reset(self) -> None:
        """Forget the previous batch."""
        if self.prev is not None:
            self.valpt.index_fill_(0, self.prev, 0)
        self.prev = None
        self.mark = 1


def redundancy_rates(batches, num_rows: int) -> np.ndarray:
    """``eta1`` of every batch after the first: the share of its distinct ids that the batch
    before it also had. ``batches``: iterable of 1-D int id arrays/tensors (global ids)."""
    tr = ReuseTracker(num_rows)
    dedup = FirstOccurrence(num_rows, torch.device("cpu"))
    out = []
    for i, b in enumerate(batches):
        ids = torch.as_tensor(np.asarray(b, dtype=np.int64))
        uniq, _ = dedup(ids)
        reuse, _, _ = tr.step(uniq)
        if i > 0:
            out.append(reuse.numel() / max(1, uniq.numel()))
    return np.asarray(out, dtype=np.float64)


class CrossBatchReuse(FeatureStore):
    """Reuse the previous batch's rows; fetch only the rest from ``backing`` (module docstring).

    Args:
        backing: where the rows not in the previous batch come from.
        device: where rows are returned and kept (default ``backing.device``).
        tier: counter name of reused rows (and of repeats inside a batch), default ``"reuse"``.
        keep: ``"reference"`` (keep the returned tensor) or ``"copy"`` (keep a private copy).
        timing: time bookkeeping apart from data movement (CUDA events on a GPU; the event-timed
            seconds reach ``stats`` as the events complete, all of them after :meth:`flush`).

    Attributes:
        stats: dict with ``batches``, ``rows``, ``unique``, ``reused``, ``fetched``,
            ``eta1_sum`` / ``eta1_batches`` (batches with a predecessor), ``manage_s``, ``copy_s``.
    """

    def __init__(
        self,
        backing: FeatureStore,
        device: str | torch.device | None = None,
        tier: str = "reuse",
        keep: str = "reference",
        timing: bool = True,
    ) -> None:
        super().__init__()
        if keep not in ("reference", "copy"):
            raise ValueError(f"keep must be 'reference' or 'copy', got {keep!r}")
        self.backing = backing
        self.num_rows, self.dim, self.dtype = backing.num_rows, backing.dim, backing.dtype
        self.device = resolve_device(device) if device is not None else backing.device
        self.tier, self.keep, self.timing = tier, keep, bool(timing)
        self.tracker = ReuseTracker(self.num_rows, self.device)
        self._dedup = FirstOccurrence(self.num_rows, self.device)
        self._prev_rows: torch.Tensor | None = None
        self._lock = threading.Lock()
        self._laps = EventLaps()
        self.stats = self._zero_stats()

    @staticmethod
    def _zero_stats() -> dict:
        return dict(
            batches=0,
            rows=0,
            unique=0,
            reused=0,
            fetched=0,
            eta1_sum=0.0,
            eta1_batches=0,
            manage_s=0.0,
            copy_s=0.0,
        )

    @property
    def eta1(self) -> float:
        """Mean redundancy rate over the batches that had a predecessor."""
        s = self.stats
        return s["eta1_sum"] / s["eta1_batches"] if s["eta1_batches"] else 0.0

    def reset_stats(self) -> None:
        self._laps = EventLaps()
        self.stats = self._zero_stats()
        self.counters.reset()

    def reset(self) -> None:
        """Forget the previous batch (e.g. when the caller reuses its buffer for something else)."""
        with self._lock:
            self.tracker.reset()
            self._prev_rows = None

    def __repr__(self) -> str:
        return f"CrossBatchReuse(keep={self.keep!r}, backing={self.backing!r})"

    def gather(self, ids, out: torch.Tensor | None = None) -> torch.Tensor:
        idx = ids_on(self, ids, self.device)
        n = int(idx.numel())
        dst = output_rows(out, n, self.dim, self.dtype, self.device)
        if n == 0:
            return dst
        with self._lock:
            try:
                self._gather(idx, dst)
            except BaseException:
                self.tracker.reset()  # keep ValPt/LocPt and the kept rows in step
                self._prev_rows = None
                raise
        return dst

    def _gather(self, idx: torch.Tensor, dst: torch.Tensor) -> None:
        timer = _Timer(self.device, self.timing, self._laps)
        uniq, inv = self._dedup(idx)
        had_prev = self._prev_rows is not None
        reuse, src, fetch = self.tracker.step(uniq)
        manage = timer.lap("manage")
        u = int(uniq.numel())
        rows_u = (
            dst if inv is None else torch.empty((u, self.dim), dtype=self.dtype, device=self.device)
        )
        prev = self._prev_rows
        if reuse.numel():
            assert prev is not None  # (rows reused: a predecessor's rows are kept)
            if prev.untyped_storage().data_ptr() == rows_u.untyped_storage().data_ptr():
                prev = prev.index_select(0, src)  # writing into the buffer being read: copy first
                src = torch.arange(prev.shape[0], device=self.device)
            move_rows(prev, src, rows_u, reuse)
        below = None
        if fetch.numel():
            with self.backing.counters.counting() as below:  # this thread's rows, no wait
                fetched = self.backing.gather(uniq.index_select(0, fetch).to(self.backing.device))
            move_rows(
                fetched.to(self.device),
                torch.arange(fetch.numel(), device=self.device),
                rows_u,
                fetch,
            )
        if inv is not None:
            move_rows(rows_u, inv, dst, None)
        self._prev_rows = rows_u.clone() if self.keep == "copy" else rows_u
        copy = timer.lap("copy")

        n, f = int(idx.numel()), int(fetch.numel())
        if n - f:
            self.counters.add(self.tier, n - f, self.row_bytes)
        if below is not None:
            self.counters.add_count(below, self.row_bytes)
        s = self.stats
        s["batches"] += 1
        s["rows"] += n
        s["unique"] += u
        s["reused"] += int(reuse.numel())
        s["fetched"] += f
        if had_prev:
            s["eta1_sum"] += reuse.numel() / u
            s["eta1_batches"] += 1
        s["manage_s"] += manage
        s["copy_s"] += copy
        self.flush(wait=False)

    def flush(self, wait: bool = True) -> None:
        """Add the seconds of completed event-timed laps (CUDA) to ``stats``."""
        if len(self._laps):
            for phase, sec in self._laps.resolve(wait).items():
                self.stats[f"{phase}_s"] += sec
