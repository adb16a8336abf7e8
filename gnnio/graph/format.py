"""gnnio's on-disk dataset format (version 1), its atomic writer and its validating reader.

A dataset is a directory with ``meta.json`` and one ``.npy`` file per array. See docs/format.md.
The writer builds everything in a temporary sibling directory and renames it into place only after
every array and the metadata (with sha256 checksums) are written and flushed, so an interrupted write
never leaves a directory that opens as a valid dataset. Where it may write, the claim that keeps a
second writer out, stale temporaries and a full disk: :mod:`gnnio.graph.output_dir`.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DatasetError
from ..utils.pages import drop_pages
from . import feature_dtype as fdt
from . import output_dir
from .csr import index_dtype
from .integrity import (
    check_meta,
    check_version,
    count_nonfinite,
    printable,
    sample_sha256,
    sha256_and_nonfinite,
    sha256_file,
)

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "META_FILE",
    "DatasetWriter",
    "read_meta",
    "load_arrays",
    "validate_arrays",
    "verify_checksums",
    "sha256_file",
    "sha256_and_nonfinite",
    "count_nonfinite",
]

FORMAT_NAME = "gnnio-dataset"
FORMAT_VERSION = 1
META_FILE = "meta.json"

#: arrays with a fixed meaning; any other array is allowed and only checksummed
CORE_ARRAYS = ("indptr", "indices", "features", "labels", "train_idx", "valid_idx", "test_idx")
SPLITS = ("train_idx", "valid_idx", "test_idx")
FEATURE_DTYPES = fdt.FEATURE_DTYPES


class DatasetWriter:
    """Write a dataset atomically.

    Use as a context manager::

        with DatasetWriter(out, name="cora") as w:
            w.save_array("indptr", indptr)
            feats = w.create_array("features", (n, f), np.float32)  # memmap, filled in place
            feats[:] = ...
            w.meta["num_classes"] = 7

    On a clean exit the metadata (counts, dtypes, shapes, sha256) is written and the temporary
    directory renamed to ``out``. On an exception the temporary directory is removed and ``out`` is
    untouched. An existing ``out`` is replaced only with ``overwrite=True`` (and only if it is a
    dataset or an empty directory). While open, the writer holds the claim of ``out`` (a second
    writer fails with one line) and on entering removes the stale temporaries of crashed writes
    (:mod:`~gnnio.graph.output_dir`).

    ``size_hint``: the estimated size of the output in bytes; more than the free space is refused
    before anything is written. Memory-mapped arrays are preallocated, and a full disk (``ENOSPC``)
    anywhere in the write is one line. The written data is refused when a train split holds no
    labeled node, and when features hold NaN or infinite values unless ``allow_nonfinite``
    (then ``meta["nonfinite_features"]`` counts them).

    ``feature_dtype``: store the features as this encoding (float32, float16, bfloat16, int8;
    :mod:`gnnio.graph.feature_dtype`), converted in the temporary directory after the arrays are
    written; None: the encoding of the enclosing :func:`~gnnio.graph.feature_dtype.writing_as`
    block, else as written (float32, float16, int16 bits = bfloat16, int8 with its codec arrays).
    """

    def __init__(
        self,
        out: str | os.PathLike,
        name: str,
        overwrite: bool = False,
        *,
        allow_nonfinite: bool = False,
        size_hint: int | None = None,
        feature_dtype: str | None = None,
    ):
        self.out = Path(out)
        self.feature_dtype = feature_dtype if feature_dtype is not None else fdt.requested()
        self.name = name
        self.overwrite = overwrite
        self.allow_nonfinite = allow_nonfinite
        self.size_hint = size_hint
        self.meta: dict[str, Any] = {}
        self._arrays: dict[str, str] = {}
        self._open: dict[str, np.memmap] = {}
        self._claim = ExitStack()
        self.tmp: Path | None = None

    def __enter__(self) -> DatasetWriter:
        output_dir.check_out_dir(self.out, self.overwrite)
        self._claim.enter_context(output_dir.claim(self.out))
        try:
            output_dir.check_out_dir(self.out, self.overwrite)  # again, now that it is ours
            output_dir.remove_stale(self.out)
            if self.size_hint is not None:
                output_dir.check_disk(self.out, self.size_hint)
            self.tmp = output_dir.make_temp_dir(self.out, "tmp")
        except BaseException:
            self._claim.close()
            raise
        return self

    def path(self, key: str) -> Path:
        """Where array ``key`` is written: ``key`` is a plain file name (no separator, no leading
        dot), so nothing lands outside the dataset's directory."""
        assert self.tmp is not None, "use DatasetWriter as a context manager"
        if not isinstance(key, str) or not key or key[0] == "." or any(c in key for c in "/\\\0"):
            raise ValueError(f"array name: need a plain file name, got {key!r}")
        return self.tmp / f"{key}.npy"

    def create_array(self, key: str, shape: tuple[int, ...], dtype: Any) -> np.memmap:
        """A writable memory-mapped ``.npy`` to fill in place (for arrays larger than RAM)."""
        arr = np.lib.format.open_memmap(self.path(key), mode="w+", dtype=dtype, shape=shape)
        self._arrays[key] = f"{key}.npy"
        self._open[key] = arr
        output_dir.preallocate(self.path(key))
        return arr

    def save_array(self, key: str, arr: np.ndarray) -> None:
        try:
            np.save(self.path(key), np.ascontiguousarray(arr), allow_pickle=False)
        except OSError as e:
            if e.errno is None:  # numpy's short write ("N requested and M written"): no errno
                raise OSError(None, f"short write, {e}", str(self.path(key))) from None
            raise
        self._arrays[key] = f"{key}.npy"

    def __exit__(self, exc_type, exc, tb) -> None:
        assert self.tmp is not None
        with self._claim:
            if exc_type is not None:
                self._open.clear()
                shutil.rmtree(self.tmp, ignore_errors=True)
                if isinstance(exc, OSError) and (err := output_dir.write_error(self.out, exc)):
                    raise err from None
                return
            try:
                for arr in self._open.values():
                    arr.flush()
                self._open.clear()
                self._finish()
            except OSError as e:
                shutil.rmtree(self.tmp, ignore_errors=True)
                if err := output_dir.write_error(self.out, e):
                    raise err from None
                raise
            except BaseException:
                shutil.rmtree(self.tmp, ignore_errors=True)
                raise

    def _finish(self) -> None:
        assert self.tmp is not None
        arrays = load_arrays(self.tmp, list(self._arrays))
        for key in ("indptr", "indices", "features"):
            if key not in arrays:
                raise DatasetError(f"{self.out}: a dataset needs an array '{key}'")
        try:
            feat_dtype = fdt.feature_dtype_of(arrays["features"].dtype)
        except ValueError as e:
            raise DatasetError(f"{self.out}: {e}") from None
        if self.feature_dtype is not None and self.feature_dtype != feat_dtype:
            del arrays
            fdt.recode_features(self.tmp, self._arrays, feat_dtype, self.feature_dtype)
            feat_dtype = self.feature_dtype
            arrays = load_arrays(self.tmp, list(self._arrays))
        n = int(arrays["indptr"].shape[0]) - 1
        meta: dict[str, Any] = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "name": self.name,
            "num_nodes": n,
            "num_edges": int(arrays["indices"].shape[0]),
            "feat_dim": int(arrays["features"].shape[1]) if arrays["features"].ndim == 2 else -1,
            "feat_dtype": feat_dtype,
            "num_classes": 0,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        if "labels" in arrays:
            lab = np.asarray(arrays["labels"])
            meta["num_classes"] = int(lab.max()) + 1 if lab.size and lab.max() >= 0 else 0
        meta.update(self.meta)
        meta["feat_dtype"] = feat_dtype
        # the features are hashed and their non-finite values counted in the same pass (one read
        # of a file that may be larger than RAM); the count is acted on after the other checks
        feat_sha, bad = sha256_and_nonfinite(self.tmp / self._arrays["features"], feat_dtype)
        meta["arrays"] = {
            key: {
                "file": fname,
                "dtype": str(arrays[key].dtype),
                "shape": list(arrays[key].shape),
                "sha256": feat_sha if key == "features" else sha256_file(self.tmp / fname),
                "sample_sha256": sample_sha256(self.tmp / fname),
            }
            for key, fname in sorted(self._arrays.items())
        }
        del arrays
        written = load_arrays(self.tmp, list(self._arrays))
        validate_arrays(self.tmp, meta, written, drop=True)
        self._check_trainable(written)
        del written
        if bad and not self.allow_nonfinite:
            raise DatasetError(
                f"{self.out}: the features hold {bad:,} NaN or infinite values; fix the input or "
                "pass --allow-nonfinite to keep them"
            )
        if bad:
            meta["nonfinite_features"] = bad
        else:
            meta.pop("nonfinite_features", None)
        meta_path = self.tmp / META_FILE
        with open(meta_path, "w") as f:
            json.dump(meta, f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        for fname in self._arrays.values():
            fd = os.open(self.tmp / fname, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        if self.out.exists():
            if not self.overwrite:
                raise DatasetError(f"{self.out}: appeared while it was written; not replacing it")
            old = output_dir.make_temp_dir(self.out, "old")
            os.rmdir(old)
            os.rename(self.out, old)
            os.rename(self.tmp, self.out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(self.tmp, self.out)
        self.meta = meta

    def _check_trainable(self, arrays: dict[str, np.ndarray]) -> None:
        """With labels, a train split must hold at least one labeled node (else training learns
        from nothing). A dataset without labels or without a train split is for benchmarks
        (training refuses it with one line) and passes."""
        lab = arrays.get("labels")
        if "train_idx" not in arrays or lab is None:
            return
        train = np.asarray(arrays["train_idx"])
        if train.size == 0 or not np.any(lab[train] >= 0):
            why = "it is empty" if train.size == 0 else f"none of its {train.size:,} nodes has one"
            raise DatasetError(
                f"{self.out}: no labeled training node in the train split ({why}); training "
                "needs at least one"
            )


def _min_max(a: np.ndarray, drop: bool, chunk: int = 1 << 24) -> tuple[int, int]:
    """``(min, max)`` of a non-empty 1-D array, ``chunk`` items at a time; ``drop`` as in
    :func:`count_nonfinite`."""
    lo, hi = None, None
    for s in range(0, a.shape[0], chunk):
        block = a[s : s + chunk]
        b_lo, b_hi = int(block.min()), int(block.max())
        lo = b_lo if lo is None else min(lo, b_lo)
        hi = b_hi if hi is None else max(hi, b_hi)
        if drop:
            drop_pages(a)
    assert lo is not None and hi is not None
    return lo, hi


def read_meta(path: str | os.PathLike) -> dict[str, Any]:
    path = Path(path)
    mfile = path / META_FILE
    if not path.is_dir():
        raise DatasetError(f"{path}: {'not a directory' if path.exists() else 'no such directory'}")
    if output_dir.is_temp_dir_name(Path(os.path.abspath(path)).name):
        raise DatasetError(
            f"{path}: the temporary directory of an interrupted write, not a dataset (the next "
            "write to its target removes it)"
        )
    if not mfile.is_file():
        raise DatasetError(f"{mfile}: missing (not a gnnio dataset, or an interrupted write)")
    try:
        meta = json.loads(mfile.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DatasetError(f"{mfile}: not valid JSON ({e})") from None
    except RecursionError:
        raise DatasetError(f"{mfile}: not a gnnio dataset (JSON nested too deep)") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        if isinstance(meta, dict) and str(meta.get("format")).startswith("gnnio-partition"):
            why = "a 'gnnio partition' output: give the dataset as DIR and this as --partition"
        else:
            why = f"format is not '{FORMAT_NAME}'"
        raise DatasetError(f"{mfile}: not a gnnio dataset ({why})")
    check_version(meta.get("format_version"), mfile, FORMAT_VERSION)
    for key in ("num_nodes", "num_edges", "feat_dim", "feat_dtype", "num_classes", "arrays"):
        if key not in meta:
            raise DatasetError(f"{mfile}: missing key '{key}'")
    check_meta(meta, mfile)  # types, array entries, file names inside the directory
    return meta


def _open_npy(f: Path) -> np.ndarray:
    """``f`` memory-mapped copy-on-write, or read-only where the kernel refuses a private mapping
    that large: a writable ``MAP_PRIVATE`` mapping is charged against the commit limit, and with
    the default heuristic overcommit one larger than RAM + swap fails with ENOMEM (issue 25: the
    26.8 GB features of a dataset larger than this machine's 24 GiB). A shared read-only mapping is
    not charged; writing into it raises instead of copying the page."""
    try:
        return np.load(f, mmap_mode="c", allow_pickle=False)
    except OSError as e:
        if e.errno != errno.ENOMEM:
            raise
    return np.load(f, mmap_mode="r", allow_pickle=False)


def load_arrays(path: Path, keys: list[str], meta: dict | None = None) -> dict[str, np.ndarray]:
    """Open ``.npy`` arrays memory-mapped copy-on-write (never read whole, never written back;
    read-only where a private mapping is refused: :func:`_open_npy`)."""
    out = {}
    for key in keys:
        fname = meta["arrays"][key]["file"] if meta else f"{key}.npy"
        f = Path(path) / fname
        if not f.is_file():
            raise DatasetError(f"{f}: missing array file")
        real, root = os.path.realpath(f), os.path.realpath(path)
        if os.path.commonpath([real, root]) != root:  # a dataset reads only its own files
            raise DatasetError(f"{f}: a symlink to {real}, outside the dataset directory")
        try:
            a = _open_npy(f)
        except (ValueError, OSError, EOFError) as e:
            raise DatasetError(f"{f}: not a readable .npy file ({e})") from None
        if not isinstance(a, np.ndarray):  # np.load opens a zip archive (.npz) as well
            a.close()
            raise DatasetError(f"{f}: not a .npy file (it is a zip archive, e.g. an .npz)")
        out[key] = a
    return out


def validate_arrays(
    path: Path, meta: dict, arrays: dict[str, np.ndarray], drop: bool = False
) -> None:
    """Check the format invariants; raise DatasetError with one line naming the file and problem."""
    n = int(meta["num_nodes"])
    e = int(meta["num_edges"])

    def fname(key: str) -> Path:
        return Path(path) / meta["arrays"][key]["file"]

    # shapes and dtypes match the metadata
    for key, arr in arrays.items():
        info = meta["arrays"][key]
        if list(arr.shape) != list(info["shape"]):
            raise DatasetError(
                f"{fname(key)}: shape {list(arr.shape)} does not match meta.json {info['shape']}"
            )
        if str(arr.dtype) != info["dtype"]:
            raise DatasetError(
                f"{fname(key)}: dtype {arr.dtype} does not match meta.json {info['dtype']}"
            )
    for key in ("indptr", "indices", "features"):
        if key not in arrays:
            raise DatasetError(f"{Path(path) / META_FILE}: array '{key}' is missing")
    indptr, indices, feats = arrays["indptr"], arrays["indices"], arrays["features"]
    if indptr.dtype != np.int64 or indptr.shape != (n + 1,):
        raise DatasetError(
            f"{fname('indptr')}: must be int64 of length num_nodes+1 = {n + 1}, "
            f"got {indptr.dtype} {list(indptr.shape)}"
        )
    want_idx = index_dtype(n)
    if indices.dtype != want_idx or indices.shape != (e,):
        raise DatasetError(
            f"{fname('indices')}: must be {want_idx} of length num_edges = {e}, "
            f"got {indices.dtype} {list(indices.shape)}"
        )
    if meta["feat_dtype"] not in FEATURE_DTYPES:
        raise DatasetError(
            f"{Path(path) / META_FILE}: feat_dtype {printable(repr(meta['feat_dtype']))} is not "
            f"one of {', '.join(FEATURE_DTYPES)}"
        )
    want = fdt.storage_dtype(meta["feat_dtype"])
    if feats.dtype != want or feats.ndim != 2 or feats.shape[0] != n:
        raise DatasetError(
            f"{fname('features')}: must be {want} ({meta['feat_dtype']}) of shape [{n}, F], "
            f"got {feats.dtype} {list(feats.shape)}"
        )
    if feats.shape[1] != int(meta["feat_dim"]):
        raise DatasetError(
            f"{fname('features')}: {feats.dtype} [{n}, {feats.shape[1]}] does not match "
            f"meta.json feat_dim={meta['feat_dim']} feat_dtype={meta['feat_dtype']}"
        )
    fdt.check_codec(path, meta, arrays)
    # CSR invariants
    if indptr[0] != 0:
        raise DatasetError(f"{fname('indptr')}: must start at 0, starts at {int(indptr[0])}")
    if n > 0:
        d = np.diff(indptr)
        bad = np.flatnonzero(d < 0)
        if bad.size:
            raise DatasetError(f"{fname('indptr')}: decreases at position {int(bad[0]) + 1}")
    if indptr[-1] != e:
        raise DatasetError(
            f"{fname('indptr')}: must end at num_edges = {e}, ends at {int(indptr[-1])}"
        )
    if e:
        lo, hi = _min_max(indices, drop)  # ``drop``: the writer's own files, pages not kept
        if lo < 0 or hi >= n:
            odd = lo if lo < 0 else hi
            raise DatasetError(f"{fname('indices')}: node id {odd} is out of range [0, {n})")
    # labels
    c = int(meta["num_classes"])
    if "labels" in arrays:
        lab = arrays["labels"]
        if lab.dtype != np.int64 or lab.shape != (n,):
            raise DatasetError(
                f"{fname('labels')}: must be int64 of length {n}, got {lab.dtype} {list(lab.shape)}"
            )
        if n:
            lo, hi = int(lab.min()), int(lab.max())
            if lo < -1 or hi >= c:
                odd = lo if lo < -1 else hi
                raise DatasetError(
                    f"{fname('labels')}: label {odd} is out of range [-1, {c}) (num_classes={c})"
                )
            if 0 <= hi < c - 1:  # the top classes never occur: a c-way model for fewer classes
                raise DatasetError(
                    f"{Path(path) / META_FILE}: num_classes is {c} but the largest label is {hi}; "
                    f"set num_classes to {hi + 1}"
                )
    # splits
    seen = np.zeros(n, dtype=np.bool_)
    for key in SPLITS:
        if key not in arrays:
            continue
        idx = np.asarray(arrays[key])
        if idx.dtype != np.int64 or idx.ndim != 1:
            raise DatasetError(f"{fname(key)}: must be a 1-D int64 array, got {idx.dtype}")
        if idx.size == 0:
            continue
        lo, hi = int(idx.min()), int(idx.max())
        if lo < 0 or hi >= n:
            odd = lo if lo < 0 else hi
            raise DatasetError(f"{fname(key)}: node id {odd} is out of range [0, {n})")
        if np.unique(idx).shape[0] != idx.shape[0]:
            raise DatasetError(f"{fname(key)}: contains repeated node ids")
        clash = idx[seen[idx]]
        if clash.size:
            raise DatasetError(
                f"{fname(key)}: node {int(clash[0])} is also in another split "
                f"(splits must be disjoint)"
            )
        seen[idx] = True


def verify_checksums(path: Path, meta: dict) -> None:
    for info in meta["arrays"].values():
        f = Path(path) / info["file"]
        if not f.is_file():
            raise DatasetError(f"{f}: missing array file")
        got = sha256_file(f)
        if got != info["sha256"]:
            raise DatasetError(
                f"{f}: sha256 mismatch (file changed or corrupt since it was written)"
            )
