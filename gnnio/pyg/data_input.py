"""What :class:`gnnio.pyg.NeighborLoader` accepts as ``data``, turned into what gnnio's loader
needs: a CSR of in-neighbours, a gnnio feature store for ``x``, and the ``Data`` (or store pair)
that PyG's ``loader.data`` holds.

* a PyG ``Data``: its ``x`` and ``edge_index`` are converted once into a gnnio dataset in a cache
  directory named by their content hash (``$GNNIO_CACHE/pyg/data-<hash>``, or ``cache_dir``;
  an ``x`` of a dtype that format would change, anything but float32, float16 and bfloat16, is
  not converted but served from ``data.x`` itself, in its own dtype: :data:`KEPT_DTYPES`);
  later loaders over the same content, in this or any process, open it. Several processes (DDP
  ranks) converting the same ``Data`` at once take an exclusive ``flock`` on
  ``.data-<hash>.convert.lock`` in turn: the first converts (written to a temporary directory and
  renamed into place by :class:`~gnnio.graph.DatasetWriter`), the others wait for the lock and
  open the result. Every other attribute (``y``, masks, ``edge_attr``, anything added later) is
  read from the ``Data`` itself, batch by batch, as PyG's ``filter_data`` does;
* a ``(FeatureStore, GraphStore)`` pair: the graph from ``graph_store.csc()``; ``x`` from the
  gnnio store behind a :class:`~gnnio.pyg.GnnioFeatureStore`, or read through
  ``feature_store.get_tensor`` for any other PyG feature store; ``y`` likewise when present;
* a gnnio :class:`~gnnio.Dataset` or the path of one: its own graph and features.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np
import torch

from ..errors import DatasetError, UsageError
from ..features.base import FeatureStore
from ..graph.csr import CSRGraph

__all__ = ["Source", "cached_dataset", "content_hash", "resolve_data"]

#: bump when the cache's content changes meaning (old entries are then not reused)
CACHE_VERSION = 1
#: ``data.x`` dtypes the converted dataset holds as they are (bfloat16 as its int16 bits); rows
#: of any other dtype (float64, int64, ...) are served from ``data.x`` itself, in its own dtype
KEPT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def served_from_x(x) -> TypeGuard[torch.Tensor]:
    """Whether ``x`` (a ``Data``'s) is served from the tensor itself rather than from the
    converted dataset: a 2-D real tensor of a dtype gnnio's format would change."""
    return (
        isinstance(x, torch.Tensor)
        and x.dim() == 2
        and not x.is_complex()
        and x.dtype not in KEPT_DTYPES
    )


@dataclass
class Source:
    """Everything the loader needs from ``data``.

    Attributes:
        graph: CSR of in-neighbours (global ids).
        store: the gnnio feature store serving ``x`` (None: the input has no ``x``).
        data: what ``loader.data`` holds: the user's ``Data``, the store pair, or a ``Data``
            view of the gnnio dataset (built on first use).
        x_ref: the ``x`` tensor the store serves; a ``loader.data.x`` that is another object is
            read from that object instead.
        edge_ids: CSR position -> the user's edge id (``e_id``), None = the CSR position.
        device: the device of ``data.x`` (where batches go by default).
        dataset: the gnnio dataset behind the loader, when there is one.
        converted: True if this call wrote the cache entry (False: found or not a ``Data``).
        codec: the codec ``store``'s rows are decoded with per batch (bfloat16 bits, int8
            codes), None = served as they are.
    """

    graph: CSRGraph
    store: FeatureStore | None
    data: Any
    x_ref: Any = None
    edge_ids: torch.Tensor | None = None
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    dataset: Any = None
    converted: bool = False
    codec: Any = None


def _bytes_of(t: torch.Tensor) -> memoryview:
    t = t.detach().cpu().contiguous()
    return t.view(torch.uint8).numpy().reshape(-1).data if t.numel() else memoryview(b"")


def content_hash(x: torch.Tensor, edge_index: torch.Tensor) -> str:
    """Hex BLAKE2b (20 bytes) of ``x`` and ``edge_index``: dtypes, shapes and every byte."""
    h = hashlib.blake2b(digest_size=20)
    h.update(f"gnnio-pyg-cache-v{CACHE_VERSION}".encode())
    for t in (x, edge_index):
        h.update(f"{t.dtype}:{tuple(t.shape)};".encode())
        h.update(_bytes_of(t))
    return h.hexdigest()


def _cache_root(cache_dir) -> Path:
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    from ..train.defaults import cache_dir as gnnio_cache

    return gnnio_cache() / "pyg"


def cached_dataset(data, cache_dir=None) -> tuple[Path, bool]:
    """``(path, converted)``: the gnnio dataset of ``data.x`` / ``data.edge_index`` in the cache,
    converting it under the cache entry's lock unless it is there already (module docstring)."""
    from ..graph.dataset import load
    from ..importers.pyg import from_pyg

    x, ei = getattr(data, "x", None), getattr(data, "edge_index", None)
    if not isinstance(ei, torch.Tensor):
        raise UsageError("data: a Data needs an 'edge_index' tensor for gnnio's loader")
    if x is None:  # a graph without features: zero-width rows
        x = torch.empty((int(data.num_nodes or 0), 0))
    if not isinstance(x, torch.Tensor):
        raise UsageError(f"data: 'x' must be a tensor, got {type(x).__name__}")
    root = _cache_root(cache_dir)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DatasetError(
            f"{root}: cannot create the cache for converted Data ({e.strerror or e}); pass "
            "cache_dir= or set GNNIO_CACHE to a writable directory"
        ) from None
    key = content_hash(x, ei)
    out = root / f"data-{key}"
    fd = os.open(root / f".data-{key}.convert.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # blocks while another process converts this content
        if out.exists():
            try:
                load(out)
                return out, False
            except DatasetError:
                _discard(out)  # a damaged entry (its meta.json too): converted again below
        from torch_geometric.data import Data

        if served_from_x(x):  # rows read from data.x itself: only the graph is converted
            x = torch.empty((int(x.shape[0]), 0))
        minimal = Data(x=x, edge_index=ei, num_nodes=int(x.shape[0]))
        from_pyg(minimal, out, name=out.name, overwrite=out.exists(), progress=False,
                 allow_nonfinite=True, source={"cache": "gnnio.pyg.NeighborLoader"})  # fmt: skip
        return out, True
    finally:
        os.close(fd)  # (closing releases the lock)


def _discard(entry: Path) -> None:
    """Remove a damaged cache entry (the caller holds its lock): renamed aside first, so no
    half-removed entry is left under its name."""
    aside = entry.with_name(f".{entry.name}.damaged-{os.getpid()}")
    if aside.is_symlink() or aside.is_file():
        aside.unlink()
    elif aside.exists():
        shutil.rmtree(aside)
    os.replace(entry, aside)
    if aside.is_symlink() or not aside.is_dir():
        aside.unlink()
    else:
        shutil.rmtree(aside)


class _PygRows(FeatureStore):
    """A PyG ``FeatureStore`` attribute as a gnnio store (``get_tensor`` per batch, tier
    ``"pyg"``)."""

    def __init__(self, feature_store, attr: str = "x") -> None:
        super().__init__()
        self.fs, self.attr = feature_store, attr
        size = feature_store.get_tensor_size(None, attr)
        probe = feature_store.get_tensor(None, attr, index=torch.zeros(1, dtype=torch.long))
        self.num_rows, self.dim = int(size[0]), int(np.prod(size[1:]))
        self.dtype, self.device = probe.dtype, probe.device

    def gather(self, ids: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        rows = self.fs.get_tensor(None, self.attr, index=ids.cpu()).reshape(len(ids), self.dim)
        self.counters.add("pyg", len(ids), self.row_bytes)
        if out is None:
            return rows
        out[: len(ids)].copy_(rows)
        return out[: len(ids)]


def _from_stores(pair, store_kind) -> Source:
    from .stores import GnnioFeatureStore, _Store

    fs, gs = pair
    if len({a.edge_type for a in gs.get_all_edge_attrs()}) != 1:
        raise UsageError(
            "data: the GraphStore holds several edge types (or none); gnnio's NeighborLoader "
            "samples homogeneous graphs only"
        )
    row, colptr, perm = gs.csc()
    graph = CSRGraph(np.asarray(colptr.cpu(), dtype=np.int64), np.asarray(row.cpu()))
    store: Any = None
    codec = None
    item = fs._items.get((None, "x")) if isinstance(fs, GnnioFeatureStore) else None
    if isinstance(item, _Store):
        # read as get_tensor reads it: a compressed dataset's rows decoded (its codec)
        store, codec = item.store, item.codec
    elif any(a.attr_name == "x" for a in fs.get_all_tensor_attrs()):
        store = _PygRows(fs, "x")
    dev = store.device if store is not None else torch.device("cpu")
    return Source(graph=graph, store=store, data=pair, edge_ids=perm, device=dev, codec=codec)


def resolve_data(data, store_kind: str = "memory", cache_dir=None, threads=None) -> Source:
    """The :class:`Source` of any ``data`` NeighborLoader accepts (module docstring)."""
    from torch_geometric.data import Data, HeteroData

    from ..features import open_store
    from ..graph.dataset import Dataset, load

    if isinstance(data, HeteroData):
        raise UsageError(
            "data: a HeteroData (heterogeneous graph) is not supported by gnnio's "
            "NeighborLoader; it samples homogeneous graphs only"
        )
    if isinstance(data, tuple) and len(data) == 2:
        return _from_stores(data, store_kind)
    if isinstance(data, Data):
        path, converted = cached_dataset(data, cache_dir)
        ds = load(path)
        x = getattr(data, "x", None)
        if served_from_x(x):  # float64, int64, ...: PyG's rows, in x's own dtype
            from ..features.stores.memory import InMemoryFeatureStore

            store: FeatureStore = InMemoryFeatureStore(x.detach().cpu(), num_threads=threads)
        else:
            store = open_store(ds, store_kind, num_threads=threads, progress=False)
        edge_ids = None
        if "pyg_edge_id" in ds.extra:
            edge_ids = torch.from_numpy(np.asarray(ds.extra["pyg_edge_id"]))
        dev = x.device if isinstance(x, torch.Tensor) else torch.device("cpu")
        return Source(graph=ds.graph, store=store, data=data, x_ref=x, edge_ids=edge_ids,
                      device=dev, dataset=ds, converted=converted)  # fmt: skip
    if isinstance(data, (Dataset, str, os.PathLike)):
        ds = data if isinstance(data, Dataset) else load(data)
        store = open_store(ds, store_kind, num_threads=threads, progress=False)
        edge_ids = None
        if "pyg_edge_id" in ds.extra:
            edge_ids = torch.from_numpy(np.asarray(ds.extra["pyg_edge_id"]))
        return Source(graph=ds.graph, store=store, data=None, edge_ids=edge_ids, dataset=ds)
    raise UsageError(
        f"data: expected a PyG Data, a (FeatureStore, GraphStore) tuple, a gnnio Dataset or a "
        f"dataset path, got {type(data).__name__}"
    )
