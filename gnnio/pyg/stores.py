"""PyG's remote-backend interfaces over gnnio: :class:`GnnioFeatureStore` (a
``torch_geometric.data.FeatureStore``) and :class:`GnnioGraphStore` (a ``GraphStore``).

Together they are ``data=(feature_store, graph_store)`` for PyG's loaders: ``NeighborLoader``
then samples from gnnio's CSR with PyG's own sampler (this needs pyg-lib or torch-sparse
installed) and reads every batch's rows through :meth:`GnnioFeatureStore.multi_get_tensor`, i.e.
through gnnio's tiers and caches, whose counters see every row and byte.

Keys follow PyG's homogeneous convention: ``TensorAttr(group_name=None, attr_name, index)`` and
``EdgeAttr(edge_type=None, layout, is_sorted, size)``. A tensor is one of

* a gnnio :class:`~gnnio.features.base.FeatureStore` (read-only; ``index`` rows come from
  ``store.gather(index)``, counted per tier, compressed rows decoded: bfloat16 as bfloat16,
  int8 dequantized to float32), registered with :meth:`GnnioFeatureStore.add_store`;
* an ordinary tensor put with ``put_tensor`` (PyG's contract: ``index`` given at ``put`` names the
  node ids of its rows, None = rows ``0..n-1``).

``remove_tensor`` only forgets a key (a gnnio store's data is never touched); ``update_tensor``
replaces it with an in-memory tensor. The graph store starts with gnnio's CSR of in-neighbours
as PyG's CSC layout (``colptr`` = gnnio's ``indptr``, ``row`` = ``indices``: the source of each
edge, grouped by target), so ``graph_store.csc()`` costs no conversion and its ``perm`` is None:
PyG's ``e_id`` is then the CSR position. COO and CSR come from PyG's own converters.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch_geometric.data import EdgeAttr, FeatureStore, GraphStore, TensorAttr
from torch_geometric.data.graph_store import EdgeLayout

from ..features.base import FeatureStore as GnnioStore
from .loader import _user_rows, compressed

__all__ = ["GnnioFeatureStore", "GnnioGraphStore"]


def _as_ids(index: Any, n: int, rows: bool = True) -> torch.Tensor | None:
    """A TensorAttr index as int64 ids; None = every row. Slices, lists, arrays, int or bool
    tensors; ids outside ``[0, n)`` (after PyG's slice rules) raise IndexError, as torch's
    indexing does for a bool mask that is not ``[n]`` (``rows``: the index selects rows of an
    ``n``-row tensor; else, at ``put_tensor``, it names the nodes of the rows, a mask over all the
    graph's nodes); float ids raise TypeError (never rounded)."""
    if index is None:
        return None
    if isinstance(index, slice):
        if index == slice(None, None, None):
            return None
        r = range(*index.indices(n))
        if len(r) == 0:
            return torch.empty(0, dtype=torch.int64)
        return torch.arange(r.start, r.start + len(r) * r.step, r.step, dtype=torch.int64)
    if isinstance(index, np.ndarray):
        index = torch.from_numpy(index)
    elif not isinstance(index, torch.Tensor):
        index = torch.as_tensor(index)
    if index.dtype == torch.bool:  # (as torch indexes: a mask covers every row)
        if index.dim() != 1 or (rows and index.shape[0] != n):
            raise IndexError(f"index: a bool mask needs shape [{n}], got {list(index.shape)}")
        return index.nonzero().view(-1)
    if index.numel() and (index.is_floating_point() or index.is_complex()):
        raise TypeError(f"index: need integer node ids or a bool mask, got dtype {index.dtype}")
    if index.dim() > 1:
        raise ValueError(f"index: need 1-D node ids, got shape {list(index.shape)}")
    return index.to(torch.int64).reshape(-1)


def _is_scalar(index: Any) -> bool:
    """An int (or 0-d) index: one row, returned without its leading dimension, as ``x[i]``."""
    if isinstance(index, (torch.Tensor, np.ndarray)):
        return index.ndim == 0
    return isinstance(index, (int, np.integer))


def _by_position(item: Any) -> bool:
    """Row ``i`` of ``item`` is node ``i`` (a gnnio store, a tensor put without ``index``): a
    bool mask then covers exactly its rows."""
    return isinstance(item, _Store) or item.ids is None


class _Tensor:
    """An in-memory tensor whose rows are the node ids ``ids`` (None = ``0..n-1``)."""

    def __init__(self, tensor: torch.Tensor, ids: torch.Tensor | None) -> None:
        self.tensor = tensor
        self.ids = ids
        if ids is not None:
            self.sorted, self.perm = torch.sort(ids)

    @property
    def size(self) -> tuple[int, ...]:
        return tuple(self.tensor.shape)

    def rows(self, ids: torch.Tensor | None) -> torch.Tensor:
        if ids is None:
            return self.tensor
        if self.ids is None:
            return self.tensor[ids]
        at = torch.searchsorted(self.sorted, ids).clamp_max(max(len(self.sorted) - 1, 0))
        if ids.numel() and (len(self.sorted) == 0 or not torch.equal(self.sorted[at], ids)):
            raise KeyError("index: some node ids have no row in this tensor")
        return self.tensor[self.perm[at]]


class _Store:
    """A gnnio feature store as a tensor (rows = global ids). Given its dataset's ``codec``
    (``feature_codec``), compressed rows are decoded as :class:`~gnnio.pyg.PyGLoader` decodes
    them: bfloat16 bits (stored as int16) viewed as bfloat16, int8 codes dequantized to float32.
    Without one the rows are returned as stored: an int16 or int8 store may hold integers."""

    def __init__(self, store: GnnioStore, codec=None) -> None:
        self.store = store
        self.codec = compressed(codec)  # (None: rows as stored)

    @property
    def size(self) -> tuple[int, ...]:
        return (int(self.store.num_rows), int(self.store.dim))

    def rows(self, ids: torch.Tensor | None) -> torch.Tensor:
        if ids is None:
            ids = torch.arange(int(self.store.num_rows), dtype=torch.int64)
        x = self.store.gather(ids)
        if self.codec is None:  # (a store's own int16 or int8 rows -- categorical ids, say)
            return x
        return _user_rows(x, self.codec, self)  # (its decoder kept on self, as a loader's)


class GnnioFeatureStore(FeatureStore):
    """PyG ``FeatureStore`` over gnnio feature stores and plain tensors (module docstring).

    Args:
        x: a gnnio feature store registered as attribute ``"x"``; None = none yet.
        **tensors: further node attributes by name (e.g. ``y=labels``), rows = node ids.
    """

    def __init__(self, x: GnnioStore | None = None, **tensors: torch.Tensor) -> None:
        super().__init__()
        self._items: dict[tuple[Any, str], _Tensor | _Store] = {}
        if x is not None:
            self.add_store(x, "x")
        for name, t in tensors.items():
            self.put_tensor(torch.as_tensor(t), group_name=None, attr_name=name, index=None)

    @classmethod
    def from_dataset(cls, dataset, store: GnnioStore | None = None) -> GnnioFeatureStore:
        """``x`` from ``store`` (default: an in-memory store over the dataset's features) and
        ``y`` from the dataset's labels, when it has some."""
        if store is None:
            from ..features import open_store

            store = open_store(dataset, "memory", progress=False)
        fs = cls()
        fs.add_store(store, "x", codec=dataset.feature_codec)
        if dataset.labels is not None:
            y = torch.from_numpy(np.asarray(dataset.labels, dtype=np.int64))
            fs.put_tensor(y, group_name=None, attr_name="y", index=None)
        return fs

    def add_store(self, store: GnnioStore, attr_name: str = "x", group_name=None,
                  codec=None) -> None:  # fmt: skip
        """Serve ``(group_name, attr_name)`` from a gnnio feature store (read-only). Rows come
        back as their values given ``codec`` (the dataset's ``feature_codec``, which
        :meth:`from_dataset` passes): a ``--feature-dtype bfloat16`` store's as bfloat16, an
        int8 store's dequantized to float32. Where PyG's stores return what was put, gnnio's
        compressed rows are decoded: their stored form is not the user's data. Without
        ``codec`` rows come as stored (int16 bits, int8 codes, or a store's own integers)."""
        self._items[(group_name, attr_name)] = _Store(store, codec)

    def gnnio_stores(self) -> dict[tuple[Any, str], GnnioStore]:
        """The gnnio stores behind attributes (their ``counters`` count every read)."""
        return {k: v.store for k, v in self._items.items() if isinstance(v, _Store)}

    @staticmethod
    def _key(attr: TensorAttr) -> tuple[Any, str]:
        return (attr.group_name, attr.attr_name)

    def _put_tensor(self, tensor, attr: TensorAttr) -> bool:
        if isinstance(tensor, np.ndarray):
            tensor = torch.from_numpy(tensor)
        ids = _as_ids(attr.index, int(tensor.shape[0]), rows=False)
        if ids is not None and ids.numel() != tensor.shape[0]:
            raise ValueError(f"put_tensor: {tensor.shape[0]} rows but {ids.numel()} index ids")
        self._items[self._key(attr)] = _Tensor(tensor, ids)
        return True

    def _get_tensor(self, attr: TensorAttr) -> torch.Tensor | None:
        item = self._items.get(self._key(attr))
        if item is None:
            raise KeyError(f"Could not find tensor for '{attr}'")
        rows = item.rows(_as_ids(attr.index, item.size[0], _by_position(item)))
        return rows[0] if _is_scalar(attr.index) else rows

    def _multi_get_tensor(self, attrs: list[TensorAttr]) -> list[torch.Tensor | None]:
        return [self._get_tensor(a) for a in attrs]

    def _remove_tensor(self, attr: TensorAttr) -> bool:
        return self._items.pop(self._key(attr), None) is not None

    def _get_tensor_size(self, attr: TensorAttr) -> tuple[int, ...] | None:
        item = self._items.get(self._key(attr))
        if item is None:
            return None
        ids = _as_ids(attr.index, item.size[0], _by_position(item))
        if _is_scalar(attr.index):
            return item.size[1:]
        return item.size if ids is None else (int(ids.numel()), *item.size[1:])

    def get_all_tensor_attrs(self) -> list[TensorAttr]:
        return [TensorAttr(group, name) for group, name in self._items]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(str(k[1]) for k in self._items)})"


class GnnioGraphStore(GraphStore):
    """PyG ``GraphStore`` over a gnnio CSR of in-neighbours (module docstring).

    Args:
        graph: a :class:`~gnnio.graph.csr.CSRGraph`, or a dataset (its ``graph``).
        edge_type: the key's edge type (None = PyG's homogeneous graph).

    The CSC pair is ``(row, colptr)`` as int64 tensors: ``colptr`` shares gnnio's ``indptr``;
    ``row`` is gnnio's ``indices`` (copied to int64 when stored as int32, the dtype PyG's samplers
    expect).
    """

    def __init__(self, graph, edge_type=None) -> None:
        super().__init__()
        graph = getattr(graph, "graph", graph)
        n = graph.num_nodes
        colptr = torch.from_numpy(np.asarray(graph.indptr, dtype=np.int64))
        row = torch.from_numpy(np.asarray(graph.indices, dtype=np.int64))
        self._items: dict[tuple[Any, EdgeLayout], tuple[EdgeAttr, Any]] = {}
        attr = EdgeAttr(edge_type, EdgeLayout.CSC, is_sorted=True, size=(n, n))
        self._put_edge_index((row, colptr), attr)

    @staticmethod
    def _key(attr: EdgeAttr) -> tuple[Any, EdgeLayout]:
        return (attr.edge_type, attr.layout)

    def _put_edge_index(self, edge_index, edge_attr: EdgeAttr) -> bool:
        self._items[self._key(edge_attr)] = (edge_attr, edge_index)
        return True

    def _get_edge_index(self, edge_attr: EdgeAttr):
        item = self._items.get(self._key(edge_attr))
        return None if item is None else item[1]

    def _remove_edge_index(self, edge_attr: EdgeAttr) -> bool:
        return self._items.pop(self._key(edge_attr), None) is not None

    def get_all_edge_attrs(self) -> list[EdgeAttr]:
        return [attr for attr, _ in self._items.values()]
