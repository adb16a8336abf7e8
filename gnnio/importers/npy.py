"""A graph given as the user's own ``.npy`` arrays.

Topology is either a CSR of in-neighbours (``--indptr`` int [N+1], ``--indices`` int [E]: row
``v`` lists the ``u`` with an edge ``u -> v``, gnnio's convention) or an edge list (``--edges``,
int ``[2, E]`` with rows src/dst, or ``[E, 2]`` with columns src/dst; a ``[2, 2]`` array is
ambiguous and read as ``[2, E]``). Node count: ``len(indptr) - 1`` for a CSR, else
``--num-nodes`` or the number of feature rows. Duplicate edges are dropped; ``--symmetrize`` adds
each edge reversed. Self-loops are kept.

Features ``[N, F]`` (any int/float/bool dtype; float16 stays float16, everything else becomes
float32) are copied chunk by chunk from the memory-mapped input into the output memmap. Labels
(``[N]``, int with -1 = unlabeled, or float with NaN = unlabeled) and the split files (int node
ids, or bool masks of length N) are optional: without them a dataset can be benchmarked but not
trained. Every input is opened with ``mmap_mode="r"`` and ``allow_pickle=False``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import DatasetError, UsageError
from ..graph.csr import index_dtype
from ..graph.format import DatasetWriter
from ..preprocess.chunked import MIN_BUCKET, EdgeArrays, build_csr, csr_fixed_bytes, refuse_budget
from ._common import (
    CHUNK_BYTES,
    add_nonfinite_argument,
    copy_rows,
    edges_to_graph,
    feature_dtype_for,
    labels_to_int64,
    load_npy,
    output_bytes,
    write_graph,
)

__all__ = ["prepare_npy", "HELP", "DESCRIPTION"]

HELP = "your own arrays: CSR or edge list, features, labels and splits as .npy files"
DESCRIPTION = (
    "Import a graph from .npy files: either --indptr/--indices (CSR of in-neighbours) or --edges "
    "([2,E] or [E,2]; [2,2] is read as [2,E]), plus --features [N,F] and optionally --labels and "
    "the split files. Inputs are memory-mapped; features are copied to disk in chunks."
)

ArrayLike = str | Path | np.ndarray
SPLITS = ("train_idx", "valid_idx", "test_idx")


def add_arguments(parser) -> None:
    g = parser.add_argument_group("topology (either --indptr and --indices, or --edges)")
    g.add_argument("--indptr", metavar="F", help="int [N+1] CSR row pointers (in-neighbours)")
    g.add_argument(
        "--indices", metavar="F", help="int [E] CSR column ids (source node of each edge)"
    )
    g.add_argument(
        "--edges", metavar="F", help="int [2,E] or [E,2] edge list src -> dst ([2,2] read as [2,E])"
    )
    g.add_argument(
        "--num-nodes", type=int, metavar="N", help="node count for --edges (default: feature rows)"
    )
    g.add_argument(
        "--symmetrize", action="store_true", help="add every edge reversed (deduplicated)"
    )
    parser.add_argument("--features", required=True, metavar="F", help="[N,F] node features")
    parser.add_argument("--labels", metavar="F", help="[N] class ids (-1 or NaN = unlabeled)")
    parser.add_argument("--train-idx", metavar="F", help="train node ids (int) or a bool [N] mask")
    parser.add_argument("--valid-idx", metavar="F", help="validation node ids or mask")
    parser.add_argument("--test-idx", metavar="F", help="test node ids or mask")
    add_nonfinite_argument(parser)


def _feature_chunk(budget: int, row_bytes: int) -> int:
    """Bytes of one chunk of feature rows within ``budget``: :data:`._common.CHUNK_BYTES` at most,
    a sixteenth of the budget, one row at least."""
    return max(int(row_bytes), min(CHUNK_BYTES, int(budget) // 16))


def run(args) -> Path:
    return prepare_npy(
        args.features,
        args.out,
        indptr=args.indptr,
        indices=args.indices,
        edges=args.edges,
        num_nodes=args.num_nodes,
        labels=args.labels,
        train_idx=args.train_idx,
        valid_idx=args.valid_idx,
        test_idx=args.test_idx,
        symmetrize=args.symmetrize,
        overwrite=args.overwrite,
        progress=not args.quiet,
        allow_nonfinite=args.allow_nonfinite,
        memory_budget=getattr(args, "memory_budget", None),
    )


def _open(x: ArrayLike, arg: str, files: dict[str, str]) -> tuple[np.ndarray, str]:
    """The array and the label errors use: ``--arg FILE`` for a file, ``arg (array)`` otherwise.

    Records the input (absolute path, or "(array)") in ``files`` for the provenance metadata.
    """
    key = arg.lstrip("-").replace("-", "_")
    if isinstance(x, np.ndarray):
        files[key] = "(array)"
        return x, f"{key} (array)"
    arr = load_npy(x, arg)
    files[key] = str(Path(x).resolve())
    return arr, f"{arg} {x}"


def _int_array(arr: np.ndarray, where: str, ndim: int) -> None:
    if arr.ndim != ndim:
        raise DatasetError(f"{where}: expected a {ndim}-D array, got shape {list(arr.shape)}")
    if arr.dtype.kind not in "iu":
        raise DatasetError(f"{where}: expected an integer array, got {arr.dtype}")


def _check_range(ids: np.ndarray, n: int, where: str) -> None:
    if ids.size:
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= n:
            bad = lo if lo < 0 else hi
            raise DatasetError(f"{where}: node id {bad} is out of range [0, {n})")


def _split_ids(arr: np.ndarray, n: int, where: str) -> np.ndarray:
    if arr.dtype == np.bool_:
        if arr.shape != (n,):
            raise DatasetError(f"{where}: a bool mask must have shape [{n}], got {list(arr.shape)}")
        return np.flatnonzero(arr).astype(np.int64)
    _int_array(arr, where, 1)
    ids = np.asarray(arr, dtype=np.int64)
    _check_range(ids, n, where)
    if np.unique(ids).shape[0] != ids.shape[0]:
        raise DatasetError(f"{where}: contains repeated node ids")
    return ids


def _check_range_chunked(ea: EdgeArrays, n: int, where: str) -> None:
    """:func:`_check_range` of every id of ``ea``, one chunk at a time."""
    lo, hi = ea.min_max()
    if lo < 0 or hi >= n:
        raise DatasetError(f"{where}: node id {lo if lo < 0 else hi} is out of range [0, {n})")


def _topology(indptr, indices, edges, num_nodes, n_feat, files, bounded=False):
    """``(edges, n, layout)`` after checking the topology arguments: ``edges`` is ``(src, dst)``
    int64 arrays, or with ``bounded`` an :class:`~gnnio.preprocess.chunked.EdgeArrays` over the
    (memory-mapped) inputs, checked one chunk at a time."""
    if edges is not None and (indptr is not None or indices is not None):
        raise UsageError("--edges: give either --edges or --indptr/--indices, not both")
    if edges is None:
        if indptr is None or indices is None:
            missing = "--indices" if indptr is not None else "--indptr"
            if indptr is None and indices is None:
                raise UsageError("give the topology: --indptr and --indices, or --edges")
            raise UsageError(f"{missing}: is required together with the other CSR array")
        if num_nodes is not None:
            raise UsageError("--num-nodes: only used with --edges (a CSR gives N = len(indptr)-1)")
        ip, w_ip = _open(indptr, "--indptr", files)
        ix, w_ix = _open(indices, "--indices", files)
        _int_array(ip, w_ip, 1)
        _int_array(ix, w_ix, 1)
        if ip.shape[0] < 1:
            raise DatasetError(f"{w_ip}: is empty (needs N+1 >= 1 entries)")
        ip = np.asarray(ip, dtype=np.int64)
        n = ip.shape[0] - 1
        if ip[0] != 0:
            raise DatasetError(f"{w_ip}: must start at 0, starts at {int(ip[0])}")
        dec = np.flatnonzero(np.diff(ip) < 0)
        if dec.size:
            raise DatasetError(f"{w_ip}: decreases at position {int(dec[0]) + 1}")
        if int(ip[-1]) != ix.shape[0]:
            raise DatasetError(
                f"{w_ip}: ends at {int(ip[-1])} but {w_ix} has {ix.shape[0]} entries"
            )
        if bounded:
            ea = EdgeArrays(ix, indptr=ip)
            _check_range_chunked(ea, n, w_ix)
            return ea, n, "csr"
        src = np.asarray(ix, dtype=np.int64)
        _check_range(src, n, w_ix)
        dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(ip))
        return (src, dst), n, "csr"
    ed, w_ed = _open(edges, "--edges", files)
    _int_array(ed, w_ed, 2)
    if ed.shape[0] == 2:  # [2, E]; also the ambiguous [2, 2]
        src, dst, layout = ed[0], ed[1], "[2,E]"
    elif ed.shape[1] == 2:
        src, dst, layout = ed[:, 0], ed[:, 1], "[E,2]"
    else:
        raise DatasetError(f"{w_ed}: expected shape [2, E] or [E, 2], got {list(ed.shape)}")
    if num_nodes is not None:
        if num_nodes < 0:
            raise UsageError(f"--num-nodes {num_nodes}: must be >= 0")
        n = int(num_nodes)
    else:
        n = n_feat
    if bounded:
        ea = EdgeArrays(src, dst)
        _check_range_chunked(ea, n, w_ed)
        return ea, n, layout
    src, dst = np.asarray(src, np.int64), np.asarray(dst, np.int64)
    _check_range(src, n, w_ed)
    _check_range(dst, n, w_ed)
    return (src, dst), n, layout


def prepare_npy(
    features: ArrayLike,
    out: str | Path,
    indptr: ArrayLike | None = None,
    indices: ArrayLike | None = None,
    edges: ArrayLike | None = None,
    num_nodes: int | None = None,
    labels: ArrayLike | None = None,
    train_idx: ArrayLike | None = None,
    valid_idx: ArrayLike | None = None,
    test_idx: ArrayLike | None = None,
    symmetrize: bool = False,
    name: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
    allow_nonfinite: bool = False,
    memory_budget: int | None = None,
) -> Path:
    """Import a graph from ``.npy`` files (paths) or in-memory arrays into a gnnio dataset.

    See the module docstring for the accepted shapes and dtypes. All inputs are checked before
    anything is written; errors are one-line DatasetErrors (bad files) or UsageErrors (bad argument
    combinations) naming the argument and file. ``name`` defaults to the output folder's name.
    NaN or infinite features are refused unless ``allow_nonfinite``. Returns ``out``.

    ``memory_budget`` (bytes): read the inputs through their mappings one chunk at a time and
    build the CSR in buckets (:func:`gnnio.preprocess.chunked.build_csr`), the same files bit for
    bit; a budget below what the per-node arrays and one chunk need is a one-line UsageError
    before anything is written. None: all in RAM.
    """
    files: dict[str, str] = {}
    feats, w_f = _open(features, "--features", files)
    if feats.ndim != 2:
        raise DatasetError(f"{w_f}: expected a 2-D [N, F] array, got shape {list(feats.shape)}")
    if feats.shape[1] == 0:  # (no model can train on it: train would fail naming model dims)
        raise DatasetError(f"{w_f}: has 0 feature columns, shape {list(feats.shape)}; need F >= 1")
    if feats.dtype.kind not in "fiub":
        raise DatasetError(f"{w_f}: expected numeric features, got {feats.dtype}")
    bounded = memory_budget is not None
    topo, n, layout = _topology(indptr, indices, edges, num_nodes, feats.shape[0], files, bounded)
    if feats.shape[0] != n:
        what = "--num-nodes" if num_nodes is not None else "the topology"
        raise DatasetError(f"{w_f}: has {feats.shape[0]} rows but {what} gives {n} nodes")

    lab = None
    if labels is not None:
        arr, w_l = _open(labels, "--labels", files)
        lab = labels_to_int64(np.asarray(arr), w_l)
        if lab.shape[0] != n:
            raise DatasetError(f"{w_l}: has {lab.shape[0]} labels for {n} nodes")

    splits: dict[str, np.ndarray] = {}
    owner = np.full(n, -1, dtype=np.int8)
    for i, (key, val) in enumerate(zip(SPLITS, (train_idx, valid_idx, test_idx))):
        if val is None:
            continue
        arg = "--" + key.replace("_", "-")
        arr, where = _open(val, arg, files)
        ids = _split_ids(np.asarray(arr), n, where)
        clash = ids[owner[ids] >= 0]
        if clash.size:
            other = SPLITS[int(owner[clash[0]])]
            raise DatasetError(
                f"{where}: node {int(clash[0])} is also in {other} (splits must be disjoint)"
            )
        owner[ids] = i
        splits[key] = ids
    del owner

    feat_dtype = feature_dtype_for(feats.dtype)
    row_bytes = feats.shape[1] * feat_dtype.itemsize
    num_input_edges = int(topo.num_edges if bounded else topo[0].shape[0])
    if memory_budget is not None:  # (bounded)
        held = n * 16 + (lab.nbytes if lab is not None else 0)  # indptr input, labels, splits
        held += sum(int(ids.nbytes) for ids in splits.values())
        chunk = _feature_chunk(int(memory_budget), row_bytes)
        keys = num_input_edges * (2 if symmetrize else 1)
        need = held + 2 * chunk + csr_fixed_bytes(n, keys) + MIN_BUCKET
        refuse_budget(int(memory_budget), need, f"import {n:,} nodes and {num_input_edges:,} "
                      "edges", "the per-node arrays, a chunk of feature rows and of edges, and "
                      "1 MiB of sort keys")  # fmt: skip
        csr_bytes = int(memory_budget) - held - 2 * chunk
        isize = index_dtype(n).itemsize
        graph_bytes = 8 * (n + 1) + 2 * keys * isize  # indices and their part file, at most
    else:
        src, dst = topo
        indptr_out, indices_out = edges_to_graph(src, dst, n, symmetrize=symmetrize)
        graph_bytes = int(indptr_out.nbytes + indices_out.nbytes)
        del topo
    source = {
        "importer": "npy",
        "inputs": files,
        "topology": layout,
        "symmetrized": bool(symmetrize),
        "input_edges": num_input_edges,
        "input_feature_dtype": str(feats.dtype),
    }
    out = Path(out)
    size = output_bytes(lab, *splits.values(), rows=n, row_bytes=row_bytes) + graph_bytes
    with DatasetWriter(out, name=name or out.name, overwrite=overwrite,
                       allow_nonfinite=allow_nonfinite, size_hint=size) as w:  # fmt: skip
        if bounded:
            build_csr(w, topo, n, csr_bytes, symmetrize=symmetrize, progress=progress)
            del topo
        else:
            write_graph(w, indptr_out, indices_out)
            del indptr_out, indices_out
        dst_feats = w.create_array("features", tuple(feats.shape), feat_dtype)
        copy_rows(feats, dst_feats, desc="features", progress=progress, drop=bounded,
                  chunk_rows=chunk // max(1, feats[:1].nbytes, row_bytes) if bounded else None)  # fmt: skip
        del dst_feats
        if lab is not None:
            w.save_array("labels", lab)
            w.meta["num_classes"] = int(lab.max()) + 1 if lab.size and lab.max() >= 0 else 0
        for key, ids in splits.items():
            w.save_array(key, ids)
        w.meta["source"] = source
    return out
