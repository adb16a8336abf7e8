"""Output files of the commands (summaries, logs, model files, plans): what may be written where,
and writing them atomically under a name no other writer uses.

An output never replaces something that is not a regular file (a directory, a device such as
``/dev/full``, a pipe, a socket) nor a file inside a gnnio dataset directory (the dataset would no
longer open); the check is one line naming the option. Writes go to a temporary file unique to
this process and call (``.NAME.tmp-<pid>-<random>`` next to the target), are ``fsync``-ed and
renamed over the target, so two concurrent writers never share a temporary file and a reader
sees the old or the new file, never a part. The temporaries a killed writer left (its pid no
longer runs) are removed by the next write to the same target (:func:`remove_stale_files`)."""

from __future__ import annotations

import json
import os
import re
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import IO

from ..errors import UsageError

__all__ = [
    "AtomicLog",
    "check_figure_path",
    "check_output_path",
    "dataset_dir_of",
    "remove_stale_files",
    "save_figure",
    "write_atomic",
]


def dataset_dir_of(path: str | os.PathLike) -> Path | None:
    """The gnnio dataset directory ``path`` lies in (its parent or an ancestor), or None."""
    for d in Path(os.path.abspath(path)).parents:
        meta = d / "meta.json"
        if meta.is_file():
            try:
                if json.loads(meta.read_text()).get("format") == "gnnio-dataset":
                    return d
            except (OSError, ValueError, AttributeError, RecursionError):
                continue
    return None


def check_output_path(path: str | os.PathLike, option: str) -> Path:
    """``Path(path)`` if an output file may be written there, else a one-line
    :class:`~gnnio.errors.UsageError` naming ``option`` (module docstring)."""
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{option} {p}: is a directory; give a file path")
    if p.exists() and not p.is_file():
        raise UsageError(
            f"{option} {p}: exists and is not a regular file (a device, pipe or socket); "
            "not replacing it"
        )
    for a in p.parents:
        if a.exists():
            if not a.is_dir():
                raise UsageError(f"{option} {p}: {a} is a file, not a directory")
            break
    for where in (p, Path(os.path.realpath(p))):  # also through a symlink (file or folder)
        ds = dataset_dir_of(where)
        if ds is not None:
            via = "" if where == p else f" (through a symlink to {where})"
            raise UsageError(
                f"{option} {p}: inside the dataset directory {ds}{via}; write it elsewhere"
            )
    return p


def _figure_format(p: Path, option: str) -> str:
    from matplotlib.backend_bases import FigureCanvasBase

    kinds = FigureCanvasBase.get_supported_filetypes()
    ext = p.suffix[1:].lower()
    if ext not in kinds:
        raise UsageError(
            f"{option} {p}: name the image format by the file's suffix "
            f"({', '.join('.' + k for k in sorted(kinds))})"
        )
    return ext


def check_figure_path(path: str | os.PathLike, option: str = "--plot") -> Path:
    """:func:`check_output_path`, and the suffix names a format matplotlib writes (the format
    is taken from it; matplotlib itself would append ``.png`` to a name without one)."""
    p = check_output_path(path, option)
    _figure_format(p, option)
    return p


def save_figure(fig, path: str | os.PathLike, option: str = "--plot", **kwargs) -> None:
    """``fig.savefig`` into exactly ``path`` (in the format its suffix names), atomically
    (:func:`write_atomic`): an OS error is one line naming ``option``."""
    fmt = _figure_format(Path(path), option)
    write_atomic(path, lambda f: fig.savefig(f, format=fmt, **kwargs), option)


def remove_stale_files(directory: str | os.PathLike, prefix: str) -> list[Path]:
    """Remove the temporary files ``<prefix>...tmp-<pid>-<random>`` in ``directory`` whose
    writer is gone (its pid no longer runs): what a process killed in the middle of a write
    left (:func:`write_atomic`'s, a checkpoint's). Returns what was removed."""
    from ..graph.output_dir import _pid_alive

    pat = re.compile(rf"^{re.escape(prefix)}.*\.tmp-(\d+)-[0-9a-f]+$")
    try:
        entries = list(Path(directory).iterdir())
    except OSError:
        return []
    gone = []
    for e in entries:
        m = pat.match(e.name)
        if m is not None and e.is_file() and not e.is_symlink() and not _pid_alive(int(m[1])):
            try:
                e.unlink()
                gone.append(e)
            except OSError:
                continue
    return gone


class _RecordingFile:
    """A binary file whose ``write`` remembers the OSError it raised: ``torch.save`` reports a
    failed write (no space, ``ulimit -f``) as a RuntimeError that no longer names the cause."""

    def __init__(self, f: IO[bytes]):
        self._f = f
        self.error: OSError | None = None

    def write(self, b) -> int:
        try:
            return self._f.write(b)
        except OSError as e:
            self.error = e
            raise

    def __getattr__(self, name: str):
        return getattr(self._f, name)


def write_atomic(
    path: str | os.PathLike, write: Callable[[IO[bytes]], object], option: str
) -> None:
    """Write ``path`` through ``write(binary file)`` atomically (module docstring); an OS error
    (no space, no permission) is one line naming ``option`` and leaves no temporary file."""
    p = check_output_path(path, option)
    tmp = p.with_name(f".{p.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    remove_stale_files(p.parent, f".{p.name}")
    rec = None
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            rec = _RecordingFile(f)
            write(rec)  # type: ignore[arg-type]
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise UsageError(f"{option} {p}: cannot write it ({e.strerror or e})") from None
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if rec is not None and rec.error is not None and isinstance(e, Exception):
            err = rec.error
            raise UsageError(f"{option} {p}: cannot write it ({err.strerror or err})") from None
        raise


class AtomicLog:
    """``--log F``: one JSON line per record, the whole file rewritten atomically
    (:func:`write_atomic`) after every :meth:`append`. An existing ``F`` stays as it was until
    the first record, and an interrupt or a failed write (full disk, ``ulimit -f``) leaves the
    previous complete version, never a cut line (rewriting costs O(lines) per record: a log
    has one line per epoch)."""

    def __init__(self, path: str | os.PathLike, option: str = "--log", lines=()):
        self.path, self.option = check_output_path(path, option), option
        self.lines = [json.dumps(r) + "\n" for r in lines]

    def append(self, record) -> None:
        self.lines.append(json.dumps(record) + "\n")
        text = "".join(self.lines).encode()
        write_atomic(self.path, lambda f: f.write(text), self.option)
