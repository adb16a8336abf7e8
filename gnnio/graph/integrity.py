"""What a dataset's ``meta.json`` may say, and the cheap integrity check of its array files at
every open (issue 16).

:func:`check_meta` refuses, with one line naming the key, a ``meta.json`` whose values have the
wrong type (``num_classes: "seven"``, ``format_version: "1"``), an array entry without a
``sha256``, or an array ``file`` that is not a plain file name inside the dataset directory
(``"/etc/passwd"``, ``"../x.npy"``, ``"sub/x.npy"``): a dataset only ever reads its own files.

:func:`quick_check` runs on every :func:`gnnio.load` unless the full ``verify`` runs instead. Per
array it reads at most :data:`SAMPLE_BYTES` (512 KiB), so an open reads a few MiB whatever the
dataset's size:

* the file's size must be the ``.npy`` header plus the data its shape and dtype imply (a file
  cut short or with bytes appended);
* a file of at most :data:`SAMPLE_BYTES` is hashed whole and compared with its ``sha256``;
* a larger one is compared with its ``sample_sha256`` (written by
  :class:`~gnnio.graph.format.DatasetWriter`): the sha256 of :data:`SAMPLE_BLOCKS` blocks of
  :data:`SAMPLE_BLOCK` bytes at fixed, evenly spaced offsets (the first and the last block
  included), after the file size. A file replaced by another one (another dataset's, or a
  reordered copy) differs there; a single flipped byte elsewhere in a large file does not, and
  only the full check (``gnnio info --verify``, ``gnnio train --verify``) finds it. Datasets
  written before ``sample_sha256`` existed get the size check and the whole-file hash of their
  small arrays only.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DatasetError
from ..utils.pages import drop_pages
from . import feature_dtype as fdt

__all__ = [
    "SAMPLE_BLOCK",
    "SAMPLE_BLOCKS",
    "SAMPLE_BYTES",
    "array_file",
    "check_meta",
    "count_nonfinite",
    "printable",
    "quick_check",
    "sample_sha256",
    "sha256_and_nonfinite",
    "sha256_file",
]

SAMPLE_BLOCK = 1 << 16
SAMPLE_BLOCKS = 8
SAMPLE_BYTES = SAMPLE_BLOCK * SAMPLE_BLOCKS

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
#: meta.json keys that hold a count, and the least value each may take
_COUNTS = {"num_nodes": 0, "num_edges": 0, "feat_dim": 0, "num_classes": 0}


def printable(text: Any) -> str:
    """``text`` with every non-printable character (ANSI escapes, newlines, NUL) written as its
    Python escape (``\\x1b``), so printing a name from a file cannot drive the terminal."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def _kind(v: Any) -> str:
    return "a string" if isinstance(v, str) else type(v).__name__


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_version(ver: Any, mfile: Path, supported: int) -> None:
    """``format_version`` must be the integer ``supported`` (one line saying what it is instead)."""
    if _is_int(ver) and ver == supported:
        return
    if not _is_int(ver):
        raise DatasetError(
            f"{mfile}: format_version must be the integer {supported}, got {printable(repr(ver))} "
            f"({_kind(ver)})"
        )
    raise DatasetError(
        f"{mfile}: format_version {ver} is not supported (this gnnio reads {supported})"
    )


def check_meta(meta: dict[str, Any], mfile: Path) -> None:
    """Types and ranges of every key a reader relies on (module docstring); one line per fault."""
    for key, least in _COUNTS.items():
        v = meta[key]
        if not _is_int(v) or v < least:
            raise DatasetError(
                f"{mfile}: {key} must be an integer >= {least}, got {printable(repr(v))}"
            )
    if not isinstance(meta["feat_dtype"], str):
        raise DatasetError(
            f"{mfile}: feat_dtype must be a string, got {printable(repr(meta['feat_dtype']))}"
        )
    if "name" in meta and not isinstance(meta["name"], str):
        raise DatasetError(f"{mfile}: name must be a string, got {_kind(meta['name'])}")
    arrays = meta["arrays"]
    if not isinstance(arrays, dict) or not arrays:
        raise DatasetError(f"{mfile}: 'arrays' must be a non-empty object of array entries")
    for key, info in arrays.items():
        where = f"{mfile}: arrays.{printable(key)}"
        if not isinstance(info, dict):
            raise DatasetError(f"{where} must be an object with file, dtype, shape and sha256")
        for field in ("file", "dtype", "shape", "sha256"):
            if field not in info:
                raise DatasetError(f"{where}: missing '{field}'")
        f = info["file"]
        if not isinstance(f, str) or f in ("", ".", "..") or os.path.basename(f) != f or "\\" in f:
            raise DatasetError(
                f"{where}: file {printable(repr(f))} is not a file name inside the dataset "
                "directory (a dataset reads only its own files)"
            )
        if not isinstance(info["dtype"], str):
            raise DatasetError(f"{where}: dtype must be a string, got {_kind(info['dtype'])}")
        shape = info["shape"]
        if not isinstance(shape, list) or not all(_is_int(s) and s >= 0 for s in shape):
            raise DatasetError(
                f"{where}: shape must be a list of integers >= 0, got {printable(repr(shape))}"
            )
        for field in ("sha256", "sample_sha256"):
            v = info.get(field)
            if field in info and not (isinstance(v, str) and _SHA256.match(v)):
                raise DatasetError(
                    f"{where}: {field} must be 64 lowercase hex digits, got {printable(repr(v))}"
                )


def array_file(path: Path, meta: dict[str, Any], key: str) -> Path:
    """The file of array ``key`` (its name checked by :func:`check_meta`)."""
    return Path(path) / meta["arrays"][key]["file"]


def _blocks(f, size: int):
    if size <= SAMPLE_BYTES:
        yield f.read()
        return
    span = size - SAMPLE_BLOCK
    for i in range(SAMPLE_BLOCKS):
        f.seek(i * span // (SAMPLE_BLOCKS - 1))
        yield f.read(SAMPLE_BLOCK)


def sample_sha256(file: Path) -> str:
    """sha256 of the file's size and :data:`SAMPLE_BLOCKS` evenly spaced blocks (the whole file
    when it is at most :data:`SAMPLE_BYTES`); reads at most :data:`SAMPLE_BYTES`."""
    h = hashlib.sha256()
    with open(file, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        h.update(f"{size}:{SAMPLE_BLOCK}:{SAMPLE_BLOCKS};".encode())
        for b in _blocks(f, size):
            h.update(b)
    return h.hexdigest()


def quick_check(path: Path, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """Sizes and sampled hashes of the opened ``arrays`` (module docstring); one line naming the
    first file that differs from what ``meta.json`` recorded."""
    for key, arr in arrays.items():
        info = meta["arrays"][key]
        f = array_file(path, meta, key)
        size = f.stat().st_size
        offset = getattr(arr, "offset", None)
        if offset is not None and size != offset + arr.nbytes:
            raise DatasetError(
                f"{f}: {size:,} bytes, but its header and shape {list(arr.shape)} make "
                f"{offset + arr.nbytes:,} (bytes appended or the file replaced; "
                "gnnio info --verify checks every byte)"
            )
        if size <= SAMPLE_BYTES:
            with open(f, "rb") as fh:
                got = hashlib.sha256(fh.read()).hexdigest()
            want, what = info["sha256"], "sha256"
        elif "sample_sha256" in info:
            got, want, what = sample_sha256(f), info["sample_sha256"], "sampled sha256"
        else:
            continue
        if got != want:
            raise DatasetError(
                f"{f}: {what} mismatch at open (changed or corrupt since it was written; "
                "gnnio info --verify checks every byte)"
            )


def sha256_file(path: Path, chunk: int = 1 << 24) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def sha256_and_nonfinite(path: Path, feat_dtype: str, chunk: int = 1 << 24) -> tuple[str, int]:
    """``(sha256_file(path), count_nonfinite(features))`` of a feature ``.npy`` file in one pass:
    every chunk read is hashed and its values counted before the next, so a file larger than RAM
    is read from the device once, not twice (issue 25: 2 of prepare's 11.6 minutes at 26.8 GB).
    ``feat_dtype`` as in :func:`count_nonfinite` (``bfloat16``: the values are int16 bits). A
    thread reading ahead while this one hashes was measured and not kept (no gain here)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, _fortran, dtype = np.lib.format.read_array_header_1_0(f)
        else:
            shape, _fortran, dtype = np.lib.format.read_array_header_2_0(f)
        off = f.tell()
        f.seek(0)
        h.update(f.read(off))
        itemsize = dtype.itemsize
        end = off + int(np.prod(shape)) * itemsize  # the array's end; bytes after: hashed only
        buf = bytearray(max(itemsize, chunk - chunk % itemsize))
        bad = 0
        while got := _fill(f, buf):  # whole chunks but the last: each starts at a whole value
            view = memoryview(buf)[:got]
            h.update(view)
            take = max(0, min(got, end - off))
            take -= take % itemsize
            if take:
                bad += _nonfinite_in(np.frombuffer(view, dtype, take // itemsize), feat_dtype)
            off += got
    return h.hexdigest(), bad


def _fill(f, buf: bytearray) -> int:
    """Read into all of ``buf`` (less only at the end of the file); the bytes read."""
    mv, got = memoryview(buf), 0
    while got < len(buf) and (n := f.readinto(mv[got:])):
        got += n
    return got


def count_nonfinite(
    feats: np.ndarray, chunk_bytes: int = 64 << 20, drop: bool = False, feat_dtype: str = ""
) -> int:
    """Number of NaN or infinite values in ``feats`` (read ``chunk_bytes`` at a time). ``drop``:
    after each chunk, drop the pages read from this process (a mapping never written to;
    :func:`gnnio.utils.pages.drop_pages`), so the pass does not keep the file resident.
    ``feat_dtype="bfloat16"``: ``feats`` holds bfloat16 bits (int16)."""
    if feat_dtype == "bfloat16":
        return fdt.count_nonfinite_encoded(feats, feat_dtype)
    if feats.dtype.kind != "f" or feats.size == 0:
        return 0
    rows = max(1, chunk_bytes // max(1, feats[:1].nbytes))
    bad = 0
    for s in range(0, feats.shape[0], rows):
        bad += _nonfinite_in(np.asarray(feats[s : s + rows]), feat_dtype)
        if drop:
            drop_pages(feats)
    return bad


def _nonfinite_in(block: np.ndarray, feat_dtype: str) -> int:
    """NaN or infinite values in one chunk of stored features (``feat_dtype`` as in
    :func:`count_nonfinite`)."""
    if feat_dtype == "bfloat16":
        return fdt.count_nonfinite_encoded(block, feat_dtype)
    if block.dtype.kind != "f" or block.size == 0:
        return 0
    # cheap test first: a NaN or an infinity anywhere makes the sum non-finite
    if np.isfinite(block.sum(dtype=np.float64)):
        return 0
    return int(block.size - np.count_nonzero(np.isfinite(block)))
