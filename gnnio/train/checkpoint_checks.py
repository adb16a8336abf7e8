"""What ``--resume`` checks in a checkpoint file before trusting it (issue 27), and what a fresh
run checks in its ``--checkpoint-dir``.

A checkpoint's name (``ckpt-e<E>-b<B>...pt``) only says where to look: the position, the record
and the state come from the file's contents, and they must agree with the name and with each
other. :func:`check_regular` refuses an entry under a checkpoint's name that is not a regular file
(a fifo would block ``torch.load`` forever, a directory or device is not a checkpoint);
:func:`check_contents` checks every field :func:`~gnnio.train.checkpoint.restore` and the
summary read (keys, types, the position against the name, the history against the position, the
position against ``--epochs``: :func:`check_within`); :func:`malformed` turns whatever a tampered file still gets past
them (a tensor of another shape, a key the model lacks) into one line naming the file.
The binding (dataset fingerprint, model configuration, options, world size:
:func:`~gnnio.train.checkpoint.check_binding`) is the run's fingerprint: two runs that agree on it
compute the same states, so a checkpoint of one continues the other exactly.

:func:`check_unclaimed` keeps a run that does not continue the checkpoints already in its
``--checkpoint-dir`` from writing among them: keeping the newest ones would delete its own, and
``--resume`` would then find the other run's.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import torch

from ..errors import UsageError

__all__ = [
    "NAME",
    "check_checkpoint_dir",
    "check_contents",
    "check_fresh_dir",
    "check_regular",
    "check_unclaimed",
    "check_within",
    "check_world_size",
    "held_checkpoints",
    "malformed",
]

#: a checkpoint's file name: epoch, batch and, with several ranks, rank and world size
NAME = re.compile(r"^ckpt-e(\d{6,})-b(\d{9,})(?:-r(\d+)of(\d+))?\.pt$")

#: keys of a checkpoint and the types they must have (``None`` allowed where listed)
_FIELDS: dict[str, tuple[type, ...]] = {
    "format": (str,),
    "format_version": (int,),
    "binding": (dict,),
    "epoch": (int,),
    "batch": (int,),
    "model": (dict,),
    "optimizer": (dict,),
    "rng": (dict,),
    "stores": (list,),
    "run": (dict,),
    "sampler_scale": (float, type(None)),
    "adaptive": (str, type(None)),
    "best_valid": (float,),
    "best_epoch": (int,),
    "stopped": (bool,),
    "history": (str,),
    "partial": (str, type(None)),
}
_BINDING = ("dataset", "dataset_name", "model", "options", "world_size")


def check_regular(p: Path, directory: Path) -> None:
    """One line unless ``p`` (followed if a symlink) is a regular file."""
    try:
        mode = os.stat(p).st_mode
    except OSError as e:
        raise UsageError(f"--resume {directory}: cannot read {p.name} ({e.strerror})") from None
    if not stat.S_ISREG(mode):
        raise UsageError(
            f"--resume {directory}: {p.name} is not a regular file (a fifo, device or "
            "directory under a checkpoint's name); remove it"
        )


def _bad(directory: Path, p: Path, why: str) -> UsageError:
    return UsageError(f"--resume {directory}: {p.name} is not a valid checkpoint ({why})")


def check_contents(raw: Any, p: Path, directory: Path, pos: tuple[int, int]) -> None:
    """One line unless ``raw`` (a loaded checkpoint of the position ``pos`` its name gives) has
    every field with its type, its own position equal to the name's and a history of one record
    per epoch complete."""
    if not isinstance(raw, dict) or raw.get("format") != "gnnio-train-checkpoint":
        raise UsageError(f"--resume {directory}: {p.name} is not a gnnio training checkpoint")
    for key, types in _FIELDS.items():
        if key not in raw:
            raise _bad(directory, p, f"no {key!r}")
        v = raw[key]
        if not isinstance(v, types) or (isinstance(v, bool) and bool not in types):
            raise _bad(directory, p, f"{key!r} is a {type(v).__name__}")
    if any(k not in raw["binding"] for k in _BINDING):
        raise _bad(directory, p, "incomplete binding")
    epoch, batch = raw["epoch"], raw["batch"]
    if (epoch, batch) != tuple(pos):
        raise _bad(
            directory, p,
            f"it holds epoch {epoch} batch {batch}, its name says epoch {pos[0]} batch {pos[1]}",
        )  # fmt: skip
    try:
        history = json.loads(raw["history"])
        partial = None if raw["partial"] is None else json.loads(raw["partial"])
        adaptive = None if raw["adaptive"] is None else json.loads(raw["adaptive"])
    except (ValueError, RecursionError) as e:
        raise _bad(directory, p, f"malformed JSON: {type(e).__name__}") from None
    if not isinstance(history, list) or len(history) != epoch:
        n = len(history) if isinstance(history, list) else type(history).__name__
        raise _bad(directory, p, f"a history of {n} epochs at epoch {epoch}")
    for i, rec in enumerate(history):
        if not isinstance(rec, dict) or rec.get("epoch") != i:
            raise _bad(directory, p, f"history record {i} is not epoch {i}'s")
    if (batch > 0) != isinstance(partial, dict) or epoch < 0 or batch < 0:
        raise _bad(directory, p, f"position epoch {epoch} batch {batch} and its partial sums")
    if adaptive is not None and not isinstance(adaptive, dict):
        raise _bad(directory, p, "malformed adaptive state")
    if not all(isinstance(t, torch.Tensor) for t in raw["model"].values()):
        raise _bad(directory, p, "a model parameter that is not a tensor")


def check_within(raw: dict, p: Path, directory: Path, epochs: int) -> None:
    """One line when the checkpoint's position lies past ``epochs`` (``--epochs``): the run
    would report more epochs than asked for."""
    epoch, batch = raw["epoch"], raw["batch"]
    if epoch > epochs or (epoch == epochs and batch > 0):
        raise UsageError(
            f"--resume {directory}: {p.name} is at epoch {epoch}, past --epochs {epochs}; "
            f"give --epochs {epoch + (batch > 0)} or more to continue it"
        )


def malformed(directory: Path, p: Path, e: BaseException) -> UsageError:
    """One line for a checkpoint whose contents passed :func:`check_contents` but still do not
    fit the run (a tensor of another shape, a key the model or optimizer lacks)."""
    msg = " ".join(str(e).split())[:200] or type(e).__name__
    return _bad(directory, p, f"{type(e).__name__}: {msg}")


def check_unclaimed(directory: Path, held: list[str], resume: str | None) -> None:
    """One line when ``held`` (the checkpoint names in ``directory``, every rank's) is not empty:
    a fresh run there would mix its checkpoints with another run's, and keeping the newest
    :data:`~gnnio.train.checkpoint.KEEP` would delete its own. A run resumed from
    ``directory`` itself continues them and is not checked."""
    if not held:
        return
    newest = max(held)
    if resume is None:
        todo = f"continue that run with --resume {directory}"
    else:  # (a rerun after a crash: its newest checkpoints are in directory, not in resume)
        todo = (f"continue from them with --resume {directory}, or leave out --checkpoint-dir "
                f"to keep checkpointing to --resume {resume}")  # fmt: skip
    raise UsageError(
        f"--checkpoint-dir {directory}: already holds checkpoints of another run ({newest}); "
        f"{todo}, or give an empty or new directory (or remove them)"
    )


def held_checkpoints(directory: str | os.PathLike) -> list[str]:
    """Names of the checkpoints in ``directory``, of any rank and world size, sorted."""
    d = Path(directory)
    if not d.is_dir():
        return []
    return sorted(p.name for p in d.iterdir() if NAME.match(p.name))


def resumes_into(checkpoint_dir, resume) -> bool:
    """Whether a run with ``--resume resume`` writes its checkpoints where they came from."""
    if resume is None:
        return False
    return checkpoint_dir is None or os.path.realpath(checkpoint_dir) == os.path.realpath(resume)


def check_checkpoint_dir(directory: str | os.PathLike) -> None:
    """One line when ``--checkpoint-dir`` is a file or cannot be created (its nearest existing
    ancestor is a file, or not writable): what :class:`~gnnio.train.checkpoint.CheckpointDir`
    finds, said by ``--nproc N`` before it starts any rank. Creates nothing."""
    d = Path(directory)
    if d.exists() and not d.is_dir():
        raise UsageError(f"--checkpoint-dir {d}: exists and is not a directory")
    up = d.absolute()
    while not up.exists() and up != up.parent:
        up = up.parent
    if not up.is_dir():
        raise UsageError(f"--checkpoint-dir {d}: cannot create it (Not a directory)")
    if not os.access(up, os.W_OK | os.X_OK):
        what = "write in" if up == d.absolute() else "create"
        raise UsageError(f"--checkpoint-dir {d}: cannot {what} it (Permission denied)")
    _check_unclaimed_locks(d)


def _check_unclaimed_locks(d: Path) -> None:
    """One line when a running run holds ``C/lock`` (one process) or ``C/lock-r0`` (rank 0 of
    a ``--nproc`` run): what the ranks' :class:`~gnnio.train.checkpoint.CheckpointDir` would
    find. Each lock is taken and released at once (the ranks claim for good)."""
    import fcntl

    for name, mode in (("lock", fcntl.LOCK_SH), ("lock-r0", fcntl.LOCK_EX)):
        try:
            fd = os.open(d / name, os.O_RDONLY)
        except OSError:
            continue  # none there (or unreadable: the ranks say so)
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except OSError:
            raise UsageError(
                f"--checkpoint-dir {d}: in use by another running training run"
            ) from None
        finally:
            os.close(fd)


def check_fresh_dir(checkpoint_dir, resume=None, run=None) -> None:
    """One line when ``--checkpoint-dir`` holds checkpoints this run does not continue
    (:func:`~gnnio.train.checkpoint_checks.check_unclaimed`). With several ranks every rank
    calls this with ``run``: they refuse together, also where their directories differ."""
    if checkpoint_dir is None or resumes_into(checkpoint_dir, resume):
        return
    mine = held_checkpoints(checkpoint_dir)
    held = sorted(set().union(*(run.all_gather_object(mine) if run is not None else [mine])))
    check_unclaimed(Path(checkpoint_dir), held, resume)


def _world_sizes(d: Path) -> set[int]:
    """World sizes of the checkpoints in ``d`` (1 for a single process's)."""
    out = set()
    for p in d.iterdir():
        m = NAME.match(p.name)
        if m is not None:
            out.add(int(m.group(4)) if m.group(4) is not None else 1)
    return out


def check_world_size(directory: str | os.PathLike, world_size: int) -> None:
    """One line when the checkpoints in ``directory`` were written by another number of ranks
    (none of this world size there); nothing when it holds none at all (:func:`load_resume`
    says that)."""
    d = Path(directory)  # (a directory: the callers check that first)
    sizes = _world_sizes(d)
    if sizes and world_size not in sizes:
        other = max(sizes)
        who = "one process" if other == 1 else f"{other} ranks"
        now = "one process" if world_size == 1 else f"{world_size} ranks"
        raise UsageError(
            f"--resume {d}: the checkpoints there were written by {who}, this run has {now}; "
            f"resume with --nproc {other} (another world size is not supported: each rank's "
            "checkpoint holds its own shard of the run)"
        )
