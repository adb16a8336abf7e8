"""Planetoid citation datasets (Cora, CiteSeer, PubMed) from the original ``ind.<name>.*`` files.

Layout (Yang et al., ICML 2016; the files Kipf & Welling's GCN and PyG's ``Planetoid`` read):
``ind.<name>.{x,y,allx,ally,tx,ty,graph}`` are Python-2 pickles, ``ind.<name>.test.index`` is
plain text with one node id per line. See ``datasets/cora/SOURCE.md``.

Assembly (the standard "public" split, generalised to layouts with holes):
  - node ``i < len(allx)`` has features ``allx[i]`` and label ``argmax(ally[i])``;
  - node ``test.index[j]`` has features ``tx[j]`` and label ``argmax(ty[j])``;
  - N is the largest node id seen in ``allx``, ``test.index`` or ``graph`` plus one. Nodes with no
    feature row (CiteSeer's test range has holes) get zero features and label -1, and one-hot rows
    that are all zero also give label -1. Unlabeled nodes are in no split.
  - train = nodes ``0 .. len(y)-1``, valid = the next 500 nodes (only nodes with an ``allx`` row,
    so never a test node), test = the ids in ``test.index``.
  - the graph is made symmetric, deduplicated, and self-loops are dropped.

For Cora this is exactly the usual assembly: 2708 nodes, 10556 directed edges, 1433 binary
features, 7 classes, split 140/500/1000.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..errors import DatasetError, UsageError
from ..graph.format import DatasetWriter, sha256_file
from ..graph.output_dir import check_ram
from ..utils.progress import bar
from ._common import (
    add_nonfinite_argument,
    check_dense_ids,
    edges_to_graph,
    output_bytes,
    require_file,
    write_graph,
)

__all__ = ["prepare_planetoid", "load_planetoid_pickle", "HELP", "DESCRIPTION"]

HELP = "Planetoid citation graphs (cora, citeseer, pubmed) from the ind.<name>.* files"
DESCRIPTION = (
    "Import a Planetoid dataset from the original files ind.<name>.{x,y,allx,ally,tx,ty,graph,"
    "test.index} in --root (or --root/raw), with the standard public split: train = the first "
    "len(y) nodes, valid = the next 500, test = test.index. The graph is symmetrized, deduplicated "
    "and self-loops are dropped. Nodes without a feature row get zero features and label -1."
)

PICKLED = ("x", "y", "allx", "ally", "tx", "ty", "graph")
NUM_VALID = 500


def add_arguments(parser) -> None:
    parser.add_argument("--name", required=True, help="dataset name in the file names (e.g. cora)")
    parser.add_argument(
        "--root", required=True, help="folder holding ind.<name>.* (or a raw/ folder with them)"
    )
    add_nonfinite_argument(parser)


def run(args) -> Path:
    return prepare_planetoid(
        args.name,
        args.root,
        args.out,
        overwrite=args.overwrite,
        progress=not args.quiet,
        allow_nonfinite=args.allow_nonfinite,
    )


# --- the one place gnnio unpickles -------------------------------------------------------------

_SPARSE = ("scipy.sparse.csr", "scipy.sparse._csr", "scipy.sparse")


def _allowed_global(module: str, name: str) -> Any:
    """The object for an allowed ``(module, name)`` pickle global, or None if not allowed."""
    if module in _SPARSE and name == "csr_matrix":
        return sp.csr_matrix  # old module paths map to the public class
    if module in ("numpy.core.multiarray", "numpy._core.multiarray") and name in (
        "_reconstruct",
        "scalar",
    ):
        try:
            from numpy._core import multiarray
        except ImportError:  # numpy < 2
            from numpy.core import multiarray  # type: ignore[no-redef]
        return getattr(multiarray, name)
    if module == "numpy" and name in ("ndarray", "dtype"):
        return getattr(np, name)
    if module == "collections" and name == "defaultdict":
        from collections import defaultdict

        return defaultdict
    if module == "_codecs" and name == "encode":
        return _latin1_encode  # how Python 3 writes bytes into a protocol-2 pickle
    if module in ("__builtin__", "builtins") and name in ("list", "dict", "set"):
        return {"list": list, "dict": dict, "set": set}[name]
    return None


def _latin1_encode(text: str, encoding: str = "utf-8") -> bytes:
    """``_codecs.encode`` restricted to the latin-1 codec Python 3 uses for bytes in protocol 2."""
    if encoding not in ("latin1", "latin-1", "iso-8859-1") or not isinstance(text, str):
        raise pickle.UnpicklingError(f"_codecs.encode with codec {encoding!r} is not allowed")
    return text.encode("latin1")


class _PlanetoidUnpickler(pickle.Unpickler):
    """An Unpickler whose ``find_class`` allows only the globals the Planetoid files need."""

    def __init__(self, f, path: Path):
        super().__init__(f, encoding="latin1")
        self._path = path

    def find_class(self, module: str, name: str) -> Any:
        obj = _allowed_global(module, name)
        if obj is None:
            raise DatasetError(
                f"{self._path}: pickle refers to {module}.{name}, which a Planetoid file never "
                f"needs; refusing to load it"
            )
        return obj


def load_planetoid_pickle(path: str | Path) -> Any:
    """Load one Planetoid ``ind.<name>.<part>`` Python-2 pickle.

    SECURITY: this is the single documented exception to gnnio's rule "never unpickle untrusted
    files". The Planetoid files exist only as pickles, so they are loaded with
    ``encoding="latin1"`` through a restricted Unpickler whose ``find_class`` resolves only
    ``scipy.sparse`` ``csr_matrix`` (old ``scipy.sparse.csr`` path mapped to the public class),
    numpy's ``_reconstruct``/``scalar``/``ndarray``/``dtype``, ``collections.defaultdict``, the
    builtin ``list``/``dict``/``set`` and (for files re-saved by Python 3) ``_codecs.encode``
    limited to latin-1. Any other global raises DatasetError, so a file cannot name
    an arbitrary callable. The result must be a ``csr_matrix``, an ``ndarray`` or a dict; callers
    check shapes.
    """
    p = require_file(path)
    try:
        with open(p, "rb") as f:
            obj = _PlanetoidUnpickler(f, p).load()
    except DatasetError:
        raise
    except Exception as e:  # malformed pickle data: any of many exception types
        raise DatasetError(
            f"{p}: not a readable Planetoid pickle ({type(e).__name__}: {e})"
        ) from None
    if not isinstance(obj, (sp.spmatrix, sp.sparray, np.ndarray, dict)):
        raise DatasetError(f"{p}: unexpected object of type {type(obj).__name__}")
    return obj


# --- assembly ----------------------------------------------------------------------------------


def _find_dir(root: Path, name: str) -> Path:
    probe = f"ind.{name}.x"
    for d in (root, root / "raw"):
        if (d / probe).is_file():
            return d
    if not root.is_dir():
        raise DatasetError(f"--root {root}: no such directory")
    raise DatasetError(f"{root / probe}: no such file (is --name {name!r} right?)")


#: dtype kinds a Planetoid matrix may hold: bool, signed/unsigned integer, float
_NUMERIC = "biuf"


def _numeric(arr: Any, path: Path, what: str) -> np.ndarray:
    """``arr`` if it is a NumPy array of numbers, else a one-line DatasetError (an object array
    from a crafted pickle never reaches NumPy's or SciPy's compiled code)."""
    if type(arr) is not np.ndarray or arr.dtype.kind not in _NUMERIC or arr.dtype.hasobject:
        kind = arr.dtype if isinstance(arr, np.ndarray) else type(arr).__name__
        raise DatasetError(f"{path}: {what} must be a numeric array, got {kind}")
    return arr


def _checked_csr(obj: Any, path: Path) -> sp.csr_matrix:
    """A fresh ``csr_matrix`` from an unpickled one, after checking everything its compiled
    code (``toarray``) trusts: the unpickler sets ``indptr``/``indices``/``data``/``_shape``
    without SciPy's checks, and an index past the shape makes ``toarray`` write out of bounds
    (a segfault, or silently wrong memory). Checked in NumPy: shape two non-negative ints,
    ``indptr`` 1-D integer of ``rows + 1`` entries from 0, non-decreasing, ending at
    ``len(indices) == len(data)``, every index in ``[0, cols)``."""
    try:
        state = vars(obj)
        shape, indptr = state["_shape"], state["indptr"]
        indices, data = state["indices"], state["data"]
    except (TypeError, KeyError) as e:
        raise DatasetError(f"{path}: malformed sparse matrix (missing {e})") from None
    if (
        not isinstance(shape, tuple)
        or len(shape) != 2
        or not all(isinstance(v, (int, np.integer)) and 0 <= v < 2**31 for v in shape)
    ):
        raise DatasetError(f"{path}: sparse matrix has a bad shape {shape!r}")
    rows, cols = int(shape[0]), int(shape[1])
    indptr = _numeric(indptr, path, "the sparse matrix's indptr")
    indices = _numeric(indices, path, "the sparse matrix's indices")
    data = _numeric(data, path, "the sparse matrix's data")
    if indptr.dtype.kind not in "iu" or indices.dtype.kind not in "iu":
        raise DatasetError(f"{path}: sparse matrix indptr/indices must be integer arrays")
    if indptr.ndim != 1 or indices.ndim != 1 or data.ndim != 1:
        raise DatasetError(f"{path}: sparse matrix indptr/indices/data must be 1-D")
    if indptr.shape[0] != rows + 1:
        raise DatasetError(
            f"{path}: sparse matrix indptr has {indptr.shape[0]} entries for {rows} rows"
        )
    ip = indptr.astype(np.int64)
    if ip[0] != 0 or (ip.shape[0] > 1 and (np.diff(ip) < 0).any()):
        raise DatasetError(f"{path}: sparse matrix indptr must start at 0 and never decrease")
    if int(ip[-1]) != indices.shape[0] or indices.shape[0] != data.shape[0]:
        raise DatasetError(
            f"{path}: sparse matrix indptr ends at {int(ip[-1])} but indices has "
            f"{indices.shape[0]} and data {data.shape[0]} entries"
        )
    if indices.size:
        lo, hi = int(indices.min()), int(indices.max())
        if lo < 0 or hi >= cols:
            bad = lo if lo < 0 else hi
            raise DatasetError(
                f"{path}: sparse matrix column index {bad} is out of range [0, {cols})"
            )
    check_ram(rows * cols * data.dtype.itemsize, f"{path}: the dense [{rows:,}, {cols:,}] matrix")
    return sp.csr_matrix(
        (data.copy(), indices.astype(np.int64), ip), shape=(rows, cols), copy=False
    )


def _dense(obj: Any, path: Path) -> np.ndarray:
    if isinstance(obj, (sp.spmatrix, sp.sparray)):
        arr = _checked_csr(obj, path).toarray()
    elif isinstance(obj, np.ndarray):
        arr = _numeric(obj, path, "the matrix")
    else:
        raise DatasetError(f"{path}: expected a matrix, got {type(obj).__name__}")
    if arr.ndim != 2:
        raise DatasetError(f"{path}: expected a 2-D matrix, got shape {list(arr.shape)}")
    return arr


def _labels_from_onehot(y: np.ndarray) -> np.ndarray:
    """argmax per row as int64; rows with no positive entry give -1."""
    lab = np.argmax(y, axis=1).astype(np.int64)
    lab[~(y > 0).any(axis=1)] = -1
    return lab


def _read_test_index(path: Path) -> np.ndarray:
    p = require_file(path)
    try:
        ids = [int(line) for line in p.read_text().split()]
    except ValueError as e:
        raise DatasetError(f"{p}: expected one integer node id per line ({e})") from None
    return np.asarray(ids, dtype=np.int64)


def _edges_from_adjacency(graph: dict, path: Path) -> tuple[np.ndarray, np.ndarray]:
    src_parts, dst_parts = [], []
    for u, nbrs in graph.items():
        try:
            v = np.asarray(list(nbrs), dtype=np.int64).reshape(-1)
            src_parts.append(np.full(v.shape[0], int(u), dtype=np.int64))
        except (TypeError, ValueError, OverflowError):
            raise DatasetError(
                f"{path}: entry {u!r} is not an int node id with a list of int neighbours"
            ) from None
        dst_parts.append(v)
    if not src_parts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(src_parts), np.concatenate(dst_parts)


def prepare_planetoid(
    name: str,
    root: str | Path,
    out: str | Path,
    overwrite: bool = False,
    progress: bool = True,
    allow_nonfinite: bool = False,
) -> Path:
    """Import Planetoid dataset ``name`` from ``root`` into a gnnio dataset at ``out``.

    See the module docstring for the assembly. Features are float32 (values as stored, Cora's are
    binary; NaN or infinite refused unless ``allow_nonfinite``), labels int64 (-1 unlabeled),
    splits sorted int64 node ids. Node ids are bounded by the ids the files use
    (:func:`._common.check_dense_ids`). ``meta["source"]`` records the importer, name, root and
    the sha256 of each input file. Returns ``out``.
    """
    name = str(name).strip().lower()
    if not name or "/" in name:
        raise UsageError(f"--name {name!r}: expected a dataset name such as cora")
    root = Path(root)
    d = _find_dir(root, name)
    files = {part: d / f"ind.{name}.{part}" for part in (*PICKLED, "test.index")}
    for f in files.values():
        require_file(f)

    parts: dict[str, Any] = {}
    with bar(total=len(files), desc=f"read {name}", unit="file", enabled=progress) as pb:
        for part in PICKLED:
            parts[part] = load_planetoid_pickle(files[part])
            pb.update(1)
        test_index = _read_test_index(files["test.index"])
        pb.update(1)

    x, y = _dense(parts["x"], files["x"]), _dense(parts["y"], files["y"])
    allx, ally = _dense(parts["allx"], files["allx"]), _dense(parts["ally"], files["ally"])
    tx, ty = _dense(parts["tx"], files["tx"]), _dense(parts["ty"], files["ty"])
    graph = parts["graph"]
    if not isinstance(graph, dict):
        raise DatasetError(f"{files['graph']}: expected a dict of adjacency lists")

    # shape checks, each naming the offending file
    f_dim, c = allx.shape[1], ally.shape[1]
    for part, arr, rows, cols in (
        ("ally", ally, allx.shape[0], c),
        ("x", x, None, f_dim),
        ("y", y, x.shape[0], c),
        ("tx", tx, test_index.shape[0], f_dim),
        ("ty", ty, test_index.shape[0], c),
    ):
        if (rows is not None and arr.shape[0] != rows) or arr.shape[1] != cols:
            want = f"[{rows if rows is not None else '*'}, {cols}]"
            raise DatasetError(f"{files[part]}: shape {list(arr.shape)} does not match {want}")
    if x.shape[0] > allx.shape[0]:
        raise DatasetError(
            f"{files['x']}: has more rows ({x.shape[0]}) than allx ({allx.shape[0]})"
        )
    if test_index.size:
        if test_index.min() < allx.shape[0]:
            raise DatasetError(
                f"{files['test.index']}: test node {int(test_index.min())} overlaps the "
                f"allx rows [0, {allx.shape[0]})"
            )
        if np.unique(test_index).shape[0] != test_index.shape[0]:
            raise DatasetError(f"{files['test.index']}: contains repeated node ids")

    src, dst = _edges_from_adjacency(graph, files["graph"])
    if src.size and min(src.min(), dst.min()) < 0:
        raise DatasetError(f"{files['graph']}: negative node id {int(min(src.min(), dst.min()))}")
    n = max(
        allx.shape[0],
        int(test_index.max()) + 1 if test_index.size else 0,
        int(max(src.max(), dst.max())) + 1 if src.size else 0,
    )
    if n > max(allx.shape[0] + test_index.shape[0], len(graph)):  # ids past those with data
        keys = np.fromiter((int(k) for k in graph), dtype=np.int64, count=len(graph))
        used = np.unique(np.concatenate([test_index, keys, src, dst]))
        distinct = allx.shape[0] + int(np.count_nonzero(used >= allx.shape[0]))
        where = (
            files["test.index"] if test_index.size and test_index.max() + 1 == n else files["graph"]
        )
        check_dense_ids(n - 1, distinct, str(where), "node id", "nodes")
    check_ram(n * f_dim * 4, f"{files['allx']}: the [{n:,}, {f_dim:,}] feature matrix")

    features = np.zeros((n, f_dim), dtype=np.float32)
    features[: allx.shape[0]] = allx
    features[test_index] = tx
    labels = np.full(n, -1, dtype=np.int64)
    labels[: ally.shape[0]] = _labels_from_onehot(ally)
    labels[test_index] = _labels_from_onehot(ty)
    n_allx = allx.shape[0]
    del allx, tx, x

    n_train = y.shape[0]
    train = np.arange(0, n_train, dtype=np.int64)
    valid = np.arange(n_train, min(n_allx, n_train + NUM_VALID), dtype=np.int64)
    test = np.sort(test_index)
    train, valid, test = (s[labels[s] >= 0] for s in (train, valid, test))

    indptr, indices = edges_to_graph(src, dst, n, symmetrize=True, drop_self_loops=True)

    source = {
        "importer": "planetoid",
        "name": name,
        "root": str(d.resolve()),
        "split": "public (train = first len(y) nodes, valid = next 500, test = test.index)",
        "files_sha256": {f.name: sha256_file(f) for f in files.values()},
    }
    size = output_bytes(indptr, indices, features, labels, train, valid, test)
    with DatasetWriter(out, name=name, overwrite=overwrite, allow_nonfinite=allow_nonfinite,
                       size_hint=size) as w:  # fmt: skip
        write_graph(w, indptr, indices)
        w.save_array("features", features)
        w.save_array("labels", labels)
        w.save_array("train_idx", train)
        w.save_array("valid_idx", valid)
        w.save_array("test_idx", test)
        w.meta["num_classes"] = int(c)
        w.meta["source"] = source
    return Path(out)
