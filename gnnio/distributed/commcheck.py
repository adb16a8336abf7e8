"""A check of every collective a rank issues, for tests (issue 26): ``GNNIO_COMM_CHECK=DIR``.

:func:`install_from_env` (called by :func:`gnnio.distributed.context.init`) wraps ``torch.distributed``'s
collectives in this process. For every call it records the function, the process group (by the
context's names: ``default``, ``control``, ``fetch``, ...) and the issuing thread, and it checks
two rules; :func:`finish_active` (called by :func:`~gnnio.distributed.context.shutdown`) writes
``DIR/rank<k>.json`` with the calls per (function, group, thread) and every violation:

* **NCCL's tensor rules**: NCCL accepts only tensors on the rank's own GPU (``cuda:<local_rank>``);
  a CPU tensor, or one on another GPU, is refused. On NCCL the check compares devices. On gloo,
  where every tensor is a CPU tensor, the run is checked *as if* it were NCCL: a tensor passes
  when the rank context placed it for the collective (:meth:`~gnnio.distributed.context.DistContext.
  to_comm` / ``empty``, which on NCCL move it to ``cuda:<local_rank>``; the check tags what they
  return) -- a tensor handed to ``torch.distributed`` any other way (``torch.from_numpy(...)``, a
  CPU scratch buffer) is what NCCL would refuse, and is reported with its call site. Object
  collectives (``all_gather_object``, ``broadcast_object_list``) are checked as one call: torch
  places their pickles on the current CUDA device, which ``init`` sets.
* **one thread per communicator**: two threads issuing on one group at the same time (seen as
  overlapping calls) is a violation; so is a group used by threads of two names over the run
  (``threads_by_group``), the pattern that lets them overlap.

What it cannot see: collectives issued from C++ (DDP's initial broadcast and its reducer when no
communication hook is registered; gnnio registers one, so gradient all-reduces are seen).
"""

from __future__ import annotations

import atexit
import collections
import functools
import json
import os
import sys
import threading
from pathlib import Path
from types import FrameType

import torch

__all__ = ["ENV", "CommCheck", "finish_active", "install_from_env"]

ENV = "GNNIO_COMM_CHECK"

#: the functions wrapped (those that take tensors or synchronise a group)
TENSOR_FUNCS = (
    "all_to_all_single", "all_to_all", "all_reduce", "all_gather", "all_gather_into_tensor",
    "reduce_scatter", "reduce_scatter_tensor", "broadcast", "reduce", "gather", "scatter",
    "send", "recv", "isend", "irecv", "barrier",
)  # fmt: skip
OBJECT_FUNCS = (
    "all_gather_object",
    "broadcast_object_list",
    "gather_object",
    "scatter_object_list",
)

_active: CommCheck | None = None
_TAG = "_gnnio_comm_device"


class CommCheck:
    """The record of one rank (module docstring)."""

    def __init__(self, ctx, out_dir: str | os.PathLike) -> None:
        self.ctx = ctx
        self.out_dir = Path(out_dir)
        self.nccl = ctx.backend == "nccl"
        # the device NCCL would need; on gloo, the device the run would have on NCCL
        self.expected = f"cuda:{ctx.local_rank}"
        self.calls: collections.Counter = collections.Counter()
        self.threads_by_group: dict[str, set[str]] = collections.defaultdict(set)
        self.violations: list[str] = []
        self._active: dict[str, dict[int, str]] = collections.defaultdict(dict)
        self._lock = threading.Lock()
        self._local = threading.local()
        self._names = {id(g): n for n, g in ctx.groups.items()}
        self._originals: dict[tuple[object, str], object] = {}

    # -- tags -----------------------------------------------------------------------------
    def placed(self, t: torch.Tensor) -> None:
        """The context placed ``t`` for a collective (on NCCL: on ``cuda:<local_rank>``)."""
        setattr(t, _TAG, str(self.ctx.comm_device) if self.nccl else self.expected)

    def _tensor_ok(self, t: torch.Tensor) -> str | None:
        dev = str(t.device) if t.device.type != "cuda" else f"cuda:{t.device.index}"
        if dev == self.expected:
            return None
        if not self.nccl and getattr(t, _TAG, None) == self.expected:
            return None
        return dev

    # -- wrapping -------------------------------------------------------------------------
    def install(self) -> None:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        for mod in (dist, c10d):
            for name in (*TENSOR_FUNCS, *OBJECT_FUNCS):
                fn = getattr(mod, name, None)
                if fn is None or getattr(fn, "_gnnio_wrapped", False):
                    continue
                self._originals[(mod, name)] = fn
                setattr(mod, name, self._wrap(name, fn))

    def uninstall(self) -> None:
        for (mod, name), fn in self._originals.items():
            setattr(mod, name, fn)
        self._originals.clear()

    def _wrap(self, name: str, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            depth = getattr(self._local, "depth", 0)
            if depth:  # inside an object collective: its own tensors, torch's business
                return fn(*args, **kwargs)
            self._local.depth = 1
            try:
                gname = self._group_name(kwargs.get("group"))
                me = threading.current_thread()
                self._enter(name, gname, me)
                if name in TENSOR_FUNCS:
                    self._check_tensors(name, gname, args, kwargs)
                try:
                    return fn(*args, **kwargs)
                finally:
                    self._exit(gname, me)
            finally:
                self._local.depth = 0

        wrapper._gnnio_wrapped = True  # type: ignore[attr-defined]
        return wrapper

    def _group_name(self, group) -> str:
        if group is None:
            return "default"
        return self._names.get(id(group), f"group@{id(group):x}")

    def _enter(self, fn: str, gname: str, me: threading.Thread) -> None:
        with self._lock:
            self.calls[(fn, gname, me.name)] += 1
            self.threads_by_group[gname].add(me.name)
            others = {i: n for i, n in self._active[gname].items() if i != _ident(me)}
            if others:
                self.violations.append(
                    f"threads: {fn} on group {gname} from thread {me.name} while thread(s) "
                    f"{sorted(others.values())} have a collective on it in flight"
                )
            self._active[gname][_ident(me)] = me.name

    def _exit(self, gname: str, me: threading.Thread) -> None:
        with self._lock:
            self._active[gname].pop(_ident(me), None)

    def _check_tensors(self, fn: str, gname: str, args, kwargs) -> None:
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        for a in (*args, *kwargs.values()):
            if isinstance(a, (list, tuple)):
                tensors += [x for x in a if isinstance(x, torch.Tensor)]
        for t in tensors:
            dev = self._tensor_ok(t)
            if dev is not None:
                with self._lock:
                    self.violations.append(
                        f"nccl: {fn} on group {gname} got a tensor on {dev} (NCCL needs "
                        f"{self.expected}) at {_call_site()}"
                    )

    # -- the record -----------------------------------------------------------------------
    def record(self) -> dict:
        with self._lock:
            shared = {g: sorted(t) for g, t in self.threads_by_group.items() if len(t) > 1}
            return {
                "rank": self.ctx.rank,
                "backend": self.ctx.backend,
                "expected_device": self.expected,
                "calls": [[f, g, t, n] for (f, g, t), n in sorted(self.calls.items())],
                "threads_by_group": {g: sorted(t) for g, t in self.threads_by_group.items()},
                "violations": list(self.violations)
                + [f"threads: group {g} used by threads {t}" for g, t in shared.items()],
            }

    def write(self) -> Path:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / f"rank{self.ctx.rank}.json"
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(self.record(), indent=1))
        os.replace(tmp, path)
        return path


def _ident(t: threading.Thread) -> int:
    """A started thread's id (``ident`` is None only before ``start``)."""
    assert t.ident is not None
    return t.ident


def _call_site() -> str:
    """The innermost frame outside this module, the context and torch."""
    here = Path(__file__).resolve().parent
    f: FrameType | None = sys._getframe(2)
    while f is not None:
        p = Path(f.f_code.co_filename)
        skip = (p.parent == here and p.name in ("commcheck.py", "context.py")) or (
            "torch" in p.parts
        )
        if not skip:
            return f"{p.name}:{f.f_lineno} ({f.f_code.co_name})"
        f = f.f_back
    return "?"


def install_from_env(ctx) -> CommCheck | None:
    """Install the check when ``GNNIO_COMM_CHECK`` names a directory (module docstring)."""
    global _active
    out = os.environ.get(ENV)
    if not out:
        return None
    if _active is not None:
        _active.uninstall()
    chk = CommCheck(ctx, out)
    ctx._extra["check"] = chk
    chk.install()
    _active = chk
    atexit.register(finish_active)
    return chk


def finish_active() -> None:
    """Write the active check's record (once) and remove its wrappers."""
    global _active
    chk, _active = _active, None
    if chk is not None:
        chk.write()
        chk.uninstall()
