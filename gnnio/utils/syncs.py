"""Counting host synchronisations and torch operations, on the CPU as on a GPU.

A host synchronisation (the host waits until the GPU has caught up) stalls the launch queue: the
GPU then idles while the host prepares the next kernels, and a training step that syncs a few
times per batch is paced by the host. :class:`OpCounter` counts, in the thread that enters it,

* ``ops``: every ATen operation dispatched (a proxy for kernel launches: on a GPU most ops are one
  or two kernels), and
* ``syncs``: the operations that **synchronise with the host on CUDA**: reading a value back
  (``.item()``, ``bool(t)``, ``int(t)``, ``.tolist()``: ``aten._local_scalar_dense``), operations
  whose output size depends on the data (``nonzero``, ``masked_select``, boolean indexing,
  ``unique``, ``bincount``, ``repeat_interleave`` without ``output_size``), copies from a CUDA
  tensor to the host or from the host to it without ``non_blocking``, and ``t[i] = v`` of a Python
  scalar ``v`` into a device tensor by an ``int`` or tensor index (torch copies ``v`` up from the
  host and waits: ``loc[n] = -1`` synced twice per batch in the GPU sampler, H200 run of
  2026-11-26; ``t.index_fill_(0, idx, v)`` or a slice's ``fill_`` does not).

``Tensor.tolist()`` on a CPU tensor reads the memory without dispatching an operation, so it is not
seen on the CPU (on CUDA it copies to the host first, which is). It works on CPU tensors too,
where nothing really waits: that is the point -- a test on the CPU
finds the operations that *would* stall a GPU (``tests/test_step.py``). Only torch operations are
seen: numba kernels (the CPU sampler, the row gather) are not, and need none of this. It counts
only the thread that entered it, and only the ops it dispatches itself (not a sync hidden inside
an op's CUDA implementation).

On a GPU, :class:`CudaSyncLog` asks CUDA itself (``torch.cuda.set_sync_debug_mode("warn")``): it
sees every synchronising call in every thread -- the loader's sampling and gather threads too --
with the Python line that made it; ``gnnio bench step`` reports them per batch
(``cuda_syncs_per_batch``, ``cuda_sync_sites``).
"""

from __future__ import annotations

import threading
import warnings
from collections import Counter
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["CudaSyncLog", "OpCounter", "SYNC_OPS"]

#: ATen ops (overload packets) that synchronise the host with a CUDA device
SYNC_OPS = frozenset(
    {
        "aten._local_scalar_dense",
        "aten.nonzero",
        "aten.masked_select",
        "aten._unique",
        "aten._unique2",
        "aten.unique_dim",
        "aten.unique_consecutive",
        "aten.bincount",
        "aten.is_nonzero",
        "aten.equal",
        "aten.histc",
    }
)


def _packet(func) -> str:
    name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
    return f"aten.{name}" if not name.startswith("aten.") else name


def _is_sync(func, args, kwargs, lifted: int | None = None) -> bool:
    """Whether ``func(*args, **kwargs)`` synchronises the host with a CUDA device (or would, were
    its tensors on one). ``lifted``: the ``data_ptr`` of the last ``aten.lift_fresh`` output, the
    0-dim tensor torch makes of a Python scalar in ``t[i] = v``: on CUDA that tensor stays on the
    host and writing it into a device tensor is a blocking copy (``copy_`` for an ``int`` index,
    ``index_put_`` for a tensor index; a slice's ``fill_`` does not copy)."""
    name = _packet(func)
    if name in SYNC_OPS:
        return True
    if name == "aten.repeat_interleave":
        return kwargs.get("output_size") is None and not (
            len(args) > 2 and isinstance(args[-1], int)
        )
    if name in ("aten.index", "aten.index_put", "aten.index_put_"):
        idx = args[1] if len(args) > 1 else kwargs.get("indices", ())
        if any(
            isinstance(t, torch.Tensor) and t.dtype == torch.bool
            for t in (idx or ())
            if t is not None
        ):
            return True
        value = args[2] if len(args) > 2 else kwargs.get("values")
        return name != "aten.index" and _is_lifted(value, lifted, args[0])
    if name in ("aten._to_copy", "aten.copy_"):  # (Tensor.to reaches here as _to_copy)
        src = args[1] if name == "aten.copy_" else args[0]
        dst_dev = args[0].device if name == "aten.copy_" else kwargs.get("device")
        if not isinstance(src, torch.Tensor) or dst_dev is None:
            return False
        non_blocking = kwargs.get("non_blocking", False) or (
            name == "aten.copy_" and len(args) > 2 and bool(args[2])
        )
        if {src.device.type, torch.device(dst_dev).type} == {"cpu", "cuda"}:
            return not non_blocking  # a blocking copy across, either way, waits for it
        return name == "aten.copy_" and _is_lifted(src, lifted, args[0])
    return False


def _is_lifted(value, lifted: int | None, dst) -> bool:
    """``value`` is the Python scalar of ``t[i] = v`` (see :func:`_is_sync`), written into a
    tensor on the CPU (a CUDA destination is caught as a host-to-device copy)."""
    return (
        lifted is not None
        and isinstance(value, torch.Tensor)
        and value.dim() == 0
        and value.device.type == "cpu"
        and isinstance(dst, torch.Tensor)
        and dst.device.type == "cpu"
        and value.data_ptr() == lifted
    )


class OpCounter(TorchDispatchMode):
    """``with OpCounter() as c: ...`` then ``c.ops``, ``c.syncs``, ``c.sync_ops`` (Counter of the
    syncing op names) for the torch operations this thread ran inside the block."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0
        self.syncs = 0
        self.sync_ops: Counter[str] = Counter()
        self._lifted: int | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops += 1
        if _is_sync(func, args, kwargs, self._lifted):
            self.syncs += 1
            self.sync_ops[_packet(func)] += 1
        out = func(*args, **kwargs)
        if _packet(func) == "aten.lift_fresh" and isinstance(out, torch.Tensor):
            self._lifted = out.data_ptr() if out.dim() == 0 else None
        return out


class CudaSyncLog:
    """``with CudaSyncLog() as log: ...`` then ``log.sites``: a Counter of ``"<thread>
    <file>:<line>"`` -> host synchronisations CUDA reported inside the block, from every thread
    (``train`` is the main thread; the loader's are ``gnnio-sample-K`` / ``gnnio-gather``), and
    ``log.count``. Uses ``torch.cuda.set_sync_debug_mode("warn")`` (process-wide, put back to 0 on
    exit) and Python's warnings (filters and ``showwarning`` replaced for the block, restored on
    exit; other warnings raised meanwhile are dropped). The warnings cost host time: never time a
    pass inside it."""

    #: CUDA's message per sync (not its one-off "Synchronization debug mode is a prototype
    #: feature ..." when the mode is first set: counted as a sync before, H200 run of 2026-11-26)
    MARK = "called a synchronizing"

    def __init__(self) -> None:
        self.sites: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._cm: warnings.catch_warnings | None = None

    @property
    def count(self) -> int:
        return sum(self.sites.values())

    def _show(self, message, category, filename, lineno, file=None, line=None) -> None:
        if self.MARK not in str(message):
            return
        t = threading.current_thread()
        who = "train" if t is threading.main_thread() else t.name
        where = _short(filename)
        with self._lock:
            self.sites[f"{who} {where}:{lineno}"] += 1

    def __enter__(self) -> CudaSyncLog:
        self._cm = cm = warnings.catch_warnings()
        cm.__enter__()
        warnings.simplefilter("always")
        warnings.showwarning = self._show
        try:
            torch.cuda.set_sync_debug_mode("warn")
        except BaseException:
            cm.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            torch.cuda.set_sync_debug_mode(0)
        finally:
            if self._cm is not None:
                self._cm.__exit__(*exc)


def _short(filename: str) -> str:
    """``gnnio/...`` for gnnio's files, the file name for others (torch's, the tests')."""
    p = Path(filename)
    parts = p.parts
    if "gnnio" in parts:
        i = len(parts) - 1 - parts[::-1].index("gnnio")
        return "/".join(parts[i:])
    return p.name
