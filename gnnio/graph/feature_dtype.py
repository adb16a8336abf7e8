"""Compressed feature rows (issue 25, item 4): how a dataset stores its features and how they
become float32 again.

``meta.json``'s ``feat_dtype`` names the encoding; the ``features`` array holds the encoded rows:

=========== ================= =====================================================================
feat_dtype   stored as          decoded (float32) as
=========== ================= =====================================================================
float32      float32            itself
float16      float16            ``x.float()``
bfloat16     int16 (the bits)   ``x.view(bfloat16).float()``: NumPy has no bfloat16, so the file
                                holds the 16 bits of each value. int16 rather than uint16 because
                                torch supports every indexing and copy op on int16, on the CPU and
                                on CUDA, while uint16 is one of its "barebones" dtypes.
int8         int8               ``(q - zero_point) * scale``, per column, from the arrays
                                ``x_scale`` and ``x_zero_point`` (float32 ``[F]``) of the dataset
=========== ================= =====================================================================

**int8 quantization**: asymmetric, per column, from the column's min and max, with torch's names
and semantics (``torch.quantize_per_channel(x, scale, zero_point, axis=1, dtype=torch.qint8)``;
torch's ``MinMaxObserver`` chooses them the same way): the range ``[lo, hi] = [min(min, 0),
max(max, 0)]`` is stretched over the 256 codes, ``scale = (hi - lo) / 255``, ``zero_point =
round(-128 - lo / scale)`` (an integer in ``[-128, 127]``, kept as float32), ``q = clamp(round(x /
scale) + zero_point, -128, 127)``. Why this one: *asymmetric* uses all 256 codes on a column that
is one-signed (most feature columns: counts, bag-of-words, ReLU outputs), where a symmetric scheme
would waste half of them; *per column* because columns differ in range by orders of magnitude and
one scale for all would flatten the narrow ones; *zero inside the range* (as torch does) so a zero
stays exactly zero, which keeps sparse features sparse, and a constant column ``c != 0`` has a
non-zero range ``[min(c, 0), max(c, 0)]``. Only an all-zero column has ``scale = 0``: it encodes as
``q = zero_point = 0`` (no division) and decodes to 0 exactly. The error of a decoded value is at
most half a step (``scale / 2``) inside the range, at most one step at its ends (the rounding of
``zero_point`` shifts the range by up to half a step and the end value is clamped).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import DatasetError
from ..utils.pages import drop_pages

__all__ = [
    "FEATURE_DTYPES",
    "FeatureCodec",
    "SCALE",
    "ZERO_POINT",
    "storage_dtype",
    "feature_dtype_of",
    "writing_as",
    "requested",
    "check_codec",
    "column_range",
    "int8_params",
    "encode",
    "decode",
    "count_nonfinite_encoded",
    "recode_features",
]

#: every ``feat_dtype`` a dataset may have, and the NumPy dtype its features file holds
_STORAGE: dict[str, np.dtype] = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(np.int16),
    "int8": np.dtype(np.int8),
}
FEATURE_DTYPES = tuple(_STORAGE)
#: the int8 codec's arrays in the dataset (float32 ``[F]``)
SCALE, ZERO_POINT = "x_scale", "x_zero_point"
_F16_MAX = float(np.finfo(np.float16).max)


@dataclass(frozen=True)
class FeatureCodec:
    """How stored feature rows become float32: ``feat_dtype`` and, for int8, the per-column
    ``scale`` and ``zero_point`` (float32 ``[F]``; None otherwise). ``bytes`` counts the
    codec's own arrays (read once, not per row)."""

    feat_dtype: str = "float32"
    scale: np.ndarray | None = None
    zero_point: np.ndarray | None = None

    @property
    def bytes(self) -> int:
        return sum(int(a.nbytes) for a in (self.scale, self.zero_point) if a is not None)

    def decode(self, x: np.ndarray) -> np.ndarray:
        """Stored rows -> float32 rows (NumPy)."""
        return decode(x, self.feat_dtype, self.scale, self.zero_point)


def storage_dtype(feat_dtype: str) -> np.dtype:
    """The NumPy dtype of the features file of a dataset whose ``feat_dtype`` is this."""
    try:
        return _STORAGE[feat_dtype]
    except KeyError:
        raise ValueError(
            f"unknown feature dtype {feat_dtype!r}; choose one of {', '.join(FEATURE_DTYPES)}"
        ) from None


def feature_dtype_of(stored) -> str:
    """The ``feat_dtype`` of a features array of NumPy dtype ``stored`` (each encoding has its
    own storage dtype, so this is unambiguous: int16 is bfloat16)."""
    for name, dt in _STORAGE.items():
        if np.dtype(stored) == dt:
            return name
    raise ValueError(f"features of dtype {np.dtype(stored)} are not a feature encoding")


_REQUESTED: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "feature_dtype", default=None
)


@contextlib.contextmanager
def writing_as(feat_dtype: str | None):
    """Within this block, datasets written by :class:`~gnnio.graph.format.DatasetWriter` without
    an explicit ``feature_dtype`` store their features as ``feat_dtype`` (None: as the writer
    got them). How ``prepare|reorder --feature-dtype`` reaches every importer's writer."""
    if feat_dtype is not None:
        storage_dtype(feat_dtype)
    token = _REQUESTED.set(feat_dtype)
    try:
        yield
    finally:
        _REQUESTED.reset(token)


def requested() -> str | None:
    """The feature dtype of the enclosing :func:`writing_as` block, or None."""
    return _REQUESTED.get()


def check_codec(path: Path, meta: dict, arrays: dict) -> None:
    """One line (DatasetError) when an int8 dataset lacks a valid ``x_scale`` / ``x_zero_point``
    (float32 ``[F]``, finite, scale >= 0, integer zero points in [-128, 127])."""
    if meta["feat_dtype"] != "int8":
        return
    f = int(meta["feat_dim"])
    for key in (SCALE, ZERO_POINT):
        a = arrays.get(key)
        where = Path(path) / (meta["arrays"][key]["file"] if key in meta["arrays"] else key)
        if a is None:
            raise DatasetError(
                f"{where}: missing; an int8 dataset needs '{SCALE}' and '{ZERO_POINT}'"
            )
        if a.dtype != np.float32 or a.shape != (f,):
            raise DatasetError(
                f"{where}: must be float32 of shape [{f}], got {a.dtype} {list(a.shape)}"
            )
        if not np.isfinite(a).all():
            raise DatasetError(f"{where}: holds NaN or infinite values")
    scale, zp = np.asarray(arrays[SCALE]), np.asarray(arrays[ZERO_POINT])
    if (scale < 0).any():
        raise DatasetError(f"{Path(path) / SCALE}.npy: a negative scale")
    if ((zp < -128) | (zp > 127) | (zp != np.round(zp))).any():
        raise DatasetError(
            f"{Path(path) / ZERO_POINT}.npy: zero points must be integers in [-128, 127]"
        )


def column_range(x: np.ndarray, chunk_rows: int = 1 << 16) -> tuple[np.ndarray, np.ndarray]:
    """Per-column ``(min, max)`` of ``[N, F]`` float rows as float64, ``chunk_rows`` at a time
    (zeros for an empty matrix)."""
    f = x.shape[1]
    lo, hi = np.zeros(f), np.zeros(f)
    for s in range(0, x.shape[0], chunk_rows):
        block = np.asarray(x[s : s + chunk_rows], dtype=np.float64)
        if s == 0:
            lo, hi = block.min(axis=0), block.max(axis=0)
        else:
            np.minimum(lo, block.min(axis=0), out=lo)
            np.maximum(hi, block.max(axis=0), out=hi)
    return lo, hi


def int8_params(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(scale, zero_point)`` (float32 ``[F]``) for per-column ranges ``[lo, hi]`` (see the
    module docstring): zero is put inside the range; an all-zero column gets scale 0, zero point 0."""
    lo = np.minimum(np.asarray(lo, dtype=np.float64), 0.0)
    hi = np.maximum(np.asarray(hi, dtype=np.float64), 0.0)
    width = hi - lo
    scale32 = (width / 255.0).astype(np.float32)
    # a float32 scale rounded down (or to 0 for a subnormal range) would not cover the range
    short = scale32.astype(np.float64) * 255.0 < width
    scale32[short] = np.nextafter(scale32[short], np.float32(np.inf))
    scale = scale32.astype(np.float64)
    safe = np.where(scale > 0, scale, 1.0)
    zp = np.where(scale > 0, np.clip(np.round(-128.0 - lo / safe), -128, 127), 0.0)
    return scale.astype(np.float32), zp.astype(np.float32)


def encode(x: np.ndarray, feat_dtype: str, scale=None, zero_point=None) -> np.ndarray:
    """float rows -> stored rows of ``feat_dtype`` (int8 needs ``scale`` and ``zero_point``).
    Raises ValueError for values float16 cannot hold (beyond +-65504)."""
    if feat_dtype == "float32":
        return np.asarray(x, dtype=np.float32)
    if feat_dtype == "float16":
        x32 = np.asarray(x, dtype=np.float32)
        big = np.abs(x32) > _F16_MAX
        if big.any():
            raise ValueError(
                f"a feature value ({float(x32[big][0]):g}) is beyond float16's range (+-65504); "
                "use bfloat16 or int8"
            )
        return x32.astype(np.float16)
    if feat_dtype == "bfloat16":
        import torch

        t = torch.from_numpy(np.require(x, np.float32, ["C", "W"]))
        return t.to(torch.bfloat16).view(torch.int16).numpy()  # round to nearest even
    if feat_dtype == "int8":
        scale = np.asarray(scale, dtype=np.float64)
        safe = np.where(scale > 0, scale, 1.0)  # scale 0: the column is all zeros, q = zero_point
        q = np.round(np.asarray(x, dtype=np.float64) / safe) + zero_point
        q[:, scale == 0] = np.asarray(zero_point)[scale == 0]
        return np.clip(q, -128, 127).astype(np.int8)
    storage_dtype(feat_dtype)  # raises for an unknown name
    raise AssertionError(feat_dtype)


def decode(x: np.ndarray, feat_dtype: str, scale=None, zero_point=None) -> np.ndarray:
    """Stored rows -> float32 rows (NumPy; the training path decodes with torch on the model's
    device, :mod:`gnnio.train.decode`, with the same arithmetic)."""
    if feat_dtype in ("float32", "float16"):
        return np.asarray(x, dtype=np.float32)
    if feat_dtype == "bfloat16":
        bits = np.asarray(x).astype(np.int16).view(np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32)
    if feat_dtype == "int8":
        sc = np.asarray(scale, dtype=np.float32)
        zp = np.asarray(zero_point, dtype=np.float32)
        return (np.asarray(x, dtype=np.float32) - zp) * sc
    storage_dtype(feat_dtype)
    raise AssertionError(feat_dtype)


def count_nonfinite_encoded(block: np.ndarray, feat_dtype: str) -> int:
    """NaN or infinite values among stored rows (bfloat16 bits: exponent all ones; int8: none)."""
    if feat_dtype == "bfloat16":
        return int(np.count_nonzero((np.asarray(block).view(np.uint16) & 0x7F80) == 0x7F80))
    if feat_dtype == "int8":
        return 0
    a = np.asarray(block)
    return int(a.size - np.count_nonzero(np.isfinite(a)))


def recode_features(
    tmp: Path,
    arrays: dict[str, str],
    source: str,
    target: str,
    chunk_bytes: int = 64 << 20,
) -> None:
    """Rewrite ``tmp/features.npy`` (a dataset being written, see
    :class:`~gnnio.graph.format.DatasetWriter`) from encoding ``source`` to ``target``, a chunk of
    rows at a time, through a temporary file renamed over it. For int8 the codec arrays are
    written (a first pass finds the column ranges); leaving int8 removes them. ``arrays`` (key ->
    file name) is updated. Each chunk's pages of both files are dropped from this process after
    it (:func:`gnnio.utils.pages.drop_pages`), so the resident memory stays about two chunks. Raises DatasetError for non-finite values (int8 cannot hold them) and
    for values float16 cannot hold."""
    src_path = tmp / arrays["features"]
    src = np.load(src_path, mmap_mode="r")
    codec = {}
    if source == "int8":
        codec = {k: np.load(tmp / arrays[k]) for k in (SCALE, ZERO_POINT)}

    def floats(s: int, e: int) -> np.ndarray:
        return decode(src[s:e], source, codec.get(SCALE), codec.get(ZERO_POINT))

    n, f = src.shape
    rows = max(1, chunk_bytes // max(1, 4 * f))
    scale = zp = None
    if target == "int8":
        lo, hi = np.zeros(f), np.zeros(f)
        for s in range(0, n, rows):
            block = floats(s, s + rows).astype(np.float64)
            if not np.isfinite(block.sum()):
                raise DatasetError(
                    f"{tmp}: the features hold NaN or infinite values; int8 cannot encode them"
                )
            lo = block.min(axis=0) if s == 0 else np.minimum(lo, block.min(axis=0))
            hi = block.max(axis=0) if s == 0 else np.maximum(hi, block.max(axis=0))
            drop_pages(src)  # keep the pass's resident pages to one chunk (bounded memory)
        scale, zp = int8_params(lo, hi)
    part = tmp / "features.recode.npy"
    dst = np.lib.format.open_memmap(part, mode="w+", dtype=storage_dtype(target), shape=(n, f))
    try:
        for s in range(0, n, rows):
            try:
                dst[s : s + rows] = encode(floats(s, s + rows), target, scale, zp)
            except ValueError as e:
                raise DatasetError(f"{tmp}: --feature-dtype {target}: {e}") from None
            drop_pages(src)
            drop_pages(dst)  # written pages stay in the page cache and reach the file
        dst.flush()
    finally:
        del dst
    os.replace(part, src_path)  # ``src`` (a read-only map of the old file) stays valid
    for key in (SCALE, ZERO_POINT):
        if key in arrays:
            os.remove(tmp / arrays.pop(key))
    if target == "int8":
        assert scale is not None and zp is not None  # (computed above for int8)
        for key, val in ((SCALE, scale), (ZERO_POINT, zp)):
            np.save(tmp / f"{key}.npy", val, allow_pickle=False)
            arrays[key] = f"{key}.npy"
