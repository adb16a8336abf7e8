"""CSR topology and graph utilities.

Convention (used everywhere in gnnio): the stored CSR holds **in-neighbours**. Row ``v`` lists the
nodes ``u`` with an edge ``u -> v``, i.e. the nodes ``v`` aggregates from during message passing.
``indptr`` is int64 of length N+1; ``indices`` is int32 when N < 2**31, int64 otherwise. Arrays are
NumPy (possibly memory-mapped); ``to_torch`` gives zero-copy torch views.
"""

from __future__ import annotations

import operator
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ._csr_check import check_csr

if TYPE_CHECKING:
    import torch

__all__ = ["CSRGraph", "index_dtype", "edges_to_csr", "check_csr", "check_graph"]


def index_dtype(num_nodes: int) -> np.dtype:
    """The dtype of ``indices`` for a graph of ``num_nodes`` nodes."""
    return np.dtype(np.int32) if num_nodes < 2**31 else np.dtype(np.int64)


def check_graph(graph) -> None:
    """ValueError unless ``graph``'s host arrays are a CSR (:func:`check_csr`), for a function
    whose numba kernel walks them: a :class:`CSRGraph` was checked when built (and is frozen),
    so only other objects with ``indptr``/``indices`` cost the pass."""
    if not isinstance(graph, CSRGraph):
        check_csr(np.asanyarray(graph.indptr), np.asanyarray(graph.indices))


def _is_tensor(a) -> bool:
    """Whether ``a`` is a torch tensor, without importing torch (a process that has not imported
    it holds none): ``gnnio info``, ``prepare`` and ``plan`` open graphs without torch."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(a, torch.Tensor)


def edges_to_csr(
    src: np.ndarray, dst: np.ndarray, num_nodes: int, dedup: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """CSR of in-neighbours from directed edges ``src[i] -> dst[i]``.

    Neighbour lists come out sorted by source id. With ``dedup`` repeated edges are dropped.
    An id outside ``[0, num_nodes)`` is refused (ValueError naming the first), as are ids that
    are not integers (TypeError: a float id is never rounded, a bool mask is not a list of ids).
    Returns ``(indptr int64 [N+1], indices [E'])``.
    """
    src, dst = _edge_ids(src, "src"), _edge_ids(dst, "dst")
    try:
        num_nodes = operator.index(num_nodes)
    except TypeError:
        raise TypeError(f"num_nodes: need an integer, got {num_nodes!r}") from None
    if num_nodes < 0:
        raise ValueError(f"num_nodes: must be >= 0, got {num_nodes}")
    if src.shape != dst.shape:
        raise ValueError(f"src and dst differ in length: {src.shape} vs {dst.shape}")
    for name, a in (("src", src), ("dst", dst)):  # (else an edge lands silently in another row)
        if a.size and (a.min() < 0 or a.max() >= num_nodes):
            i = int(np.flatnonzero((a < 0) | (a >= num_nodes))[0])
            raise ValueError(f"{name}[{i}] = {int(a[i])} is not a node id in [0, {num_nodes})")
    key = dst * np.int64(num_nodes) + src
    key = np.unique(key) if dedup else np.sort(key, kind="stable")
    rows = key // num_nodes
    counts = np.bincount(rows, minlength=num_nodes)
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    indices = (key - rows * num_nodes).astype(index_dtype(num_nodes))
    return indptr, indices


def _edge_ids(ids, name: str) -> np.ndarray:
    """``ids`` as an int64 array; TypeError for float, bool or other non-integer ids (an empty
    list, which NumPy reads as float64, is no ids)."""
    if _is_tensor(ids):
        ids = ids.detach().cpu().numpy()
    a = np.asarray(ids)
    if a.dtype.kind not in "iu" and not (a.size == 0 and a.dtype.kind == "f"):
        raise TypeError(f"{name}: need integer node ids, got dtype {a.dtype}")
    return a.astype(np.int64, copy=False)


@dataclass(frozen=True)
class CSRGraph:
    """A directed graph as a CSR of in-neighbours (see module docstring for the id conventions).

    Built from arrays, it checks them (:func:`check_csr`: ValueError; one pass over each) unless
    they are CUDA tensors (checked where a CPU sampler copies them); :func:`gnnio.load` and
    :meth:`from_edges` build it from arrays already checked. Frozen: its arrays cannot be
    reassigned past that check (``dataclasses.replace`` builds a checked new one); the samplers'
    numba kernels trust them."""

    indptr: np.ndarray
    indices: np.ndarray

    def __post_init__(self) -> None:
        ip, ix = cast(Any, self.indptr), cast(Any, self.indices)  # (arrays or torch tensors)
        if _is_tensor(ip) or _is_tensor(ix):
            if ip.device.type != "cpu" or ix.device.type != "cpu":
                return  # (no host sync here: a CPU sampler checks its copy, _init_csr)
            ip, ix = ip.numpy(), ix.numpy()
        check_csr(np.asanyarray(ip), np.asanyarray(ix))  # (asany: keeps a np.memmap)

    @classmethod
    def _trusted(cls, indptr, indices) -> CSRGraph:
        """A graph of arrays gnnio has already checked (a loaded dataset, edges_to_csr's)."""
        g = cls.__new__(cls)
        object.__setattr__(g, "indptr", indptr)
        object.__setattr__(g, "indices", indices)
        return g

    @property
    def num_nodes(self) -> int:
        return int(self.indptr.shape[0]) - 1

    @property
    def num_edges(self) -> int:
        return int(self.indices.shape[0])

    @classmethod
    def from_edges(
        cls, src: np.ndarray, dst: np.ndarray, num_nodes: int, dedup: bool = True
    ) -> CSRGraph:
        return cls._trusted(*edges_to_csr(src, dst, num_nodes, dedup=dedup))

    def in_degrees(self) -> np.ndarray:
        """Number of in-neighbours of each node (int64 [N])."""
        return np.diff(np.asarray(self.indptr))

    def out_degrees(self) -> np.ndarray:
        """Number of out-neighbours of each node (int64 [N])."""
        return np.bincount(np.asarray(self.indices), minlength=self.num_nodes).astype(np.int64)

    def edges(self) -> tuple[np.ndarray, np.ndarray]:
        """``(src, dst)`` int64 arrays of all edges, in CSR order."""
        dst = np.repeat(np.arange(self.num_nodes, dtype=np.int64), self.in_degrees())
        return np.asarray(self.indices, dtype=np.int64), dst

    def reverse(self) -> CSRGraph:
        """The reversed graph: its CSR lists out-neighbours (i.e. this graph's CSC)."""
        src, dst = self.edges()
        return CSRGraph.from_edges(dst, src, self.num_nodes, dedup=False)

    def symmetrize(self, drop_self_loops: bool = False) -> CSRGraph:
        """Undirected version: every edge in both directions, deduplicated."""
        src, dst = self.edges()
        if drop_self_loops:
            keep = src != dst
            src, dst = src[keep], dst[keep]
        return CSRGraph.from_edges(
            np.concatenate([src, dst]), np.concatenate([dst, src]), self.num_nodes
        )

    def induced_subgraph(self, nodes: np.ndarray) -> tuple[CSRGraph, np.ndarray]:
        """Subgraph on ``nodes`` (global ids, order kept: local id i is ``nodes[i]``).

        Returns ``(subgraph, nodes)``; edges whose both ends are in ``nodes`` are kept.
        """
        nodes = np.asarray(nodes, dtype=np.int64)
        if np.unique(nodes).shape[0] != nodes.shape[0]:
            raise ValueError("induced_subgraph: nodes contain duplicates")
        local = np.full(self.num_nodes, -1, dtype=np.int64)
        local[nodes] = np.arange(nodes.shape[0])
        starts = np.asarray(self.indptr)[nodes]
        counts = np.asarray(self.indptr)[nodes + 1] - starts
        dst_local = np.repeat(np.arange(nodes.shape[0], dtype=np.int64), counts)
        # positions of every in-edge of the chosen rows
        offs = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(
            np.cumsum(counts) - counts, counts
        )
        src_global = np.asarray(self.indices)[np.repeat(starts, counts) + offs]
        src_local = local[src_global]
        keep = src_local >= 0
        sub = CSRGraph.from_edges(src_local[keep], dst_local[keep], nodes.shape[0], dedup=False)
        return sub, nodes

    def to_torch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Zero-copy torch views of ``(indptr, indices)``."""
        return _as_tensor(self.indptr), _as_tensor(self.indices)


def _as_tensor(a: np.ndarray) -> torch.Tensor:
    import torch

    a = np.asarray(a)
    if not a.flags.writeable:
        # torch.from_numpy needs a writeable buffer; datasets open memmaps copy-on-write ("c"),
        # which are writeable, so this copy only happens for arrays the caller made read-only.
        a = np.array(a)
    return torch.from_numpy(a)
