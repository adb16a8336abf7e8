"""Relabel a graph and its node data by a hotness score so that hot rows are contiguous.

Data Tiering (Min et al.) §3.2 reorders "the node feature tensor and also the graph nodes" so the
hottest nodes get the smallest ids: the hot tier is then the prefix ``[0, H)`` of the feature
matrix and no id map is needed at training time.

Id maps (int64 ``[N]``, permutations of ``[0, N)``):

* ``new2old[i]`` = the old id of the node that gets new id ``i`` (what :func:`order_by_score`
  returns: node ids in descending score order);
* ``old2new[j]`` = the new id of old node ``j`` (the inverse; Algorithm 2's ``srt_idx`` used as a
  lookup table).

:func:`relabel_csr` is Algorithm 2 (new ``indptr`` by a prefix sum of the permuted row lengths,
neighbour lists moved to their new rows, every edge value mapped through ``old2new``), with three
implementations behind one function: a numba-parallel kernel (default), a vectorized numpy one and
a plain row-by-row reference. :func:`reorder_dataset` writes a whole reordered dataset.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numba
import numpy as np

from ..errors import UsageError
from ..graph import output_dir
from ..graph.csr import check_csr, index_dtype
from ..graph.dataset import Dataset, load
from ..graph.feature_dtype import SCALE, ZERO_POINT
from ..graph.format import SPLITS, DatasetWriter
from ..utils.progress import bar
from ..utils.warnings_at import warn
from ._relabel_kernels import _move_rows, _new_degrees

__all__ = [
    "IMPLS",
    "relabel_csr",
    "relabel_csr_reference",
    "invert_permutation",
    "order_by_score",
    "reorder_dataset",
    "reorder_path",
    "reorder_in_place",
]

#: implementations of :func:`relabel_csr`
IMPLS = ("numba", "numpy", "reference")

#: feature bytes moved through RAM per chunk by :func:`reorder_dataset`
_CHUNK_BYTES = 64 << 20

#: per-edge arrays of a ``from_pyg`` dataset: ``pyg_edge_id`` maps a CSR position to a column of
#: PyG's ``edge_index`` and ``edge_attr`` is indexed by that column (gnnio.importers.pyg)
_EDGE_ARRAYS = ("pyg_edge_id", "edge_attr")

#: meta.json keys that DatasetWriter computes itself (not copied from the source dataset)
_COMPUTED_META = {
    "format",
    "format_version",
    "name",
    "num_nodes",
    "num_edges",
    "feat_dim",
    "feat_dtype",
    "created",
    "arrays",
}


def _integer_ids(perm, what: str = "new2old") -> np.ndarray:
    """``perm`` as an array after checking it is 1-D and of an integer dtype (a float "permutation"
    would otherwise be truncated to ids when cast to int64), or a one-line UsageError."""
    p = np.asarray(perm)
    if p.ndim != 1 or (p.size and not np.issubdtype(p.dtype, np.integer)):
        raise UsageError(f"{what}: need a 1-D integer array, got {p.dtype} {list(p.shape)}")
    return p


def invert_permutation(perm: np.ndarray, what: str = "new2old") -> np.ndarray:
    """The inverse of a permutation of ``[0, N)`` (int64), or a one-line UsageError naming ``what``
    if ``perm`` is not one."""
    p = _integer_ids(perm, what)
    n = p.shape[0]
    p = p.astype(np.int64, copy=False)
    if n:
        lo, hi = int(p.min()), int(p.max())
        if lo < 0 or hi >= n:
            raise UsageError(f"{what}: id {lo if lo < 0 else hi} out of range [0, {n})")
    inv = np.full(n, -1, dtype=np.int64)
    inv[p] = np.arange(n, dtype=np.int64)
    missing = np.flatnonzero(inv < 0)
    if missing.size:
        raise UsageError(
            f"{what}: not a permutation of [0, {n}) (id {int(missing[0])} is missing, "
            "another id is repeated)"
        )
    return inv


def order_by_score(score: np.ndarray) -> np.ndarray:
    """``new2old``: node ids by descending score, ties broken by ascending id (stable). int64 [N]."""
    s = np.asarray(score)
    if s.ndim != 1:
        raise UsageError(f"score: need a 1-D array, got shape {list(s.shape)}")
    s = s.astype(np.float64, copy=False)
    if s.size and not np.isfinite(s).all():
        bad = int(np.flatnonzero(~np.isfinite(s))[0])
        raise UsageError(f"score: node {bad} has a non-finite score ({s[bad]})")
    return np.argsort(-s, kind="stable").astype(np.int64, copy=False)


# --------------------------------------------------------------------------------------------
# relabel_csr implementations


def _relabel_numba(indptr, indices, new2old, old2new, indices2):
    n = new2old.shape[0]
    indptr2 = np.empty(n + 1, dtype=np.int64)
    _new_degrees(indptr, new2old, indptr2)
    np.cumsum(indptr2, out=indptr2)  # prefix sum of the permuted row lengths
    e = int(indptr2[-1])
    chunks = max(1, min(n, 16 * numba.get_num_threads()))
    targets = (np.arange(chunks + 1, dtype=np.int64) * e) // chunks
    bounds = np.searchsorted(indptr2, targets, side="left").astype(np.int64)
    bounds[0], bounds[-1] = 0, n
    bounds = np.unique(bounds)
    _move_rows(indptr, indices, new2old, old2new, indptr2, bounds, indices2)
    return indptr2


def _relabel_numpy(indptr, indices, new2old, old2new, indices2):
    n = new2old.shape[0]
    deg2 = indptr[new2old + 1] - indptr[new2old]
    indptr2 = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(deg2, out=indptr2[1:])
    e = int(indptr2[-1])
    # source position of new edge slot q: old row start + (q - new row start)
    src = np.repeat(indptr[new2old] - indptr2[:-1], deg2) + np.arange(e, dtype=np.int64)
    indices2[:] = old2new[indices[src]]
    return indptr2


def relabel_csr_reference(
    indptr: np.ndarray, indices: np.ndarray, perm: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Plain sequential Algorithm 2 (one Python step per row): the reference for tests/benchmarks.

    Same contract as :func:`relabel_csr`.
    """
    indptr = np.asarray(indptr, dtype=np.int64)
    indices = np.asarray(indices)
    new2old = np.asarray(_integer_ids(perm), dtype=np.int64)
    n = indptr.shape[0] - 1
    old2new = invert_permutation(new2old)
    nd = np.zeros(n + 1, dtype=np.int64)
    for old in range(n):  # the new row of `old` gets its neighbour-list length
        nd[old2new[old] + 1] = indptr[old + 1] - indptr[old]
    nd = np.cumsum(nd)
    edg = np.empty(indices.shape[0], dtype=index_dtype(n))
    for new in range(n):  # move each neighbour list, translating ids old -> new
        old = new2old[new]
        edg[nd[new] : nd[new + 1]] = old2new[indices[indptr[old] : indptr[old + 1]]]
    return nd, edg


def relabel_csr(
    indptr: np.ndarray,
    indices: np.ndarray,
    perm: np.ndarray,
    impl: str = "numba",
    out: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Relabel a CSR graph: Data Tiering Algorithm 2.

    Node ``perm[i]`` (old id) becomes node ``i``: the new row ``i`` is old row ``perm[i]``, in the
    same order, with every neighbour id ``u`` replaced by ``old2new[u]``. Edge ``u -> v`` of the
    old graph is edge ``old2new[u] -> old2new[v]`` of the new one; nothing else changes.

    Args:
        indptr: int64 ``[N+1]`` (CSR of in-neighbours; memmaps are fine).
        indices: integer ``[E]`` old ids.
        perm: ``new2old``, int ``[N]``, a permutation of ``[0, N)``.
        impl: ``"numba"`` (parallel over edge-balanced chunks of new rows), ``"numpy"`` (vectorized,
            needs ~3 int64 arrays of length E) or ``"reference"`` (row-by-row Python loop).
        out: optional array (e.g. a writable memmap) of shape ``[E]`` and the index dtype of ``N``
            (int32 below 2^31 nodes) to receive the new ``indices``.

    Returns:
        ``(indptr2 int64 [N+1], indices2 [E])`` in the new id space; ``indices2`` is ``out`` when
        given, with dtype :func:`gnnio.graph.csr.index_dtype` of N.
    """
    if impl not in IMPLS:
        raise UsageError(f"impl: '{impl}' is unknown; choose from {', '.join(IMPLS)}")
    indptr = np.ascontiguousarray(indptr, dtype=np.int64)
    indices = np.asarray(indices)
    n = indptr.shape[0] - 1
    new2old = np.ascontiguousarray(_integer_ids(perm), dtype=np.int64)
    if new2old.shape != (n,):
        raise UsageError(f"new2old: need length num_nodes = {n}, got {list(new2old.shape)}")
    if int(indptr[-1]) != indices.shape[0]:
        raise UsageError(
            f"indptr: ends at {int(indptr[-1])} but indices has {indices.shape[0]} entries"
        )
    try:  # (the kernels read and write at every index unchecked; one pass over each array)
        check_csr(indptr, indices, what="")
    except ValueError as e:
        raise UsageError(str(e)) from None
    if impl == "reference":
        indptr2, indices2 = relabel_csr_reference(indptr, indices, new2old)
        if out is not None:
            out[:] = indices2
            indices2 = out
        return indptr2, indices2
    old2new = invert_permutation(new2old)
    dt = index_dtype(n)
    if out is None:
        out = np.empty(indices.shape[0], dtype=dt)
    elif out.shape != indices.shape or out.dtype != dt:
        raise UsageError(
            f"out: need shape {list(indices.shape)} and dtype {dt}, got "
            f"{list(out.shape)} {out.dtype}"
        )
    # old2new values fit the output dtype; cast once so the kernel writes without conversion
    lookup = old2new.astype(dt, copy=False)
    if impl == "numba":
        indptr2 = _relabel_numba(indptr, indices, new2old, lookup, out)
    else:
        indptr2 = _relabel_numpy(indptr, indices, new2old, lookup, out)
    return indptr2, out


# --------------------------------------------------------------------------------------------
# whole datasets


def _copy_feature_rows(src: np.ndarray, dst: np.ndarray, new2old: np.ndarray, progress: bool):
    """``dst[i] = src[new2old[i]]`` chunk by chunk (both may be memmaps larger than RAM).

    Within a chunk the source rows are read in ascending old-id order (sequential-ish I/O on a
    memmap), then scattered into their new positions in RAM and written out contiguously.
    """
    n = new2old.shape[0]
    row_bytes = max(1, int(np.prod(src.shape[1:], dtype=np.int64)) * src.dtype.itemsize)
    rows = max(1, _CHUNK_BYTES // row_bytes)
    with bar(n, desc="reorder features", unit="row", enabled=progress) as pb:
        for s in range(0, n, rows):
            e = min(n, s + rows)
            idx = new2old[s:e]
            order = np.argsort(idx, kind="stable")
            buf = np.empty((e - s,) + tuple(src.shape[1:]), dtype=src.dtype)
            buf[order] = src[idx[order]]
            dst[s:e] = buf
            pb.update(e - s)


def _edge_sources(indptr: np.ndarray, indptr2: np.ndarray, new2old: np.ndarray) -> np.ndarray:
    """int64 ``[E]``: the old CSR position of each new one (:func:`relabel_csr` moves every row
    whole, in order)."""
    deg2 = np.diff(indptr2)
    start = np.asarray(indptr, dtype=np.int64)[new2old] - indptr2[:-1]
    return np.repeat(start, deg2) + np.arange(int(indptr2[-1]), dtype=np.int64)


def _save_edge_arrays(w, ds, indptr2: np.ndarray, new2old: np.ndarray) -> None:
    """Keep a from_pyg dataset's per-edge arrays true after the relabel: ``edge_attr`` stays in
    ``edge_index``'s order and ``pyg_edge_id`` (written if ``edge_attr`` had none: the old CSR
    position was the column) maps each new CSR position to its column."""
    have = {k: ds.extra[k] for k in _EDGE_ARRAYS if k in ds.extra}
    if not have:
        return
    src = _edge_sources(ds.graph.indptr, indptr2, new2old)
    old = have.get("pyg_edge_id")
    w.save_array("pyg_edge_id", src if old is None else np.asarray(old, dtype=np.int64)[src])
    if "edge_attr" in have:
        w.save_array("edge_attr", np.asarray(have["edge_attr"]))
    if isinstance(w.meta.get("pyg"), dict):
        w.meta["pyg"] = {**w.meta["pyg"], "edge_order": "pyg_edge_id"}


def reorder_dataset(
    ds: Dataset,
    new2old: np.ndarray,
    out: str | os.PathLike,
    overwrite: bool = False,
    progress: bool = True,
    reordered_by: str | None = None,
    memory_budget: int | None = None,
    score: dict[str, Any] | None = None,
) -> Path:
    """Write a relabelled copy of ``ds`` to ``out`` (atomically, through DatasetWriter).

    ``memory_budget`` (bytes): relabel and copy in chunks that keep the pages this process holds
    within it (:mod:`gnnio.preprocess.reorder_bounded`; the same files, bit for bit); a budget too
    small to make progress is refused before anything is written.

    Node ``new2old[i]`` of ``ds`` becomes node ``i``: the graph is relabelled with
    :func:`relabel_csr`, feature rows and labels are permuted (``x'[i] = x[new2old[i]]``), the
    splits are mapped through ``old2new`` (and sorted). Two extra int64 arrays are stored:
    ``new2old`` and ``old2new``, relative to the *original* ids -- if ``ds`` was itself reordered
    (it has those arrays), the maps are composed, so ``new2old`` always points at the ids of the
    dataset as first imported. A ``from_pyg`` dataset's per-edge ``pyg_edge_id`` / ``edge_attr``
    follow their edges (``pyg_edge_id``: new CSR position -> ``edge_index`` column, written when
    only ``edge_attr`` was). Other extra arrays whose first dimension is N are treated as per-node
    data and permuted by row; any other extra array is dropped with a warning (its meaning, e.g.
    whether it holds node ids, is unknown). ``meta["reordered_by"]`` records ``reordered_by``, and
    ``meta["reorder_score"]`` the score's parameters ``score`` (:func:`gnnio.preprocess.hotness.
    score_params`; dropped when None: a custom order, or a reordered source's own record).

    ``out`` may be ``ds.path`` with ``overwrite=True`` (in-place: everything is read before the
    new directory replaces the old one).

    Returns:
        ``out`` as a Path.
    """
    n = ds.num_nodes
    new2old = np.ascontiguousarray(_integer_ids(new2old), dtype=np.int64)
    if new2old.shape != (n,):
        raise UsageError(f"new2old: need length num_nodes = {n}, got {list(new2old.shape)}")
    chunk = None
    if memory_budget is not None:
        from .reorder_bounded import check_budget

        chunk = check_budget(int(memory_budget), n)
    old2new = invert_permutation(new2old)
    prev_n2o = ds.extra.get("new2old")
    if prev_n2o is not None and np.asarray(prev_n2o).shape == (n,):
        orig_n2o = np.asarray(prev_n2o, dtype=np.int64)[new2old]
    else:
        orig_n2o = new2old
    orig_o2n = invert_permutation(orig_n2o)
    out = Path(out)
    size = sum(
        int(np.prod(a["shape"], dtype=np.int64)) * np.dtype(a["dtype"]).itemsize + 4096
        for a in ds.meta["arrays"].values()
    )
    size += 16 * n if prev_n2o is None else 0  # the new id maps
    if "edge_attr" in ds.extra and "pyg_edge_id" not in ds.extra:  # the edge map it will need
        size += 8 * ds.num_edges
    # non-finite features were accepted when the source was written (prepare --allow-nonfinite)
    allow = bool(ds.meta.get("nonfinite_features"))
    with DatasetWriter(out, name=ds.name, overwrite=overwrite, allow_nonfinite=allow,
                       size_hint=size) as w:  # fmt: skip
        for key, val in ds.meta.items():
            if key not in _COMPUTED_META:
                w.meta[key] = val
        w.meta["reordered_by"] = reordered_by if reordered_by is not None else "custom"
        w.meta.pop("reorder_score", None)  # the source's (if reordered) is not this order's
        if score is not None:
            w.meta["reorder_score"] = dict(score)
        g = ds.graph
        ind2 = w.create_array("indices", (g.num_edges,), index_dtype(n))
        with bar(1, desc="relabel graph", unit="graph", enabled=progress) as pb:
            if chunk is None:
                indptr2, _ = relabel_csr(g.indptr, g.indices, new2old, out=ind2)
            else:
                from . import reorder_bounded as rb

                indptr2 = rb.relabel_csr_bounded(g.indptr, g.indices, new2old, ind2, chunk)
            pb.update(1)
        w.save_array("indptr", indptr2)
        feats = w.create_array("features", tuple(ds.features.shape), ds.features.dtype)
        if chunk is None:
            _copy_feature_rows(ds.features, feats, new2old, progress)
        else:
            rb.copy_feature_rows_bounded(ds.features, feats, new2old, chunk, progress)
        if ds.labels is not None:
            w.save_array("labels", np.asarray(ds.labels)[new2old])
        for key in SPLITS:
            idx = getattr(ds, key)
            if idx is not None:
                w.save_array(key, np.sort(old2new[np.asarray(idx, dtype=np.int64)]))
        w.save_array("new2old", orig_n2o)
        w.save_array("old2new", orig_o2n)
        edges = [k for k in _EDGE_ARRAYS if k in ds.extra]
        if edges and all(ds.extra[k].shape[:1] == (g.num_edges,) for k in edges):
            _save_edge_arrays(w, ds, indptr2, new2old)
        else:
            edges = []
        for key, arr in ds.extra.items():
            if key in ("new2old", "old2new") or key in edges:
                continue
            if key in (SCALE, ZERO_POINT):  # the int8 codec: per column, not per node
                w.save_array(key, np.asarray(arr))
                continue
            if arr.ndim >= 1 and arr.shape[0] == n:
                w.save_array(key, np.asarray(arr)[new2old])
            else:
                warn(
                    f"{ds.path}: extra array '{key}' is not per-node data; "
                    "it is not copied to the reordered dataset"
                )
    return out


def reorder_path(
    path: str | os.PathLike,
    by: str,
    out: str | os.PathLike | None = None,
    overwrite: bool = False,
    fanouts: Sequence[int] = (15, 10, 5),
    batch_size: int = 1024,
    progress: bool = True,
    memory_budget: int | None = None,
    **score_options: Any,
) -> dict[str, Any]:
    """Score the dataset at ``path`` with ``by`` (a key of :data:`gnnio.preprocess.hotness.SCORES`) and write
    it reordered (hottest node first) to ``out``.

    ``out=None`` replaces ``path`` in place. An existing ``out`` (``path`` itself included) is
    replaced only with ``overwrite=True``.

    Returns ``{"out", "by", "num_nodes", "num_edges", "score_s", "reorder_s", "memory_budget",
    "score"}`` (seconds of wall clock; ``score``: the parameters recorded in ``meta.json``).
    """
    from ..preprocess.hotness import compute_score, score_params

    ds = load(path)
    params = score_params(by, fanouts, batch_size, **score_options)
    in_place = out is None or Path(out).resolve() == Path(path).resolve()
    # out=None asks for in-place explicitly; naming an existing directory (DIR itself included)
    # replaces it only with overwrite; a target that cannot be written is refused before scoring
    if out is not None:
        output_dir.check_out_dir(out, overwrite)
    if memory_budget is not None:  # a budget too small: refused before the score pass
        from .reorder_bounded import check_budget

        check_budget(int(memory_budget), ds.num_nodes)
    t0 = time.perf_counter()
    score = compute_score(
        by, ds, fanouts=fanouts, batch_size=batch_size, progress=progress,
        memory_budget=memory_budget, **score_options,
    )  # fmt: skip
    t1 = time.perf_counter()
    new2old = order_by_score(score)
    del score
    target = Path(path) if in_place or out is None else Path(out)
    if memory_budget is not None:  # the score pass's pages, before the bounded reorder
        from .reorder_bounded import release

        release(ds.graph.indices)
        release(ds.graph.indptr)
    reorder_dataset(
        ds, new2old, target, overwrite=overwrite or in_place, progress=progress, reordered_by=by,
        memory_budget=memory_budget, score=params,
    )  # fmt: skip
    t2 = time.perf_counter()
    return {
        "out": str(target),
        "by": by,
        "num_nodes": ds.num_nodes,
        "num_edges": ds.num_edges,
        "score_s": t1 - t0,
        "reorder_s": t2 - t1,
        "memory_budget": memory_budget,
        "score": params,
    }


def reorder_in_place(path: str | os.PathLike, by: str, progress: bool = True, **kw: Any) -> dict:
    """Reorder the dataset at ``path`` by score ``by`` and replace it (for ``prepare --reorder``).

    Keyword arguments go to :func:`reorder_path` (``fanouts``, ``batch_size``, score options).
    """
    return reorder_path(path, by, out=None, progress=progress, **kw)
