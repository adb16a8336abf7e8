"""Helpers shared by the importers: input checks, edge lists to CSR, chunked copies and CSV
parsing, stratified splits, output size estimates and id bounds.

Everything here is generic (no knowledge of a particular source). Node ids are the importer's
global ids in ``[0, N)``; row chunks are measured in rows of the feature matrix.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

from ..errors import DatasetError, UsageError
from ..graph.csr import index_dtype
from ..graph.format import DatasetWriter
from ..graph.output_dir import check_ram
from ..utils.pages import drop_pages
from ..utils.progress import bar

__all__ = [
    "CHUNK_BYTES",
    "require_file",
    "load_npy",
    "rows_per_chunk",
    "copy_rows",
    "feature_dtype_for",
    "edges_to_graph",
    "write_graph",
    "labels_to_int64",
    "parse_fractions",
    "stratified_split",
    "iter_line_blocks",
    "parse_csv_block",
    "DENSE_FLOOR",
    "check_dense_ids",
    "output_bytes",
    "add_nonfinite_argument",
]

#: target size of one chunk of feature rows moved through RAM at a time (bytes)
CHUNK_BYTES = 64 << 20
#: an id space (classes, feature columns, nodes) of up to this size is accepted however sparse
DENSE_FLOOR = 1024


def check_dense_ids(max_id: int, distinct: int, where: str, what: str, dim: str) -> None:
    """Bound an id space by what the input implies: ids number things ``0..K-1``, so a largest
    id ``max_id`` that makes ``max_id + 1`` more than twice the ``distinct`` ids in use (and more
    than :data:`DENSE_FLOOR`) is a one-line DatasetError before anything is sized by it (a stray
    feature id of 1,000,000 would otherwise write a 1,000,001-column matrix). ``what`` names one
    id (``"label"``), ``dim`` the space (``"classes"``)."""
    size, limit = int(max_id) + 1, max(2 * int(distinct), DENSE_FLOOR)
    if size > limit:
        raise DatasetError(
            f"{where}: {what} {int(max_id):,} implies {size:,} {dim}, but only {int(distinct):,} "
            f"distinct {what}s are used (at most {limit:,} {dim} accepted; number them 0..K-1)"
        )


def output_bytes(*arrays: np.ndarray | None, rows: int = 0, row_bytes: int = 0) -> int:
    """Estimated size of a dataset directory holding ``arrays`` (those written as they are) and
    a ``[rows, *]`` array of ``row_bytes`` per row (the features, written later), with room
    for the ``.npy`` headers and ``meta.json``."""
    known = sum(int(a.nbytes) for a in arrays if a is not None)
    return known + int(rows) * int(row_bytes) + 4096 * (len(arrays) + 2)


def add_nonfinite_argument(parser) -> None:
    """``--allow-nonfinite`` for importers of the user's own features."""
    parser.add_argument(
        "--allow-nonfinite",
        action="store_true",
        help="keep NaN or infinite feature values (refused by default: they train to NaN)",
    )


def require_file(path: str | Path, what: str | None = None) -> Path:
    """``path`` as a Path if it is an existing regular file, else a one-line DatasetError.

    ``what`` (e.g. ``"--features"``) is put in front of the message to name the argument.
    """
    p = Path(path)
    prefix = f"{what} {p}" if what else f"{p}"
    if not p.exists():
        raise DatasetError(f"{prefix}: no such file")
    if not p.is_file():
        raise DatasetError(f"{prefix}: not a regular file")
    return p


def load_npy(path: str | Path, what: str | None = None) -> np.ndarray:
    """Open a ``.npy`` file memory-mapped read-only (``allow_pickle=False``).

    Object arrays, pickles, ``.npz`` archives and unreadable files raise a one-line DatasetError
    naming ``what`` (the CLI argument) and the file.
    """
    p = require_file(path, what)
    prefix = f"{what} {p}" if what else f"{p}"
    try:
        arr = np.load(p, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        npy = _starts_with(p, b"\x93NUMPY")  # else numpy tried to unpickle it and says so
        why = _one_line(e) if npy else "no NumPy header; numpy.save writes one"
        raise DatasetError(f"{prefix}: not a readable .npy file ({why})") from None
    if not isinstance(arr, np.ndarray):
        raise DatasetError(f"{prefix}: is an .npz archive, expected a single .npy array")
    return arr


def rows_per_chunk(row_bytes: int, target_bytes: int | None = None) -> int:
    """How many rows of ``row_bytes`` bytes fit in one chunk of about ``target_bytes``
    (default :data:`CHUNK_BYTES`)."""
    target = CHUNK_BYTES if target_bytes is None else target_bytes
    return max(1, int(target) // max(1, int(row_bytes)))


def feature_dtype_for(dtype: np.dtype) -> np.dtype:
    """The stored feature dtype for an input dtype: float16 stays float16, anything else float32."""
    return np.dtype(np.float16) if np.dtype(dtype) == np.float16 else np.dtype(np.float32)


def copy_rows(
    src: np.ndarray,
    dst: np.ndarray,
    desc: str = "features",
    progress: bool = True,
    chunk_rows: int | None = None,
    drop: bool = False,
) -> None:
    """Copy ``src`` into ``dst`` (same number of rows) one row chunk at a time, casting to
    ``dst.dtype``.

    Only one chunk (about :data:`CHUNK_BYTES` of the wider of the two dtypes) is in RAM at a time,
    so a memory-mapped ``src`` of any size is never read whole. ``drop``: after each chunk, drop
    the pages of both mappings from this process (:func:`gnnio.utils.pages.drop_pages`), so
    they do not stay resident either.
    """
    n = int(src.shape[0])
    if int(dst.shape[0]) != n:
        raise ValueError(f"copy_rows: {n} source rows but {dst.shape[0]} destination rows")
    row_bytes = max(int(src[:1].nbytes), int(dst[:1].nbytes), 1)
    step = chunk_rows or rows_per_chunk(row_bytes)
    with bar(total=n, desc=desc, unit="row", enabled=progress) as pb:
        for s in range(0, n, step):
            e = min(n, s + step)
            dst[s:e] = np.asarray(src[s:e]).astype(dst.dtype, copy=False)
            if drop:
                drop_pages(src)
                drop_pages(dst)
            pb.update(e - s)


def edges_to_graph(
    src: np.ndarray,
    dst: np.ndarray,
    num_nodes: int,
    symmetrize: bool = False,
    drop_self_loops: bool = False,
    chunk: int = 1 << 22,
) -> tuple[np.ndarray, np.ndarray]:
    """CSR of in-neighbours (row ``v`` lists ``u`` for each edge ``u -> v``), deduplicated.

    With ``symmetrize`` each edge is also added reversed; with ``drop_self_loops`` edges ``v -> v``
    are removed. Ids must already be checked to lie in ``[0, num_nodes)``. The result equals
    :func:`gnnio.graph.csr.edges_to_csr` on the same edge list (neighbour lists sorted by source
    id), but the work is done on one int64 key array (``dst * N + src``) built chunk by chunk and
    sorted in place, with no concatenated copies of ``src``/``dst``: peak extra memory is about
    25 bytes per key (50 per input edge when symmetrized), half of ``edges_to_csr`` on a
    concatenated list (measured with tracemalloc).
    Returns ``(indptr int64 [N+1], indices int32/int64 [E'])``.
    """
    n = int(num_nodes)
    if n > 3_037_000_499:  # dst * N + src must fit in int64
        raise ValueError(f"edges_to_graph: {n} nodes is too many for int64 edge keys")
    src = np.asarray(src)
    dst = np.asarray(dst)
    if src.shape != dst.shape or src.ndim != 1:
        raise ValueError(f"edges_to_graph: src {src.shape} and dst {dst.shape} must be equal 1-D")
    e = int(src.shape[0])
    loops = None
    if drop_self_loops and e:
        loops = src == dst
        if not loops.any():
            loops = None
    m = e - (int(np.count_nonzero(loops)) if loops is not None else 0)
    keys = m * (2 if symmetrize else 1)
    check_ram(keys * (8 + index_dtype(n).itemsize), f"the CSR of {keys:,} edges")
    key = np.empty(keys, dtype=np.int64)
    pos = 0
    nn = np.int64(n)
    for a in range(0, e, chunk):
        s = src[a : a + chunk].astype(np.int64)
        d = dst[a : a + chunk].astype(np.int64)
        if loops is not None:
            keep = ~loops[a : a + chunk]
            s, d = s[keep], d[keep]
        k = s.shape[0]
        np.add(d * nn, s, out=key[pos : pos + k])
        if symmetrize:
            np.add(s * nn, d, out=key[m + pos : m + pos + k])
        pos += k
    key.sort()
    if key.shape[0] > 1:
        first = np.empty(key.shape[0], dtype=np.bool_)
        first[0] = True
        np.not_equal(key[1:], key[:-1], out=first[1:])
        if not first.all():
            key = key[first]
        del first
    indptr = np.searchsorted(key, np.arange(n + 1, dtype=np.int64) * nn).astype(np.int64)
    indices = np.empty(key.shape[0], dtype=index_dtype(n))
    for a in range(0, key.shape[0], chunk):
        indices[a : a + chunk] = key[a : a + chunk] % nn
    return indptr, indices


def write_graph(writer: DatasetWriter, indptr: np.ndarray, indices: np.ndarray) -> None:
    """Save the CSR arrays under the format's names ``indptr`` and ``indices``."""
    writer.save_array("indptr", np.asarray(indptr, dtype=np.int64))
    writer.save_array("indices", indices)


def labels_to_int64(vals: np.ndarray, where: str) -> np.ndarray:
    """Class ids as int64 ``[N]`` with -1 = unlabeled.

    Accepts ``[N]`` or ``[N, 1]``; integer input must be >= -1; float input must hold
    non-negative whole numbers or NaN (NaN -> -1, as in OGB); the classes must be numbered
    densely (:func:`check_dense_ids`). Anything else is a one-line DatasetError naming ``where``.
    """
    vals = np.asarray(vals)
    if vals.ndim == 2 and vals.shape[1] == 1:
        vals = vals[:, 0]
    if vals.ndim != 1:
        raise DatasetError(
            f"{where}: labels have shape {list(vals.shape)}, expected [N] or [N, 1] "
            f"(multi-label data is not supported)"
        )
    if vals.dtype.kind in "iu":
        lab = vals.astype(np.int64)
        if lab.size and lab.min() < -1:
            raise DatasetError(
                f"{where}: label {int(lab.min())} is negative (use -1 for unlabeled)"
            )
        return _bounded_labels(lab, where)
    if vals.dtype.kind != "f":
        raise DatasetError(
            f"{where}: labels must be integers (or floats with NaN), got {vals.dtype}"
        )
    vals = vals.astype(np.float64)
    nan = np.isnan(vals)
    ok = vals[~nan]
    if ok.size and (ok.min() < 0 or not np.array_equal(ok, np.floor(ok))):
        raise DatasetError(f"{where}: float labels must be non-negative whole numbers or NaN")
    if ok.size and ok.max() >= 2**62:
        raise DatasetError(f"{where}: label {ok.max():g} is too large for a class id")
    lab = np.full(vals.shape[0], -1, dtype=np.int64)
    lab[~nan] = ok.astype(np.int64)
    return _bounded_labels(lab, where)


def _bounded_labels(lab: np.ndarray, where: str) -> np.ndarray:
    """``lab`` if its classes are numbered densely enough (:func:`check_dense_ids`): the number
    of classes is the largest label + 1 and sizes the model's output layer."""
    known = lab[lab >= 0]
    if known.size:
        hi = int(known.max())
        if hi + 1 > DENSE_FLOOR:
            check_dense_ids(hi, np.unique(known).shape[0], where, "label", "classes")
    return lab


def parse_fractions(text: str, what: str = "--split") -> tuple[float, float]:
    """Parse ``"TRAIN,VALID"`` fractions (test gets the rest); UsageError on bad input."""
    parts = [p.strip() for p in str(text).split(",")]
    try:
        vals = [float(p) for p in parts]
    except ValueError:
        raise UsageError(
            f"{what} {text!r}: expected two fractions TRAIN,VALID such as 0.1,0.1"
        ) from None
    if len(vals) != 2:
        raise UsageError(f"{what} {text!r}: expected two fractions TRAIN,VALID such as 0.1,0.1")
    tr, va = vals
    if not (0.0 <= tr <= 1.0 and 0.0 <= va <= 1.0) or tr + va > 1.0 + 1e-9:
        raise UsageError(f"{what} {text!r}: fractions must lie in [0, 1] and sum to at most 1")
    return tr, va


def stratified_split(
    labels: np.ndarray, train_frac: float, valid_frac: float, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Seeded split stratified by class: each class ``c`` with ``n_c`` labeled nodes gives
    ``round(train_frac * n_c)`` train nodes, ``round(valid_frac * n_c)`` valid nodes and the rest
    test, drawn by a random permutation from ``numpy.random.default_rng(seed)``.

    Unlabeled nodes (label -1) are in no split. Returns sorted int64 node-id arrays
    ``(train, valid, test)``; the same labels and seed always give the same split.
    """
    labels = np.asarray(labels, dtype=np.int64)
    rng = np.random.default_rng(seed)
    parts: tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]] = ([], [], [])
    for c in np.unique(labels[labels >= 0]):
        members = np.flatnonzero(labels == c)
        members = members[rng.permutation(members.shape[0])]
        n_c = members.shape[0]
        n_tr = min(n_c, int(round(train_frac * n_c)))
        n_va = min(n_c - n_tr, int(round(valid_frac * n_c)))
        parts[0].append(members[:n_tr])
        parts[1].append(members[n_tr : n_tr + n_va])
        parts[2].append(members[n_tr + n_va :])
    out = tuple(
        np.sort(np.concatenate(p)).astype(np.int64) if p else np.zeros(0, np.int64) for p in parts
    )
    return out  # type: ignore[return-value]


def iter_line_blocks(f: IO[bytes], block_bytes: int = 16 << 20) -> Iterator[tuple[int, bytes]]:
    """Read a binary text stream in blocks that end on a line boundary.

    Yields ``(first_line, block)`` where ``first_line`` is the 0-based line number of the block's
    first line. A missing final newline is tolerated. Lines are never split between blocks.
    """
    line = 0
    rest = b""
    while True:
        chunk = f.read(block_bytes)
        if not chunk:
            break
        data = rest + chunk
        cut = data.rfind(b"\n")
        if cut < 0:
            rest = data
            continue
        block, rest = data[: cut + 1], data[cut + 1 :]
        yield line, block
        line += block.count(b"\n")
    if rest:
        yield line, rest + b"\n"


def parse_csv_block(
    block: bytes, dtype: Any, ncols: int | None, where: str, first_line: int = 0
) -> np.ndarray:
    """Parse comma-separated numbers (no header) into a ``[rows, cols]`` array of ``dtype``.

    Uses NumPy's C parser. Errors become one-line DatasetErrors naming ``where`` (the file) and
    the line the block starts at. ``ncols`` (if given) is checked. Blank lines are skipped, so
    callers that need one value per line must count lines themselves.
    """
    try:
        arr = np.loadtxt(io.BytesIO(block), dtype=dtype, delimiter=",", ndmin=2, comments=None)
    except ValueError as e:
        # NumPy counts rows within this block; say where the block starts in the file
        raise DatasetError(
            f"{where}: {_one_line(e)} (rows counted from line {first_line + 1} of the file)"
        ) from None
    if ncols is not None and arr.size and arr.shape[1] != ncols:
        raise DatasetError(
            f"{where}: expected {ncols} comma-separated columns, found {arr.shape[1]} "
            f"(near line {first_line + 1})"
        )
    return arr


def _starts_with(path: Path, magic: bytes) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(magic)) == magic
    except OSError:
        return False


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())
