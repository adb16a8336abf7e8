"""The output directory of a dataset write (``prepare``, ``reorder``): where it may go, one writer
at a time, room for it, what crashed writers left, and errors of a full disk as one line.

- **Where**: a dataset directory is created next to its target, never inside another gnnio
  dataset, never over something that is not a directory, and with ``overwrite`` only over a gnnio
  dataset or an empty directory (never over, say, a home directory or ``/dev/null``).
- **One writer**: a writer claims the target with an exclusive ``flock`` on ``.NAME.lock`` next to
  it, held until it is done (the kernel drops it if the process dies). A second writer to the same
  target fails at once with one line naming the holder's pid. The claim is re-entrant within a
  process (``prepare --reorder`` holds it while its import and its reordered copy are written).
- **Temporary names** are ``.NAME.KIND-<pid>-<random>`` (KIND ``tmp``, ``prepare`` or ``old``):
  unique per writer, and they record the writer's pid.
- **Stale temporaries**: holding the claim, a writer removes the temporaries of the same target
  whose writer is gone (its pid no longer runs; names from older gnnio versions without a pid once
  untouched for :data:`LEGACY_STALE_S`), and says so in one line (logger ``gnnio.graph.write``,
  which prints on stderr without any logging setup). An ``old`` directory (the previous dataset,
  moved aside while a new one took its place) is removed only when the target exists.
- **Room**: :func:`check_disk` refuses, before anything is written, an output whose estimated size
  exceeds the free space; :func:`check_ram` does the same for arrays built in memory (the lower
  bound of what they need against ``MemAvailable``). :func:`preallocate` reserves a memory-mapped
  array's blocks with ``posix_fallocate``, so a full disk is an ``ENOSPC`` there, not a ``SIGBUS``
  when a page of the mapping is written later. :func:`write_error` turns such errors into one line.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import secrets
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import DatasetError
from ..utils.rss import available_ram

__all__ = [
    "LEGACY_STALE_S",
    "available_ram",
    "check_disk",
    "check_out_dir",
    "check_ram",
    "claim",
    "format_size",
    "free_space",
    "is_temp_dir_name",
    "make_temp_dir",
    "preallocate",
    "remove_stale",
    "write_error",
]

log = logging.getLogger("gnnio.graph.write")

#: temporaries of older gnnio versions (no pid in the name) count as stale after this many seconds
LEGACY_STALE_S = 3600.0
#: errno values that mean the output does not fit
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
_KINDS = ("tmp", "prepare", "old")
_HELD: dict[str, list] = {}  # lock path -> [fd, depth] of the claims this process holds


def format_size(n: float) -> str:
    """``1536`` -> ``"1.5 KiB"``: bytes in binary units, three significant digits."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} TiB"  # pragma: no cover


def _existing_ancestor(path: Path) -> Path:
    p = Path(os.path.abspath(path))
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _is_dataset(d: Path) -> bool:
    try:
        import json

        return json.loads((d / "meta.json").read_text()).get("format") == "gnnio-dataset"
    except (OSError, ValueError, AttributeError, RecursionError):
        return False


def check_out_dir(out: str | os.PathLike, overwrite: bool) -> Path:
    """``Path(out)`` if a dataset may be written there (module docstring), else a one-line
    DatasetError; the parent is created."""
    out = Path(out)
    for a in out.parents:
        if a.exists():
            if not a.is_dir():
                raise DatasetError(f"{out}: {a} is a file, not a directory")
            break
    if out.is_symlink() or out.exists():
        if not out.is_dir() or out.is_symlink():
            raise DatasetError(f"{out}: exists and is not a directory; not replacing it")
        if not overwrite:
            raise DatasetError(
                f"{out}: already exists (pass --overwrite, or overwrite=True in Python, to "
                "replace it)"
            )
        if not _is_dataset(out) and any(out.iterdir()):
            raise DatasetError(
                f"{out}: is a directory that is not a gnnio dataset; --overwrite replaces only a "
                "dataset (or an empty directory)"
            )
    for d in Path(os.path.abspath(out)).parents:
        if _is_dataset(d):
            raise DatasetError(f"{out}: inside the dataset directory {d}; write it elsewhere")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DatasetError(f"{out}: cannot create {out.parent} ({e.strerror or e})") from None
    return out


# ---- one writer per target ----------------------------------------------------------------------


@contextmanager
def claim(out: str | os.PathLike) -> Iterator[None]:
    """Hold the exclusive claim of ``out`` (module docstring) for the ``with`` block; a target
    another process holds is a one-line DatasetError naming its pid."""
    import fcntl

    out = Path(out)
    lock = out.parent / f".{out.name}.lock"
    key = os.path.abspath(lock)
    if key in _HELD:
        _HELD[key][1] += 1
        try:
            yield
        finally:
            _HELD[key][1] -= 1
        return
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise DatasetError(f"{out}: cannot write in {out.parent} ({e.strerror or e})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise DatasetError(
                f"{out}: another gnnio run (pid {holder}) is writing it; wait for it to finish "
                "or choose another output"
            ) from None
        # the previous holder unlinks the lock file when done: a lock on an unlinked file
        # claims nothing, so lock the file that is at the path now
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(lock))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    _HELD[key] = [fd, 1]
    try:
        yield
    finally:
        del _HELD[key]
        try:
            os.unlink(lock)
        except OSError:
            pass
        os.close(fd)


# ---- temporary directories ----------------------------------------------------------------------


def make_temp_dir(out: str | os.PathLike, kind: str = "tmp") -> Path:
    """A new empty directory ``.NAME.KIND-<pid>-<random>`` next to ``out``."""
    assert kind in _KINDS
    out = Path(out)
    while True:
        p = out.parent / f".{out.name}.{kind}-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            p.mkdir()  # the umask gives its mode, as for any new directory, once renamed
            return p
        except FileExistsError:
            continue
        except OSError as e:
            raise DatasetError(
                f"{out}: cannot create it in {out.parent} ({e.strerror or e})"
            ) from None


#: the name of a writer's temporary directory (not ``old``: that one holds a complete dataset)
_TEMP_NAME = re.compile(r"^\..+\.(tmp|prepare)-\d+-[0-9a-f]+$")


def is_temp_dir_name(name: str) -> bool:
    """Whether ``name`` is a writer's temporary directory (``.NAME.tmp-<pid>-<random>``): one a
    killed writer left, perhaps with its ``meta.json`` written, never a dataset to open."""
    return _TEMP_NAME.match(name) is not None


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def _du(p: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(p):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                pass
    return total


def remove_stale(out: str | os.PathLike) -> list[Path]:
    """Remove the stale temporaries of ``out`` (module docstring; call it holding the claim);
    returns what was removed and logs one line when anything was."""
    out = Path(out)
    prefix = f".{out.name}."
    pat = re.compile(rf"^({'|'.join(_KINDS)})-(?:(\d+)-[0-9a-f]+|([0-9a-z_]{{8}}))$")
    try:
        entries = list(out.parent.iterdir()) if out.parent.is_dir() else []
    except OSError:
        return []
    stale = []
    for p in entries:
        if not p.name.startswith(prefix) or not p.is_dir() or p.is_symlink():
            continue
        m = pat.match(p.name[len(prefix) :])
        if m is None:
            continue
        kind, pid, legacy = m.groups()
        if kind == "old" and not out.is_dir():
            continue  # the previous dataset, moved aside: the only copy while out is missing
        if pid is not None:
            if _pid_alive(int(pid)):
                continue
        else:
            try:
                if time.time() - p.stat().st_mtime < LEGACY_STALE_S:
                    continue
            except OSError:
                continue
        stale.append(p)
    if stale:
        size = sum(_du(p) for p in stale)
        for p in stale:
            shutil.rmtree(p, ignore_errors=True)
        names = ", ".join(p.name for p in stale[:3]) + (", ..." if len(stale) > 3 else "")
        log.warning(
            "%s: removed %d stale temporary director%s of interrupted writes (%s; %s)",
            out,
            len(stale),
            "y" if len(stale) == 1 else "ies",
            names,
            format_size(size),
        )
    return stale


# ---- room ---------------------------------------------------------------------------------------


def free_space(path: str | os.PathLike) -> tuple[int, Path]:
    """Bytes free to this user on the filesystem of ``path`` (or of its nearest existing
    ancestor), and that ancestor."""
    a = _existing_ancestor(Path(path))
    return int(shutil.disk_usage(a).free), a


def check_disk(out: str | os.PathLike, need: int) -> None:
    """One-line DatasetError when ``need`` bytes do not fit in the free space where ``out`` goes."""
    free, where = free_space(Path(out).parent)
    if int(need) > free:
        raise DatasetError(
            f"{out}: the output needs about {format_size(need)} on disk, only "
            f"{format_size(free)} is free in {where}"
        )


def check_ram(need: int, what: str) -> None:
    """One-line DatasetError when at least ``need`` bytes of memory are needed for ``what`` and
    fewer are available."""
    avail = available_ram()
    if avail is not None and int(need) > avail:
        raise DatasetError(
            f"{what}: needs at least {format_size(need)} of memory, only {format_size(avail)} "
            "is available"
        )


def preallocate(path: str | os.PathLike) -> None:
    """Reserve the blocks of the (sparse) file ``path`` at its current size, so writes through a
    memory map of it cannot fail for lack of space (an ``OSError`` here instead)."""
    size = os.path.getsize(path)
    if size == 0:
        return
    fd = os.open(path, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno in NO_SPACE:
            raise OSError(e.errno, f"{e.strerror}, {format_size(size)} needed", str(path)) from None
        # a filesystem without fallocate: the write itself reports a full disk, as before
    finally:
        os.close(fd)


def write_error(out: str | os.PathLike, e: OSError) -> DatasetError | None:
    """The one-line error for an ``OSError`` met while writing ``out`` (None for other errors)."""
    if e.errno in NO_SPACE:
        free, where = free_space(Path(out).parent)
        what = Path(e.filename).name if e.filename else "the output"
        return DatasetError(
            f"{out}: no room to write {what} ({e.strerror}; {format_size(free)} free in {where}); "
            "the partial output was removed"
        )
    parent = os.path.abspath(Path(out).parent)
    mine = e.filename is not None and os.path.abspath(e.filename).startswith(parent + os.sep)
    if mine and e.errno is None:  # a short write: the disk filled up or a file size limit
        free, where = free_space(Path(out).parent)
        return DatasetError(
            f"{out}: no room to write {Path(e.filename).name} ({e.strerror}; {format_size(free)} "
            f"free in {where}); the partial output was removed"
        )
    if mine and e.errno in (errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO):
        return DatasetError(
            f"{out}: cannot write it ({e.strerror}); the partial output was removed"
        )
    return None
