"""Tiered feature store (Data Tiering, Min et al.): hot rows in GPU memory, cold rows in pinned
host memory read by the GPU over PCIe, behind one logical ``gather(ids)``.

Tiers, as named in :attr:`TieredFeatureStore.counters` and in training summaries'
``bytes_by_tier``:

* ``"gpu"`` -- rows served from the GPU tier (the hot rows, resident in device memory);
* ``"host"`` -- rows read from host memory and moved over the host->GPU link (the cold rows).
  On a GPU these are the PCIe bytes of feature reads; with simulated devices the same count.

Routing an id to its tier (vectorised: one mask, two gathers, one scatter):

* **prefix mode** (``hot=H``; the data was reordered by score so the hot rows are ids ``[0, H)``,
  see ``gnnio.preprocess.reorder``): the paper's "hot data boundary" check ``id < H``; a hot id is its own
  slot in the GPU tier. No extra memory.
* **lookup mode** (``hot_ids=...``; any chosen set, no reordering): an int32 table ``id -> hot slot
  or -1`` of ``num_rows`` entries, held in the GPU tier next to the hot rows and counted in its
  budget (the paper reorders instead because this table costs 4 bytes per node).

Cold path (``cold_mode``):

* ``"zero_copy"`` (the paper's access method): the backing's host tensor is pinned in place
  (``cudaHostRegister``) and exposed as a CUDA view (:mod:`gnnio.features.tiers.uva`); cold rows are
  gathered by a GPU kernel straight from host memory, with no CPU gather and no staging copy.
* ``"cpu_gather"``: the CPU gathers cold rows through the backing store into a reused (pinned)
  staging buffer, which is then copied to the GPU (the baseline the paper compares against; the
  only option for a disk-backed backing).
* ``"auto"``: zero-copy when the backing holds its rows in a RAM tensor and pinning it works;
  otherwise CPU gather + copy, saying why in :attr:`TieredFeatureStore.cold_mode_reason` (and with
  a :class:`TieringWarning` when pinning failed).

Devices: on a CUDA device rows really move. With ``device="cpu"`` (or ``simulate=True``) the GPU
is simulated (:mod:`gnnio.features.tiers.simdevice`): the hot tier and the lookup table are CPU tensors
allocated on a :class:`~gnnio.features.tiers.simdevice.SimulatedDevice`, zero-copy "reads" index the host
tensor directly, and every row and byte is counted exactly as on a GPU. Only times differ.

Robustness: a zero-byte pin is never requested (hot fraction 1, empty tables, zero-width rows);
a failing pin either raises :class:`~gnnio.features.tiers.uva.PinError` (``cold_mode="zero_copy"``) or
falls back to CPU gather + copy with a warning (``"auto"``); the GPU tier (hot rows + lookup table)
never exceeds ``gpu_budget_bytes``: the number of hot rows is clamped, with a warning and
:attr:`TieredFeatureStore.clamped_by_budget`.

Code: the store (routing, the hot tier, the budget) is here; the cold path (pinning, zero-copy,
CPU gather + staging) is :class:`~gnnio.features.tiers.tiered_cold.ColdPath`; reading the backing rows on
the CPU, whatever holds them, is :class:`~gnnio.features.tiers.row_source.RowSource`.

The multi-GPU extension of the paper (hot rows interleaved over NVLink peers, optionally the
hottest replicated on every GPU) is a placement concern: it adds a "peer" tier on top of the same
routing and lives with the placement code, which can reuse :class:`SimulatedDevice`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import torch

from ...errors import GnnioError, UsageError
from ...preprocess.reorder import order_by_score
from ...utils.counts import top_count
from ...utils.devices import resolve_device
from ...utils.progress import bar
from ...utils.warnings_at import warn
from .._gather import as_index_array, check_out, copy_rows, copy_tiered
from ..base import DeviceRows, FeatureStore, ids_vouched
from . import uva
from .row_source import RowSource, num_rows_of, unique_in_order
from .simdevice import SimulatedDevice
from .tiered_cold import ColdPath, TieringWarning

__all__ = ["COLD_MODES", "TieredFeatureStore", "TieringWarning", "hot_rows_for_fraction"]

COLD_MODES = ("auto", "zero_copy", "cpu_gather")

#: tier names (the keys of ``counters.rows`` / ``counters.bytes``)
GPU_TIER = "gpu"
HOST_TIER = "host"


def hot_rows_for_fraction(fraction: float, num_rows: int) -> int:
    """Hot rows for a hot ``fraction`` of ``num_rows``: :func:`gnnio.utils.counts.top_count` (nearest
    count, halves up, at least 1 for a positive fraction, fractions >= 1 mean all rows).

    Raises:
        ValueError: ``fraction`` is negative or not finite.
    """
    try:
        return top_count(fraction, num_rows)
    except ValueError:
        raise ValueError(f"hot fraction must be a finite number >= 0, got {fraction!r}") from None


class TieredFeatureStore(FeatureStore):
    """A two-tier feature store: hot rows on the GPU, cold rows in (pinned) host memory.

    Args:
        backing: where all rows come from: any CPU :class:`~gnnio.features.base.FeatureStore`
            (composition; it keeps counting its own reads, e.g. tier "disk" for a memory-mapped
            store), a NumPy array (a ``np.memmap`` stays on disk) or a CPU tensor ``[N, F]``.
            Rows of an in-RAM array/tensor are shared, not copied. A store offering
            ``host_tensor() -> torch.Tensor | None`` (its rows as one CPU tensor in RAM) can be
            read zero-copy; other stores are read through their ``gather``.
        hot: prefix mode: the number of hot rows ``H``; ids ``[0, H)`` are hot (after reordering
            by score). Values above ``N`` mean all rows.
        hot_ids: lookup mode: the hot global ids, hottest first (kept in this order when the
            budget clamps them; repeats are dropped). Give exactly one of ``hot`` and ``hot_ids``.
        device: ``"cuda"`` / ``"cuda:i"`` / a torch device: the GPU holding the hot tier and
            receiving gathered rows. ``"cpu"``: the GPU is simulated in CPU memory and rows are
            returned on the CPU.
        gpu_budget_bytes: most bytes the GPU tier (hot rows + lookup table) may take; the number
            of hot rows is clamped to fit (with a :class:`TieringWarning`). None = no budget.
        cold_mode: ``"auto"``, ``"zero_copy"`` or ``"cpu_gather"`` (see module docstring).
        simulate: None = simulate exactly when ``device`` is the CPU; True = simulate even for a
            CUDA device (rows then return on the CPU); False = insist on a real GPU; or a
            :class:`~gnnio.features.tiers.simdevice.SimulatedDevice` to hold the simulated GPU tier
            (its capacity then acts as the device memory).
        pin_fn: the function that pins the host tensor for zero-copy reads and returns a handle
            (with an optional ``release()``); default :func:`gnnio.features.tiers.uva.pin_host_tensor`
            on a GPU, :func:`gnnio.features.tiers.simdevice.simulated_pin` when simulated. Any
            exception it raises counts as a pin failure. Never called with zero bytes.
        chunk_rows: rows per chunk while loading the hot tier.
        progress: show a progress bar while loading the hot tier.

    Attributes:
        mode: ``"prefix"`` or ``"lookup"``.
        num_hot: hot rows actually held in the GPU tier; ``requested_hot`` before the budget clamp.
        clamped_by_budget: True when the budget cut the hot set.
        gpu_tier_bytes: bytes of the GPU tier (hot rows + lookup table).
        load_bytes: one-time bytes copied host->GPU to fill the hot tier (not in ``counters``).
        cold_mode_used: ``"zero_copy"``, ``"cpu_gather"`` or ``"none"`` (no cold rows).
        cold_mode_reason: why ``cold_mode_used`` is what it is (one line).
        simulated: True when the GPU is simulated; ``gpu_name`` names it (``"sim:cuda:0"``).
        counters: rows/bytes per tier (``"gpu"``, ``"host"``) served by :meth:`gather`.

    Threads: concurrent :meth:`gather` calls return correct rows (the reused staging buffer of the
    CPU-gather path is guarded by a lock), but counter updates are not atomic across threads.
    """

    def __init__(
        self,
        backing: FeatureStore | np.ndarray | torch.Tensor,
        hot: int | None = None,
        *,
        hot_ids: Any = None,
        device: str | torch.device = "cpu",
        gpu_budget_bytes: int | None = None,
        cold_mode: str = "auto",
        simulate: bool | SimulatedDevice | None = None,
        pin_fn: Callable[[torch.Tensor], Any] | None = None,
        chunk_rows: int = 1 << 16,
        progress: bool = False,
    ) -> None:
        super().__init__()
        if cold_mode not in COLD_MODES:
            raise ValueError(f"cold_mode must be one of {', '.join(COLD_MODES)}, got {cold_mode!r}")
        if (hot is None) == (hot_ids is None):
            raise ValueError("give exactly one of hot (prefix mode) and hot_ids (lookup mode)")
        if gpu_budget_bytes is not None and gpu_budget_bytes < 0:
            raise ValueError(f"gpu_budget_bytes must be >= 0, got {gpu_budget_bytes}")
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
        self._src = RowSource(backing)
        self.backing = backing
        self.num_rows, self.dim, self.dtype = self._src.num_rows, self._src.dim, self._src.dtype
        self._resolve_device(device, simulate)
        self.cold_mode = cold_mode
        self.gpu_budget_bytes = gpu_budget_bytes

        # ---- which rows are hot (before the budget) ---------------------------------------------
        n = self.num_rows
        if hot is not None:
            self.mode = "prefix"
            if not 0 <= float(hot) < float("inf") or int(hot) != hot:  # (NaN too)
                raise ValueError(f"hot must be a non-negative integer, got {hot!r}")
            self.requested_hot = min(int(hot), n)
            wanted = None
        else:
            self.mode = "lookup"
            wanted = unique_in_order(as_index_array(hot_ids, n).astype(np.int64, copy=False))
            self.requested_hot = int(wanted.shape[0])

        # ---- the budget clamp ------------------------------------------------------------------
        rb = self.row_bytes
        self._table_dtype = torch.int32 if n < 2**31 else torch.int64
        table_bytes = n * torch.empty((), dtype=self._table_dtype).element_size()
        h = self.requested_hot
        if self.mode == "prefix":
            table_bytes = 0
        if gpu_budget_bytes is not None and _tier_bytes(h, rb, table_bytes) > gpu_budget_bytes:
            room = gpu_budget_bytes - table_bytes
            h = 0 if room < 0 else (h if rb == 0 else min(h, room // rb))
            warn(
                f"TieredFeatureStore: gpu_budget_bytes={gpu_budget_bytes} "
                f"({uva.format_bytes(gpu_budget_bytes)}) holds {h} of the {self.requested_hot} "
                f"requested hot rows ({rb} B/row"
                + (f", plus a {uva.format_bytes(table_bytes)} lookup table" if table_bytes else "")
                + f"); hot rows clamped to {h}",
                TieringWarning,
            )
        self.num_hot = int(h)
        self.clamped_by_budget = self.num_hot < self.requested_hot
        self._hot_ids = (
            np.arange(self.num_hot, dtype=np.int64) if wanted is None else wanted[: self.num_hot]
        )
        self.gpu_tier_bytes = _tier_bytes(self.num_hot, rb, table_bytes)

        # ---- fill the GPU tier, then set up the cold path -------------------------------------
        self._hot = self._alloc((self.num_hot, self.dim), self.dtype)
        self.load_bytes = self._load_hot(chunk_rows, progress)
        self._table: torch.Tensor | None = None
        if self.mode == "lookup" and self.num_hot > 0:
            self._table = self._alloc((n,), self._table_dtype)
            self._table.fill_(-1)
            hot_dev = torch.from_numpy(self._hot_ids).to(self._table.device)
            self._table[hot_dev] = torch.arange(
                self.num_hot, dtype=self._table_dtype, device=self._table.device
            )
        self._cold = ColdPath(self._src, self.device, self.simulated)
        self._cold.setup(cold_mode, pin_fn, all_hot=self.num_hot == self.num_rows)
        self.cold_mode_used, self.cold_mode_reason = self._cold.mode_used, self._cold.reason

    # ---------------------------------------------------------------------------------------------
    # constructors
    @classmethod
    def from_scores(
        cls,
        backing: FeatureStore | np.ndarray | torch.Tensor,
        score: Any,
        fraction: float,
        **kwargs: Any,
    ) -> TieredFeatureStore:
        """Lookup mode with the hot set = the ``top_count(fraction, N)`` highest-scoring ids, ranked by
        :func:`gnnio.preprocess.reorder.order_by_score` (ties: lower id first; non-finite scores refused).
        ``score``: ``[N]`` numbers, higher = hotter (any hotness score, or true access counts for an
        oracle). ``kwargs`` go to the constructor."""
        n = num_rows_of(backing)
        s = score.detach().cpu().numpy() if isinstance(score, torch.Tensor) else np.asarray(score)
        if s.ndim != 1 or s.shape[0] != n:
            raise ValueError(f"score must have shape [{n}] (one per row), got {tuple(s.shape)}")
        h = hot_rows_for_fraction(fraction, n)
        # the same ranking gnnio.preprocess.reorder relabels by, so prefix and lookup mode agree
        return cls(backing, hot_ids=order_by_score(s)[:h], **kwargs)

    @classmethod
    def from_reordered(
        cls, backing: FeatureStore | np.ndarray | torch.Tensor, fraction: float, **kwargs: Any
    ) -> TieredFeatureStore:
        """Prefix mode for data already reordered hottest-first: ids ``[0, top_count(fraction, N))``
        are hot (:func:`hot_rows_for_fraction`). ``kwargs`` go to the constructor."""
        return cls(backing, hot=hot_rows_for_fraction(fraction, num_rows_of(backing)), **kwargs)

    # ---------------------------------------------------------------------------------------------
    # setup helpers
    def _resolve_device(self, device: str | torch.device, simulate: Any) -> None:
        dev = torch.device(device)
        sim_dev = simulate if isinstance(simulate, SimulatedDevice) else None
        if dev.type == "cuda":
            if simulate is True or sim_dev is not None:
                self.simulated = True
            elif not uva.cuda_available():
                raise UsageError(
                    f"device {dev} asked for but CUDA is not available; use device='cpu' "
                    "(the GPU tier is then simulated in CPU memory)"
                )
            else:
                self.simulated = False
                dev = resolve_device(dev)
        elif dev.type == "cpu":
            if simulate is False:
                raise UsageError("simulate=False needs a CUDA device, got device='cpu'")
            self.simulated = True
        else:
            raise UsageError(
                f"device {dev}: TieredFeatureStore supports CUDA devices and 'cpu' (simulated GPU)"
            )
        if self.simulated:
            name = f"sim:{dev}" if dev.type == "cuda" else "sim:cuda:0"
            sim = sim_dev if sim_dev is not None else SimulatedDevice(name)
            self.sim_device: SimulatedDevice | None = sim
            self.gpu_name = sim.name
            self.device = torch.device("cpu")
        else:
            self.sim_device = None
            self.gpu_name = str(dev)
            self.device = dev

    def _alloc(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A tensor in the GPU tier (real device memory, or counted on the simulated device)."""
        if self.sim_device is not None:
            return self.sim_device.empty(shape, dtype)
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        try:
            return torch.empty(shape, dtype=dtype, device=self.device)
        except torch.cuda.OutOfMemoryError:
            free, total = torch.cuda.mem_get_info(self.device)
            raise GnnioError(
                f"GPU tier: cannot allocate {uva.format_bytes(nbytes)} on {self.device} "
                f"({uva.format_bytes(free)} free of {uva.format_bytes(total)}); "
                "lower the hot fraction or set gpu_budget_bytes"
            ) from None

    def _load_hot(self, chunk_rows: int, progress: bool) -> int:
        """Copy the hot rows into the GPU tier in chunks; returns the bytes copied."""
        h = self.num_hot
        if h == 0 or self.dim == 0:
            return 0
        buf = torch.empty((min(chunk_rows, h), self.dim), dtype=self.dtype)
        with bar(total=h, desc="hot rows -> GPU tier", unit="row", enabled=progress) as pb:
            for s in range(0, h, chunk_rows):
                e = min(h, s + chunk_rows)
                if self.mode == "prefix":
                    rows = self._src.read_range(s, e, buf)
                else:
                    self._src.read(self._hot_ids[s:e], buf)
                    rows = buf[: e - s]
                self._hot[s:e].copy_(rows)
                pb.update(e - s)
        return h * self.row_bytes

    # ---------------------------------------------------------------------------------------------
    # gather
    def _ids_on_device(self, ids: Any) -> torch.Tensor:
        """Validated int64 global ids on ``self.device`` (IndexError/TypeError/ValueError)."""
        if isinstance(ids, torch.Tensor) and ids.device.type == "cuda":
            if ids.dtype == torch.bool or ids.is_floating_point() or ids.is_complex():
                raise TypeError(f"feature ids must be integers, got a tensor of {ids.dtype}")
            if ids.dim() != 1:
                raise ValueError(f"feature ids must be 1-D, got shape {tuple(ids.shape)}")
            if ids.numel() and not ids_vouched():
                lo, hi = (int(v) for v in torch.aminmax(ids))
                if lo < 0 or hi >= self.num_rows:
                    bad = lo if lo < 0 else hi
                    raise IndexError(f"feature id {bad} out of range [0, {self.num_rows})")
            return ids.to(self.device, torch.int64)
        t = torch.from_numpy(as_index_array(ids, self.num_rows))
        return t.to(self.device, torch.int64)

    def _slots(self, ids: torch.Tensor) -> torch.Tensor:
        """Each id's slot in the GPU tier, -1 for a cold id (on ``self.device``; num_hot > 0)."""
        if self.mode == "prefix":
            return torch.where(ids < self.num_hot, ids, -1)
        return cast(torch.Tensor, self._table)[ids]  # (a lookup store's, until close())

    def _split(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(hot_pos, hot_slots, cold_pos)``: positions in ``ids`` of hot ids, their slots in the
        GPU tier, and positions of cold ids (all on ``self.device``)."""
        slots = self._slots(ids)
        mask = slots >= 0
        hot_pos = torch.nonzero(mask, as_tuple=True)[0]
        cold_pos = torch.nonzero(~mask, as_tuple=True)[0]
        return hot_pos, slots[hot_pos], cold_pos

    def gather(self, ids: Any, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rows ``ids`` (global ids, int32/int64 tensor or array, any order, repeats allowed) as a
        ``[len(ids), dim]`` tensor on :attr:`device`; into ``out[:len(ids)]`` when ``out`` is
        given. Hot ids come from the GPU tier (counted ``"gpu"``), the others over the host link
        (counted ``"host"``). Raises IndexError for ids outside ``[0, num_rows)``."""
        ids_d = self._ids_on_device(ids)
        n = int(ids_d.shape[0])
        if out is None:
            res = torch.empty((n, self.dim), dtype=self.dtype, device=self.device)
        else:
            res = check_out(out, n, self.dim, self.dtype, self.device)
        if n == 0:
            return res
        h = self.num_hot
        if h == 0:
            self._cold.gather(res, None, ids_d)
            self._count(0, n)
        elif h == self.num_rows:
            slots = ids_d if self.mode == "prefix" else self._slots(ids_d)
            copy_rows(self._hot, slots, res)
            self._count(n, 0)
        elif not self._fused(ids_d, res):  # else one kernel, counted on the device (no host sync)
            hot_pos, hot_slots, cold_pos = self._split(ids_d)
            if hot_pos.numel():
                copy_rows(self._hot, hot_slots, res, hot_pos)
            if cold_pos.numel():
                self._cold.gather(res, cold_pos, ids_d[cold_pos])
            self._count(hot_pos.numel(), cold_pos.numel())
        return res

    def _fused(self, ids: torch.Tensor, res: torch.Tensor) -> bool:
        """Hot and cold rows in one kernel over the GPU tier and the zero-copy view, without the
        split's two ``nonzero`` (host syncs on a GPU); False where it does not apply."""
        view = self._cold.view
        if view is None:
            return False
        slots = self._slots(ids)
        if not copy_tiered(self._hot, view, slots, ids, res[: ids.shape[0]]):
            return False
        self._cold.note_use()
        n_hot = (slots >= 0).sum()  # counted on the device, booked when the counters are read
        self.counters.add_device(GPU_TIER, n_hot, self.row_bytes)
        self.counters.add_device(HOST_TIER, n_hot.neg().add_(int(ids.shape[0])), self.row_bytes)
        return True

    def device_rows(self) -> DeviceRows | None:
        """:meth:`~gnnio.features.base.FeatureStore.device_rows`; None unless cold rows are zero-copy."""
        view = self._cold.view if self.num_hot < self.num_rows else self._hot
        if view is None:
            return None
        return DeviceRows(self._hot if self.num_hot else view, view, self._table,
                          self.num_hot if self.mode == "prefix" else 0, GPU_TIER, HOST_TIER,
                          self.counters, self._cold.note_use)  # fmt: skip

    def gather_into(self, ids, out, mask):
        """:meth:`~gnnio.features.base.FeatureStore.gather_into`: the fused gather's kernel with
        the unmasked rows skipped (a cache's misses) where Triton runs and the cold rows, if any,
        are zero-copy; None otherwise (the caller gathers with a sync)."""
        src = self.device_rows()
        if src is None or ids.device != self.device or out.device != self.device:
            return None
        tslots = self._slots(ids) if self.num_hot else torch.full_like(ids, -1)
        routed = torch.where(mask, tslots, -2)
        if not copy_tiered(src.hot, src.cold, routed, ids, out[: ids.shape[0]], skip=True):
            return None
        src.on_read()  # (a no-op when nothing is pinned)
        n_hot, n_cold = (routed >= 0).sum(), (routed == -1).sum()
        self.counters.add_device(GPU_TIER, n_hot, self.row_bytes)
        self.counters.add_device(HOST_TIER, n_cold, self.row_bytes)
        return [(GPU_TIER, n_hot), (HOST_TIER, n_cold)]

    def _count(self, gpu_rows: int, host_rows: int) -> None:
        """Book rows per tier (tiers with no rows are left out of the counters)."""
        for tier, rows in ((GPU_TIER, gpu_rows), (HOST_TIER, host_rows)):
            if rows:
                self.counters.add(tier, rows, self.row_bytes)

    def account(self, ids: Any) -> tuple[int, int]:
        """Route ``ids`` and count them exactly as :meth:`gather` would, without moving rows.
        Returns ``(gpu_rows, host_rows)``."""
        ids_d = self._ids_on_device(ids)
        n = int(ids_d.shape[0])
        h = self.num_hot
        n_hot = 0 if h == 0 else n if h == self.num_rows else int((self._slots(ids_d) >= 0).sum())
        self._count(n_hot, n - n_hot)
        return n_hot, n - n_hot

    # ---------------------------------------------------------------------------------------------
    # introspection and cleanup
    @property
    def hot_ids(self) -> torch.Tensor:
        """``[num_hot]`` int64 global ids held in the GPU tier, in slot order (CPU)."""
        return torch.from_numpy(self._hot_ids)

    def is_hot(self, ids: Any) -> torch.Tensor:
        """Bool mask: which of ``ids`` the GPU tier serves (on :attr:`device`)."""
        ids_d = self._ids_on_device(ids)
        if self.num_hot == 0:
            return torch.zeros(ids_d.shape, dtype=torch.bool, device=ids_d.device)
        return self._slots(ids_d) >= 0

    def describe(self) -> dict[str, Any]:
        """The store's configuration and tier sizes, JSON-friendly."""
        return {
            "mode": self.mode,
            "num_rows": self.num_rows,
            "row_bytes": self.row_bytes,
            "requested_hot": self.requested_hot,
            "num_hot": self.num_hot,
            "hot_fraction": self.num_hot / self.num_rows if self.num_rows else 0.0,
            "clamped_by_budget": self.clamped_by_budget,
            "gpu_budget_bytes": self.gpu_budget_bytes,
            "gpu_tier_bytes": self.gpu_tier_bytes,
            "load_bytes": self.load_bytes,
            "cold_mode": self.cold_mode,
            "cold_mode_used": self.cold_mode_used,
            "cold_mode_reason": self.cold_mode_reason,
            "simulated": self.simulated,
            "gpu": self.gpu_name,
            "backing": self._src.kind,
        }

    def close(self) -> None:
        """Release the pinned host memory and the GPU tier (the store is unusable afterwards)."""
        self._cold.release()
        self._hot = torch.empty((0, self.dim), dtype=self.dtype, device=self.device)
        self._table = None

    def __enter__(self) -> TieredFeatureStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"TieredFeatureStore(mode={self.mode}, hot={self.num_hot}/{self.num_rows}, "
            f"dim={self.dim}, dtype={self.dtype}, gpu={self.gpu_name}, "
            f"cold={self.cold_mode_used})"
        )


def _tier_bytes(num_hot: int, row_bytes: int, table_bytes: int) -> int:
    """Bytes of a GPU tier with ``num_hot`` rows (the lookup table only exists when num_hot > 0)."""
    return num_hot * row_bytes + (table_bytes if num_hot > 0 else 0)
