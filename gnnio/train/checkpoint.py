"""Checkpoints of a training run that a killed run resumes from exactly (``--checkpoint-dir C``,
``--resume C``).

What a checkpoint holds (one ``torch.save`` file of tensors, numbers and strings, read back with
``torch.load(weights_only=True)``, so loading runs no pickled code):

* the position: ``epoch`` (epochs complete) and ``batch`` (batches of that epoch complete; 0 at an
  epoch's end);
* the model's and the optimizer's ``state_dict``;
* every random state the rest of the run draws from: torch's CPU generator (dropout; the model
  init is redone and overwritten), the CUDA generators when CUDA is initialised, NumPy's and
  Python's global generators. The samplers and the seed orders need none: their randomness is
  counter-based, a batch is a pure function of ``(seed, epoch, batch index)``
  (:class:`~gnnio.pipeline.loader.NodeLoader`, :class:`~gnnio.ordering.shuffle.RandomOrder`), so
  the position restores them;
* the state that changes results: a dynamic feature cache's maps and clock (its hits, so the bytes
  per tier), Algorithm 2's ``s`` and history (the locality sampler's scale);
* the record so far: best valid accuracy and epoch, whether early stopping fired, the per-epoch
  history (the summary is recomputed from it), and, mid-epoch, the pass's partial sums (loss,
  correct predictions, seeds, feature rows and bytes of the batches done);
* what binds it: the format version, the dataset's :meth:`~gnnio.graph.dataset.Dataset.fingerprint`,
  the model configuration, the options that change results, the world size.

Writing is atomic: a uniquely named temporary file in ``C``, ``fsync``, ``rename`` to
``ckpt-e<epoch>-b<batch>.pt``, ``fsync`` of ``C``; then all but the newest :data:`KEEP` files up
to that position are removed (never the one just written). A run killed at any point leaves
either the previous checkpoints or the new one, never a partial file under a checkpoint name.
``C/lock`` (``flock``, released by the kernel when the process dies, also on SIGKILL) keeps two
runs from writing the same directory at once; a run that does not resume from ``C`` refuses a
``C`` that already holds checkpoints (:func:`~.checkpoint_checks.check_fresh_dir`): its own would
be pruned among another run's.

Several ranks (``--nproc N``, torchrun): every rank writes its own file,
``ckpt-e<epoch>-b<batch>-r<rank>of<N>.pt``, at the same positions, claimed by its own
``C/lock-r<rank>`` and a shared lock on ``C/lock`` (which a single process holds exclusively).
The model and optimizer are the same on every rank (DDP), and each file holds them, so a rank's
file is complete on its own (no shared file system needed between machines);
what differs per rank is the rest: its random states, its feature store's state (the sharded
store's cross-batch reuse ids, read trace and request bytes, a per-rank cache's maps) and the
run's per-rank counters (:meth:`gnnio.train.loop.LocalRun.state_dict`). A rank killed while the
others wrote a newer checkpoint leaves the ranks one position apart; at ``--resume`` the ranks
exchange the positions they hold and continue from the newest one that every rank holds and can
read (:func:`load_resume`). Only the same world size resumes: a rank's state is its shard of the
run, and another number of ranks would cut the seeds, the placement and the feature shards
differently (one line says so).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import UsageError
from ..utils.outputs import remove_stale_files, write_atomic
from ..utils.warnings_at import warn
from .checkpoint_checks import NAME as _NAME
from .checkpoint_checks import (
    check_contents,
    check_fresh_dir,
    check_regular,
    check_within,
    check_world_size,
    held_checkpoints,
    malformed,
)
from .rng_state import capture_rng, restore_rng

__all__ = [
    "FORMAT_VERSION",
    "KEEP",
    "CheckpointDir",
    "Progress",
    "ResumeState",
    "capture_rng",
    "check_world_size",
    "checkpoint_files",
    "check_fresh_dir",
    "check_resume_dir",
    "held_checkpoints",
    "load_resume",
    "make_state",
    "open_checkpoints",
    "restore_rng",
    "resume_progress",
    "stateful_stores",
]

#: version of the checkpoint layout; another one is refused at ``--resume``
FORMAT_VERSION = 1
#: checkpoints kept in the directory (the newest ones)
KEEP = 2
_TAG = "gnnio-train-checkpoint"

#: configuration fields that shape the model; a checkpoint of another shape is refused
MODEL_KEYS = (
    "model", "num_layers", "hidden", "heads", "dropout", "attn_dropout", "feature_norm",
    "edge_weight_norm",
)  # fmt: skip
#: fields that change neither the parameters nor the summary's losses, accuracies and bytes:
#: they may differ at ``--resume`` (e.g. more ``--epochs`` continue a finished run)
FREE_KEYS = frozenset(
    {
        "epochs", "patience", "checkpoint", "summary", "log", "progress", "threads", "prefetch",
        "isolation", "dist_timeout", "nproc", "checkpoint_dir", "checkpoint_every", "resume",
        "eval_batch_size", "stall_timeout",
    }
)  # fmt: skip


def checkpoint_files(directory: str | os.PathLike, rank: int = 0, world_size: int = 1):
    """``[(epoch, batch, path)]`` of this rank's checkpoints in ``directory``, oldest first."""
    d = Path(directory)
    out: list[tuple[int, int, Path]] = []
    if not d.is_dir():
        return out
    for p in d.iterdir():
        m = _NAME.match(p.name)
        if m is None:
            continue
        r = (int(m.group(3)), int(m.group(4))) if m.group(3) is not None else (0, 1)
        if r == (rank, world_size):
            out.append((int(m.group(1)), int(m.group(2)), p))
    return sorted(out)


def _file_name(epoch: int, batch: int, rank: int, world_size: int) -> str:
    suffix = f"-r{rank}of{world_size}" if world_size > 1 else ""
    return f"ckpt-e{epoch:06d}-b{batch:09d}{suffix}.pt"


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class CheckpointDir:
    """The checkpoint directory of a run: claims it (``C/lock``), writes checkpoints atomically
    and keeps the newest :data:`KEEP`. Close it (or let the process end) to release the claim."""

    def __init__(self, directory: str | os.PathLike, rank: int = 0, world_size: int = 1):
        self.path = Path(directory)
        self.rank, self.world_size = int(rank), int(world_size)
        if self.path.exists() and not self.path.is_dir():
            raise UsageError(f"--checkpoint-dir {self.path}: exists and is not a directory")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(
                f"--checkpoint-dir {self.path}: cannot create it ({e.strerror})"
            ) from None
        self._lock_fd = self._claim()
        remove_stale_files(self.path, ".ckpt-")  # temporaries of killed writers (pid gone)

    def _claim(self) -> list[int]:
        """``C/lock``: exclusive for one process, shared by the ranks of a run, each of which
        also holds ``C/lock-r<rank>`` exclusively: two runs of any world sizes exclude each
        other (a single process and a ``--nproc`` run had taken different files)."""
        import fcntl

        locks = [("lock", fcntl.LOCK_EX if self.world_size == 1 else fcntl.LOCK_SH)]
        if self.world_size > 1:
            locks.append((f"lock-r{self.rank}", fcntl.LOCK_EX))
        fds: list[int] = []
        for name, mode in locks:
            try:
                fds.append(os.open(self.path / name, os.O_RDWR | os.O_CREAT, 0o644))
            except OSError as e:
                self._release(fds)
                raise UsageError(
                    f"--checkpoint-dir {self.path}: cannot write in it ({e.strerror})"
                ) from None
            try:
                fcntl.flock(fds[-1], mode | fcntl.LOCK_NB)
            except OSError:
                self._release(fds)
                raise UsageError(
                    f"--checkpoint-dir {self.path}: in use by another running training run"
                ) from None
        return fds

    @staticmethod
    def _release(fds: list[int]) -> None:
        for fd in fds:
            os.close(fd)  # releases the flock

    def close(self) -> None:
        self._release(self._lock_fd)
        self._lock_fd = []

    def save(self, state: dict[str, Any]) -> Path:
        """Write ``state`` (a dict for :func:`torch.save`) as the checkpoint at its
        ``(epoch, batch)`` atomically, then drop all but the newest :data:`KEEP` up to it (a
        later position, left by a rank of a resumed run, is rewritten when reached)."""
        pos = (state["epoch"], state["batch"])
        target = self.path / _file_name(*pos, self.rank, self.world_size)
        # .NAME.tmp-<pid>-<random>, fsync, rename; a failed write (also inside torch.save) is one
        # line and removes the temporary file
        write_atomic(target, lambda f: torch.save(state, f), "--checkpoint-dir")
        _fsync_dir(self.path)
        done = [p for e, b, p in checkpoint_files(self.path, self.rank, self.world_size)
                if (e, b) <= pos]  # fmt: skip
        for old in done[:-KEEP]:
            old.unlink(missing_ok=True)
        return target


def stateful_stores(store) -> list:
    """The stores of a stack (``store``, its ``backing``, ...) that have state to save (a dynamic
    cache: ``state_dict``/``load_state_dict``)."""
    out, seen, s = [], set(), store
    while s is not None and id(s) not in seen:
        seen.add(id(s))
        if callable(getattr(s, "state_dict", None)) and callable(
            getattr(s, "load_state_dict", None)
        ):
            out.append(s)
        s = getattr(s, "backing", None)
    return out


# ---- what binds a checkpoint to a run -----------------------------------------------------------


def binding(ds, cfg, world_size: int) -> dict[str, Any]:
    """The facts a resumed run must share with the checkpoint (see :func:`check_binding`)."""
    conf = cfg.to_json()
    return {
        "dataset": str(ds.fingerprint),
        "dataset_name": str(ds.name),
        "model": json.dumps({k: conf.get(k) for k in MODEL_KEYS}, sort_keys=True),
        "options": json.dumps(
            {k: v for k, v in conf.items() if k not in FREE_KEYS and k not in MODEL_KEYS},
            sort_keys=True,
            default=str,
        ),
        "world_size": int(world_size),
    }


def _first_difference(saved: dict, now: dict) -> str:
    for k in sorted(set(saved) | set(now)):
        if saved.get(k) != now.get(k):
            return f"--{k.replace('_', '-')} {saved.get(k)!r} in the checkpoint, {now.get(k)!r} now"
    return "?"


def check_binding(src: str, saved: dict[str, Any], now: dict[str, Any]) -> None:
    """One line saying which of format version, dataset, model configuration, options or world
    size differs between the checkpoint ``saved`` and this run ``now``."""
    if saved.get("format") != _TAG:
        raise UsageError(f"--resume {src}: not a gnnio training checkpoint")
    if saved.get("format_version") != FORMAT_VERSION:
        raise UsageError(
            f"--resume {src}: checkpoint format version {saved.get('format_version')!r}, this "
            f"gnnio reads version {FORMAT_VERSION}"
        )
    b = saved["binding"]
    if b["dataset"] != now["dataset"]:
        raise UsageError(
            f"--resume {src}: the checkpoint is of another dataset ({b['dataset_name']}, "
            f"fingerprint {b['dataset']}; this one is {now['dataset_name']}, {now['dataset']})"
        )
    if b["world_size"] != now["world_size"]:
        raise UsageError(
            f"--resume {src}: the checkpoint was written by {b['world_size']} rank(s), this run "
            f"has {now['world_size']}; resume with the same world size"
        )
    if b["model"] != now["model"]:
        diff = _first_difference(json.loads(b["model"]), json.loads(now["model"]))
        raise UsageError(f"--resume {src}: another model configuration ({diff})")
    if b["options"] != now["options"]:
        diff = _first_difference(json.loads(b["options"]), json.loads(now["options"]))
        raise UsageError(f"--resume {src}: an option that changes results differs ({diff})")


# ---- resuming ------------------------------------------------------------------------------------


@dataclass
class ResumeState:
    """A loaded checkpoint, checked against the run (see module docstring for the fields)."""

    path: Path
    epoch: int
    batch: int
    raw: dict[str, Any] = field(repr=False)

    @property
    def history(self) -> list[dict[str, Any]]:
        return json.loads(self.raw["history"])


def _resume_dir(directory: str | os.PathLike) -> Path:
    """``directory`` as a Path; one line when it is not a directory."""
    d = Path(directory)
    if not d.is_dir():
        what = "not a directory" if d.exists() else "no such checkpoint directory"
        raise UsageError(f"--resume {d}: {what}")
    return d


def check_resume_dir(directory: str | os.PathLike, world_size: int) -> None:
    """One line, from the file names alone, when ``world_size`` ranks sharing ``directory`` (a
    ``--nproc N`` run, before it starts them) cannot resume from it: not a directory, checkpoints
    of another world size (:func:`check_world_size`), or no position that every rank holds. What
    the files hold is checked by each rank (:func:`load_resume`)."""
    d = _resume_dir(directory)
    check_world_size(d, world_size)
    held = [{(e, b) for e, b, _ in checkpoint_files(d, r, world_size)} for r in range(world_size)]
    if not set.intersection(*held):
        if any(held) and world_size > 1:
            raise UsageError(
                f"--resume {d}: no checkpoint position that all {world_size} ranks hold"
            )
        raise UsageError(f"--resume {d}: no complete checkpoint in it")


def _gather(run, obj) -> list:
    return run.all_gather_object(obj) if run is not None else [obj]


def load_resume(directory: str | os.PathLike, ds, cfg, rank: int = 0, world_size: int = 1,
                run=None):  # fmt: skip
    """The newest checkpoint of ``directory`` that every rank holds and can read, checked
    against this run (:func:`check_binding`); a file that does not load (damaged outside gnnio)
    is skipped with a warning naming it. With several ranks ``run`` (its
    ``all_gather_object``) lets the ranks agree on the position: every rank calls this. One-line
    :class:`~gnnio.errors.UsageError` when there is none."""
    d = _resume_dir(directory)
    check_world_size(d, world_size)
    files = {(e, b): p for e, b, p in checkpoint_files(d, rank, world_size)}
    held = _gather(run, sorted(files))
    common = set(map(tuple, held[0])).intersection(*(set(map(tuple, h)) for h in held[1:]))
    now = binding(ds, cfg, world_size)
    for pos in sorted(common, reverse=True):
        p = files[pos]
        raw = None
        check_regular(p, d)  # a fifo would block torch.load for good
        try:
            raw = torch.load(p, map_location="cpu", weights_only=True)
        except Exception as e:  # a damaged file: try the one before
            warn(f"--resume: skipping {p} ({type(e).__name__})")
        if not all(_gather(run, raw is not None)):
            continue  # some rank cannot read its file of this position
        if not isinstance(raw, dict) or raw.get("format") != _TAG:  # (a list, a bare state_dict)
            raise UsageError(f"--resume {d}: {p.name} is not a gnnio training checkpoint")
        if raw.get("format_version") == FORMAT_VERSION:  # another version: check_binding says
            check_contents(raw, p, d, pos)  # the contents, not the name, give the position
        check_binding(str(d), raw, now)
        check_within(raw, p, d, cfg.epochs)
        return ResumeState(path=p, epoch=pos[0], batch=pos[1], raw=raw)
    if files and world_size > 1:
        raise UsageError(f"--resume {d}: no checkpoint position that all {world_size} ranks hold")
    raise UsageError(f"--resume {d}: no complete checkpoint in it")


def _store_state(s, mark) -> dict[str, Any]:
    """A store's state; a store that runs ahead of training (``mark``) rewound to ``mark``."""
    if mark is not None and callable(getattr(s, "mark", None)):
        return s.state_dict(upto=mark)
    return s.state_dict()


def make_state(*, ds, cfg, world_size, epoch, batch, model, opt, stores, sampler, adaptive,
               best_valid, best_epoch, stopped, history, partial=None,
               run_state=None) -> dict[str, Any]:  # fmt: skip
    """The dict :meth:`CheckpointDir.save` writes (module docstring). ``partial`` (mid-epoch)
    may carry ``store_mark``, the mark of the last batch trained on (:func:`_store_state`)."""
    mark = None if partial is None else partial.get("store_mark")
    return {
        "format": _TAG,
        "format_version": FORMAT_VERSION,
        "binding": binding(ds, cfg, world_size),
        "epoch": int(epoch),
        "batch": int(batch),
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "rng": capture_rng(),
        "stores": [_store_state(s, mark) for s in stores],
        "run": run_state or {},
        "sampler_scale": float(sampler.scale) if hasattr(sampler, "scale") else None,
        "adaptive": None
        if adaptive is None
        else json.dumps(
            {
                "s": adaptive.s,
                "pre": adaptive.pre,
                "fixed": adaptive.fixed,
                "history": adaptive.history,
            }
        ),  # fmt: skip
        "best_valid": float(best_valid),
        "best_epoch": int(best_epoch),
        "stopped": bool(stopped),
        "history": json.dumps(history),
        "partial": None if partial is None else json.dumps(partial),
    }


def restore(state: ResumeState, *, model, opt, stores, sampler, adaptive, run=None) -> None:
    """Put a checkpoint's model, optimizer, store and sampler state back (the random states
    separately, :func:`restore_rng`, right before training continues)."""
    raw = state.raw
    model.load_state_dict(raw["model"])
    opt.load_state_dict(raw["optimizer"])
    if len(raw["stores"]) != len(stores):
        raise UsageError(f"--resume {state.path.parent}: the feature store stack differs")
    for s, st in zip(stores, raw["stores"]):
        s.load_state_dict(st)
    if raw["sampler_scale"] is not None and hasattr(sampler, "scale"):
        sampler.scale = raw["sampler_scale"]
    if adaptive is not None and raw["adaptive"] is not None:
        a = json.loads(raw["adaptive"])
        adaptive.s, adaptive.pre, adaptive.fixed = a["s"], a["pre"], a["fixed"]
        adaptive.history[:] = a["history"]
    if run is not None:
        run.load_state_dict(raw.get("run") or {})


@dataclass
class Progress:
    """Where a run (re)starts and its record so far: fresh, or from a checkpoint."""

    epoch: int = 0
    batch: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    best_valid: float = -1.0
    best_epoch: int = -1
    stopped: bool = False
    partial: dict[str, Any] | None = None
    resumed_from: str | None = None


def open_checkpoints(cfg, ds, run):
    """``(CheckpointDir or None, ResumeState or None)`` for ``cfg.checkpoint_dir`` /
    ``cfg.resume`` (``--resume C`` alone keeps writing to ``C``). Checkpoints are per rank; with
    several ranks every rank calls this (they agree on the position to resume from)."""
    target = cfg.checkpoint_dir or cfg.resume
    if target is None:
        return None, None
    resumed = None
    if cfg.resume is not None:
        resumed = load_resume(cfg.resume, ds, cfg, run.rank, run.world_size, run=run)
    ckdir = CheckpointDir(target, run.rank, run.world_size)  # claimed: no run writes there now
    try:
        check_fresh_dir(cfg.checkpoint_dir, cfg.resume, run)
    except UsageError:
        ckdir.close()
        raise
    return ckdir, resumed


def resume_progress(resumed: ResumeState | None, *, model, opt, store, sampler, adaptive,
                    run=None):  # fmt: skip
    """The :class:`Progress` to continue from; with a checkpoint, its model, optimizer, caches,
    sampler scale and random states are put back (call right before the first epoch runs)."""
    if resumed is None:
        return Progress()
    raw = resumed.raw
    try:
        restore(resumed, model=model, opt=opt, stores=stateful_stores(store), sampler=sampler,
                adaptive=adaptive, run=run)  # fmt: skip
        restore_rng(raw["rng"])
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError) as e:
        raise malformed(resumed.path.parent, resumed.path, e) from None
    return Progress(
        epoch=resumed.epoch,
        batch=resumed.batch,
        history=resumed.history,
        best_valid=float(raw["best_valid"]),
        best_epoch=int(raw["best_epoch"]),
        stopped=bool(raw["stopped"]),
        partial=None if raw["partial"] is None else json.loads(raw["partial"]),
        resumed_from=str(resumed.path),
    )
