"""An in-memory PyG ``Data`` object (``gnnio.from_pyg``, ``gnnio prepare pyg``), and back
(:func:`to_pyg`).

What is read from the ``Data`` (duck-typed: any object with these attributes):

* ``x`` ``[N, F]`` (required): float16 and bfloat16 stay as they are (bfloat16 stored as its
  int16 bits), any other dtype becomes float32 with one warning naming it (float64, int64: a
  gnnio dataset holds float32, float16, bfloat16 or int8 rows); copied into
  the output file one chunk of rows at a time (``.to()`` per chunk, so a CUDA or bfloat16 tensor is
  never converted whole);
* ``edge_index`` ``[2, E]`` (row 0 source, row 1 target, PyG's ``source_to_target`` flow): stored
  as gnnio's CSR of in-neighbours by a *stable* sort on the target, so each row keeps the edges'
  order in ``edge_index`` -- the order PyG's ``NeighborLoader`` builds its CSC in. Edges are kept as
  they are (repeats and self-loops too). When that sort moved edges, the array ``pyg_edge_id``
  (CSR position -> column of ``edge_index``) is stored, so :class:`gnnio.pyg.PyGLoader` reports
  PyG's ``e_id`` and :func:`to_pyg` restores ``edge_index`` column for column;
* ``edge_attr`` ``[E, ...]`` (optional): stored as the array ``edge_attr`` in ``edge_index``'s
  order (numeric dtypes; chunked copy);
* ``y`` (optional): ``[N]`` or ``[N, 1]`` class ids (-1, or NaN for float labels, = unlabelled);
* splits (optional): bool masks ``train_mask`` / ``val_mask`` / ``test_mask`` (PyG's Planetoid
  names), else index tensors ``train_idx`` / ``val_idx`` (or ``valid_idx``) / ``test_idx``. They
  must be disjoint; a 2-D mask (several random splits) must be narrowed to one column first.

Other attributes are not stored. ``meta["pyg"]`` records what :func:`to_pyg` needs to give back
the same field names and shapes.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import DatasetError, GnnioError, UsageError
from ..graph.csr import index_dtype
from ..graph.feature_dtype import requested
from ..graph.format import DatasetWriter
from ..utils.progress import bar
from ..utils.warnings_at import warn
from ._common import (
    add_nonfinite_argument,
    labels_to_int64,
    output_bytes,
    rows_per_chunk,
    write_graph,
)

if TYPE_CHECKING:  # (imported where used: ``gnnio prepare`` from other sources loads no torch)
    import torch

__all__ = ["from_pyg", "to_pyg", "load_object", "HELP", "DESCRIPTION"]

HELP = "a PyG Data object built by your own Python module (--module M --attr A)"
DESCRIPTION = (
    "Import an in-memory torch_geometric Data object: --module names an importable module or a "
    ".py file, --attr the Data in it (or a function returning it, or a dataset whose only item "
    "is it). Reads x, edge_index, optional edge_attr, y and train/val/test masks or index "
    "splits; edges keep their order within each target node."
)

#: gnnio split -> PyG attribute names, masks first
SPLITS = {
    "train_idx": ("train_mask", "train_idx"),
    "valid_idx": ("val_mask", "val_idx", "valid_idx"),
    "test_idx": ("test_mask", "test_idx"),
}


def add_arguments(parser) -> None:
    parser.add_argument(
        "--module", required=True, metavar="M", help="module name (importable) or path of a .py"
    )
    parser.add_argument(
        "--attr",
        default="data",
        metavar="A",
        help="attribute of M holding the Data (or a function returning it)",
    )
    add_nonfinite_argument(parser)


def run(args) -> Path:
    data = load_object(args.module, args.attr)
    source = {"module": str(args.module), "attr": str(args.attr)}
    return from_pyg(
        data,
        args.out,
        overwrite=args.overwrite,
        progress=not args.quiet,
        source=source,
        allow_nonfinite=args.allow_nonfinite,
    )


def load_object(module: str, attr: str) -> Any:
    """``attr`` of ``module`` (a module name, looked up with the working directory on the path,
    or a ``.py`` file); a callable is called with no arguments, and a one-item dataset gives its
    item. One-line UsageError when the module or attribute is missing."""
    path = Path(module)
    added = None
    try:
        if module.endswith(".py") or path.is_file():
            if not path.is_file():
                raise UsageError(f"--module {module}: no such file")
            added = str(path.resolve().parent)
            sys.path.insert(0, added)
            spec = importlib.util.spec_from_file_location(f"_gnnio_user_{path.stem}", path)
            if spec is None or spec.loader is None:  # (a suffix no importer reads: .txt)
                raise UsageError(f"--module {module}: not a Python module file (name it .py)")
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
        else:
            added = os.getcwd()
            sys.path.insert(0, added)
            mod = importlib.import_module(module)
    except UsageError:
        raise
    except Exception as e:
        msg = " ".join(str(e).split())[:300]
        raise UsageError(
            f"--module {module}: cannot import it ({type(e).__name__}: {msg})"
        ) from None
    finally:
        if added is not None and added in sys.path:
            sys.path.remove(added)
    try:  # the user's code runs here too: its exception is one line, not a traceback
        if not hasattr(mod, attr):
            raise UsageError(f"--attr {attr}: module {module} has no attribute '{attr}'")
        obj = getattr(mod, attr)
        if callable(obj) and not hasattr(obj, "edge_index"):
            obj = obj()
        if not hasattr(obj, "edge_index") and hasattr(obj, "__len__") and len(obj) == 1:
            obj = obj[0]
    except GnnioError:
        raise
    except Exception as e:
        msg = " ".join(str(e).split())[:300]
        raise UsageError(
            f"--attr {attr}: module {module} raised {type(e).__name__}: {msg}"
        ) from None
    return obj


def _tensor(value: Any, where: str) -> torch.Tensor:
    import torch

    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    if not isinstance(value, torch.Tensor):
        raise DatasetError(f"{where}: expected a tensor, got {type(value).__name__}")
    return value.detach()


def _copy_chunks(src: torch.Tensor, dst: np.ndarray, desc: str, progress: bool) -> None:
    """``dst[:] = src`` one chunk of rows at a time (each chunk cast with ``.to()`` and moved to
    the CPU on its own)."""
    import torch

    n = int(src.shape[0])
    dt = torch.from_numpy(np.empty(0, dtype=dst.dtype)).dtype
    row_bytes = max(1, int(dst[:1].nbytes), src[:1].numel() * src.element_size())
    step = rows_per_chunk(row_bytes)
    with bar(total=n, desc=desc, unit="row", enabled=progress) as pb:
        for s in range(0, n, step):
            e = min(n, s + step)
            dst[s:e] = src[s:e].to(device="cpu", dtype=dt).numpy()
            pb.update(e - s)


def _splits(data, n: int) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Split ids by gnnio key, and the PyG attribute each came from."""
    import torch

    out: dict[str, np.ndarray] = {}
    names: dict[str, str] = {}
    owner = np.full(n, -1, dtype=np.int8)
    for i, (key, attrs) in enumerate(SPLITS.items()):
        for attr in attrs:
            val = getattr(data, attr, None)
            if val is None:
                continue
            t = _tensor(val, attr).cpu()
            if t.dtype == torch.bool:
                if t.dim() != 1 or t.shape[0] != n:
                    raise DatasetError(
                        f"{attr}: a mask must have shape [{n}], got {list(t.shape)} (for several "
                        f"splits pick one column first, e.g. data.{attr} = data.{attr}[:, 0])"
                    )
                ids = t.nonzero().view(-1).numpy().astype(np.int64)
            else:
                if t.dim() != 1 or t.is_floating_point():
                    raise DatasetError(f"{attr}: expected 1-D integer node ids or a bool mask")
                ids = t.numpy().astype(np.int64)
                if ids.size and (ids.min() < 0 or ids.max() >= n):
                    raise DatasetError(f"{attr}: node ids must lie in [0, {n})")
                if np.unique(ids).shape[0] != ids.shape[0]:
                    raise DatasetError(f"{attr}: contains repeated node ids")
            clash = ids[owner[ids] >= 0]
            if clash.size:
                other = names[list(SPLITS)[int(owner[clash[0]])]]
                raise DatasetError(
                    f"{attr}: node {int(clash[0])} is also in {other} (splits must be disjoint)"
                )
            owner[ids] = i
            out[key], names[key] = ids, attr
            break
    return out, names


def _cast_note(dtype: torch.dtype) -> str:
    """The one warning of :func:`from_pyg` for an ``x`` its format cannot keep."""
    name = str(dtype).removeprefix("torch.")
    exact = "" if dtype.is_floating_point else " (integers beyond 2**24 are rounded)"
    return (
        f"x: {name} features are stored as float32{exact}: a gnnio dataset holds float32, "
        f"float16, bfloat16 or int8 rows; gnnio.pyg.NeighborLoader over the Data itself keeps "
        f"{name}"
    )


def from_pyg(
    data,
    out: str | os.PathLike,
    name: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
    source: dict | None = None,
    allow_nonfinite: bool = False,
) -> Path:
    """Write a PyG ``Data`` (module docstring) as a gnnio dataset at ``out``, atomically (through
    :class:`~gnnio.graph.DatasetWriter`). Everything is checked before anything is written;
    problems are one-line DatasetErrors naming the attribute (NaN or infinite features unless
    ``allow_nonfinite``). ``name`` defaults to ``out``'s folder name. Returns ``out``."""
    import torch

    if not hasattr(data, "edge_index") or getattr(data, "x", None) is None:
        raise DatasetError("data: need a homogeneous PyG Data with 'x' and 'edge_index'")
    x = _tensor(data.x, "x")
    if x.dim() != 2 or x.is_complex():
        raise DatasetError(f"x: expected a real [N, F] tensor, got shape {list(x.shape)}")
    n = int(getattr(data, "num_nodes", None) or x.shape[0])
    if x.shape[0] != n:
        raise DatasetError(f"x: has {x.shape[0]} rows but data.num_nodes is {n}")
    ei = _tensor(data.edge_index, "edge_index").cpu()
    if ei.dim() != 2 or ei.shape[0] != 2 or ei.is_floating_point():
        raise DatasetError(f"edge_index: expected an integer [2, E] tensor, got {list(ei.shape)}")
    src, dst = ei[0].numpy().astype(np.int64), ei[1].numpy().astype(np.int64)
    e = int(src.shape[0])
    if e and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= n):
        raise DatasetError(f"edge_index: node ids must lie in [0, {n})")
    edge_attr = getattr(data, "edge_attr", None)
    if edge_attr is not None:
        edge_attr = _tensor(edge_attr, "edge_attr")
        if edge_attr.shape[0] != e or edge_attr.is_complex():
            raise DatasetError(f"edge_attr: expected {e} rows of real values")
    lab = None
    y = getattr(data, "y", None)
    if y is not None:
        y = _tensor(y, "y").cpu()
        if y.shape[0] != n:
            raise DatasetError(f"y: has {y.shape[0]} entries for {n} nodes (node labels only)")
        lab = labels_to_int64(y.numpy(), "y")
    splits, split_names = _splits(data, n)

    perm = np.argsort(dst, kind="stable")
    identity = bool(np.array_equal(perm, np.arange(e)))
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    indices = src[perm].astype(index_dtype(n))
    del src, dst
    # half precision stays as it is: float16, bfloat16 (its bits as int16, gnnio.graph.feature_dtype)
    feat_dtype = {torch.float16: np.float16, torch.bfloat16: np.int16}.get(x.dtype, np.float32)
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16) and requested() is None:
        warn(_cast_note(x.dtype))
    if x.dtype == torch.bfloat16:
        x = x.view(torch.int16)
    out = Path(out)
    size = output_bytes(indptr, indices, lab, None if identity else perm, *splits.values(), rows=n,
                        row_bytes=int(x.shape[1]) * np.dtype(feat_dtype).itemsize)  # fmt: skip
    if edge_attr is not None:
        size += edge_attr.numel() * edge_attr.element_size()
    with DatasetWriter(out, name=name or out.name, overwrite=overwrite,
                       allow_nonfinite=allow_nonfinite, size_hint=size) as w:  # fmt: skip
        write_graph(w, indptr, indices)
        del indices
        if not identity:
            w.save_array("pyg_edge_id", perm.astype(np.int64))
        del perm
        _copy_chunks(x, w.create_array("features", (n, int(x.shape[1])), feat_dtype),
                     "features", progress)  # fmt: skip
        if edge_attr is not None:
            ea_dtype = torch.empty(0, dtype=edge_attr.dtype).numpy().dtype
            dst_ea = w.create_array("edge_attr", tuple(edge_attr.shape), ea_dtype)
            _copy_chunks(edge_attr, dst_ea, "edge_attr", progress)
        if lab is not None:
            w.save_array("labels", lab)
            w.meta["num_classes"] = int(lab.max()) + 1 if lab.size and lab.max() >= 0 else 0
        for key, ids in splits.items():
            w.save_array(key, ids)
        w.meta["pyg"] = {
            "splits": split_names,
            "y_shape": None if y is None else list(y.shape),
            "edge_order": "csc" if identity else "pyg_edge_id",
        }
        w.meta["source"] = {"importer": "pyg", "class": type(data).__name__, **(source or {})}
    return out


def to_pyg(dataset):
    """A dataset as a PyG ``Data``: ``x`` (zero-copy over the memory-mapped features),
    ``edge_index`` (the original column order when the dataset came from :func:`from_pyg`, else
    grouped by target), ``edge_attr``, ``y`` and the splits under the names they were imported
    with (masks as masks, index lists as index lists; ``train_mask`` / ``val_mask`` /
    ``test_mask`` for other datasets)."""
    import torch
    from torch_geometric.data import Data

    from ..graph.dataset import Dataset, load

    ds = dataset if isinstance(dataset, Dataset) else load(dataset)
    info = ds.meta.get("pyg", {})
    n = ds.num_nodes
    indptr = np.asarray(ds.graph.indptr)
    dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    src = np.asarray(ds.graph.indices, dtype=np.int64)
    edge_index = np.empty((2, src.shape[0]), dtype=np.int64)
    order = ds.extra.get("pyg_edge_id")
    if order is None:
        edge_index[0], edge_index[1] = src, dst
    else:
        order = np.asarray(order)
        edge_index[0, order], edge_index[1, order] = src, dst
    x = torch.from_numpy(ds.features)
    if ds.feat_dtype == "bfloat16":
        x = x.view(torch.bfloat16)
    elif ds.feat_dtype == "int8":  # PyG has no per-column int8 rows: float32, dequantized
        x = torch.from_numpy(ds.feature_codec.decode(np.asarray(ds.features)))
    data = Data(x=x, edge_index=torch.from_numpy(edge_index))
    if "edge_attr" in ds.extra:
        data.edge_attr = torch.from_numpy(ds.extra["edge_attr"])
    if ds.labels is not None:
        y = torch.from_numpy(np.asarray(ds.labels, dtype=np.int64))
        shape = info.get("y_shape")
        data.y = y.view(*shape) if shape else y
    names = info.get("splits", {})
    for key, attrs in SPLITS.items():
        ids = getattr(ds, key)
        if ids is None:
            continue
        attr = names.get(key, attrs[0])
        ids_t = torch.from_numpy(np.asarray(ids, dtype=np.int64))
        if attr.endswith("_mask"):
            mask = torch.zeros(n, dtype=torch.bool)
            mask[ids_t] = True
            data[attr] = mask
        else:
            data[attr] = ids_t
    data.num_nodes = n
    return data
