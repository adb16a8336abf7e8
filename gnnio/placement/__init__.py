"""Which feature rows live on which GPU: the placement contract, lookup arrays, strategies.

A **placement** assigns every GPU ``i`` a buffer ``B_i``: an int64 array of global node ids; the
row of node ``B_i[k]`` sits at position ``k`` of GPU ``i``'s feature buffer (Song & Jiang §3).
Host memory holds *every* row, at position = node id. A buffer has at most ``BSIZE`` rows (the
per-GPU capacity) and no repeated id; the same node may sit in several buffers (replication).

Reads (Song & Jiang §3.1, Eq. 3): GPU ``i`` reads node ``j`` from its own buffer if ``j`` is in
``B_i``; else from a GPU of its NVLink group holding ``j`` (the lowest-numbered such GPU, so every
node has one deterministic source) when peer reads are enabled and cheaper than host reads; else
from host memory. Each GPU locates rows with two arrays of length ``N`` (the paper's ``dev_num``
and ``buf_pos``): ``dev_num[j]`` is the device to read ``j`` from (-1 = host) and ``buf_pos[j]``
the position in that device's buffer (= ``j`` for the host). Devices and node ids are 0-based here;
the paper numbers GPUs from 1 (its GPU-1 is our device 0).

Strategies (:data:`STRATEGIES`; each a function ``PlacementRequest -> Placement``):

=============== ================================================================================
``rule1``       Song & Jiang Rule 1: every GPU stores the ``BSIZE`` hottest rows (standalone GPUs)
``alg1``        Song & Jiang Algorithm 1 per NVLink group (Rule 2), parameter alpha (Eq. 7)
``interleaved`` Data Tiering (Min et al.) multi-GPU tensor: hottest rows interleaved over a group,
                optionally a replicated hottest part on every GPU
``mod``         BGL (Liu et al.) cache sharded by node id mod the group size, hottest rows first
``naive``       partition into consecutive id ranges; each GPU buffers its part's hottest rows
``random``      random partition, otherwise as ``naive``
``metis``       METIS partition (pymetis) of the symmetrized graph, otherwise as ``naive``
``pagraph``     PaGraph training-node partitioning (quadratic; size cap), local or host reads only
=============== ================================================================================

"Hottest" always means the largest access probability ``probs`` given in the request (e.g.
:func:`gnnio.preprocess.hotness.sj_estimate`). The cost of a placement is modeled by
:mod:`gnnio.placement.costmodel`; :class:`gnnio.features.tiers.multidevice.MultiDeviceFeatureStore`
serves reads through it.
"""

from __future__ import annotations

import importlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UsageError
from ..graph.csr import CSRGraph
from ..placement.topology import Topology
from .validate import PLACEMENT_FORMAT, read_fields

__all__ = [
    "Placement",
    "PlacementRequest",
    "Lookup",
    "STRATEGIES",
    "place",
    "save_placement",
    "load_placement",
    "hottest_order",
]


@dataclass(frozen=True)
class Lookup:
    """One GPU's lookup arrays (Song & Jiang §3.2), indexed by global node id.

    Attributes:
        device: the reading GPU (0-based).
        dev_num: int16 ``[N]``: device to read node ``j`` from; -1 = host memory.
        buf_pos: int32 (int64 when N >= 2^31) ``[N]``: position of ``j`` in that device's buffer;
            for the host, the node id itself.
    """

    device: int
    dev_num: np.ndarray
    buf_pos: np.ndarray

    def tiers(self) -> np.ndarray:
        """int8 ``[N]``: 0 = local, 1 = peer GPU, 2 = host."""
        t = np.full(self.dev_num.shape[0], 1, dtype=np.int8)
        t[self.dev_num == self.device] = 0
        t[self.dev_num < 0] = 2
        return t


@dataclass
class Placement:
    """Per-GPU feature buffers and the rule for reading them.

    Attributes:
        strategy: name of the strategy that made it.
        num_nodes: ``N``; buffers hold global ids in ``[0, N)``.
        groups: NVLink groups (tuples of device indices) within which peer reads are allowed.
        buffers: one int64 array per device; ``buffers[i][k]`` is the node at position ``k`` of
            GPU ``i``'s buffer.
        peer_reads: False when the strategy reads only local or host rows (PaGraph).
        params: the strategy's parameters (JSON-serializable: alpha, replicate, seed, ...).
        prep_s: wall-clock seconds the strategy took (partitioning included; the access
            probabilities are computed before and not included).
        parts: for partitioning strategies, int16 ``[N]`` home device of each node (-1 = none;
            PaGraph: the training nodes' partition, -1 for other nodes); else None. Training
            seeds of GPU ``i`` are the training nodes with ``parts == i`` when a run keeps
            partitions' training nodes local (PaGraph, DistDGL).
    """

    strategy: str
    num_nodes: int
    groups: tuple[tuple[int, ...], ...]
    buffers: list[np.ndarray]
    peer_reads: bool = True
    params: dict[str, Any] = field(default_factory=dict)
    prep_s: float = 0.0
    parts: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.groups = tuple(tuple(int(d) for d in g) for g in self.groups)
        for i, b in enumerate(self.buffers):  # (a float id is never truncated, a mask not read)
            a = np.asarray(b)
            if a.size and a.dtype.kind not in "iu":
                raise ValueError(
                    f"placement {self.strategy!r}: buffer {i} holds {a.dtype}, not ids"
                )
        self.buffers = [np.ascontiguousarray(b, dtype=np.int64) for b in self.buffers]
        n_dev = sum(len(g) for g in self.groups)
        if len(self.buffers) != n_dev:
            raise ValueError(
                f"placement {self.strategy!r}: {len(self.buffers)} buffers for {n_dev} devices"
            )
        self._group_of = {d: g for g in self.groups for d in g}

    @property
    def num_devices(self) -> int:
        return len(self.buffers)

    def peers(self, device: int) -> tuple[int, ...]:
        """Devices ``device`` may read from over NVLink under this placement (ascending)."""
        if not self.peer_reads:
            return ()
        return tuple(d for d in self._group_of[device] if d != device)

    def lookup(self, device: int, peers: bool = True) -> Lookup:
        """The ``dev_num`` / ``buf_pos`` arrays of GPU ``device`` (O(N + sum |B_k|)).

        Args:
            device: the reading GPU.
            peers: allow reads from GPUs of the group (Eq. 3 first case). Pass False when peer
                links are not faster than host reads (Eq. 3 second case: all remote rows from
                host).
        """
        if not 0 <= device < self.num_devices:
            raise IndexError(f"device {device} out of range [0, {self.num_devices})")
        n = self.num_nodes
        dev_num = np.full(n, -1, dtype=np.int16)
        buf_pos = np.arange(n, dtype=np.int32 if n < 2**31 else np.int64)
        sources = list(reversed(self.peers(device))) if peers else []
        for k in [*sources, device]:  # written last wins: local, then the lowest-numbered peer
            b = self.buffers[k]
            dev_num[b] = k
            buf_pos[b] = np.arange(b.shape[0], dtype=buf_pos.dtype)
        return Lookup(device, dev_num, buf_pos)

    def check(self, capacity: int | None = None) -> None:
        """Raise ValueError if a buffer has out-of-range or repeated ids or exceeds ``capacity``."""
        for i, b in enumerate(self.buffers):
            if b.ndim != 1:
                raise ValueError(f"placement {self.strategy!r}: buffer {i} is not 1-D")
            if capacity is not None and b.shape[0] > capacity:
                raise ValueError(
                    f"placement {self.strategy!r}: buffer {i} holds {b.shape[0]} rows > {capacity}"
                )
            if b.size and (int(b.min()) < 0 or int(b.max()) >= self.num_nodes):
                raise ValueError(f"placement {self.strategy!r}: buffer {i} has ids out of range")
            if np.unique(b).shape[0] != b.shape[0]:
                raise ValueError(f"placement {self.strategy!r}: buffer {i} repeats a node")

    def summary(self) -> dict[str, Any]:
        """Rows per buffer, distinct rows on all GPUs, mean copies per stored row."""
        rows = [int(b.shape[0]) for b in self.buffers]
        distinct = int(np.unique(np.concatenate(self.buffers)).shape[0]) if sum(rows) else 0
        return {
            "strategy": self.strategy,
            "rows_per_device": rows,
            "distinct_rows": distinct,
            "copies_per_row": (sum(rows) / distinct) if distinct else 0.0,
            "params": dict(self.params),
            "prep_s": self.prep_s,
        }


@dataclass
class PlacementRequest:
    """Inputs of a placement strategy.

    Attributes:
        probs: float ``[N]`` access probability (or any non-negative weight proportional to it)
            of every node, by global id. Only order and ratios are used.
        topology: the machine (devices and NVLink groups).
        buffer_rows: ``BSIZE``, rows each GPU may hold (>= 0).
        graph: CSR of in-neighbours (``metis``, ``pagraph``).
        train_idx: int64 global ids of the training nodes (``pagraph``).
        num_layers: GNN layers ``L`` (``pagraph``'s L-hop neighbourhoods).
        seed: random seed (``random``).
        alpha: ``alg1``'s threshold (Eq. 7); None = ``topology.alpha`` (= C_gpu / C_cpu).
        replicate: ``interleaved``: fraction of each buffer holding the replicated hottest rows.
        pagraph_max_nodes: ``pagraph`` refuses graphs with more nodes (its cost is quadratic).
        progress: progress bars on long work.
        partition_cache: optional dict the partitioning strategies (``metis``, ``pagraph``) keep
            their partition in, keyed by strategy, GPU count and layers, to reuse it for other
            buffer sizes; a reused partition's original seconds are added to ``prep_s``
            (``params["partition_s"]``), so ``prep_s`` always includes partitioning.
    """

    probs: np.ndarray
    topology: Topology
    buffer_rows: int
    graph: CSRGraph | None = None
    train_idx: np.ndarray | None = None
    num_layers: int = 3
    seed: int = 0
    alpha: float | None = None
    replicate: float = 0.0
    pagraph_max_nodes: int = 200_000
    progress: bool = True
    partition_cache: dict | None = None

    def __post_init__(self) -> None:
        self.probs = np.ascontiguousarray(self.probs, dtype=np.float64)
        if self.probs.ndim != 1:
            raise UsageError(f"probs: need a 1-D array, got shape {self.probs.shape}")
        if self.probs.size and not np.isfinite(self.probs).all():
            raise UsageError("probs: contains NaN or Inf")
        if self.probs.size and float(self.probs.min()) < 0:
            raise UsageError("probs: access probabilities must be >= 0")
        if int(self.buffer_rows) < 0:
            raise UsageError(f"buffer size: must be >= 0 rows, got {self.buffer_rows}")
        self.buffer_rows = int(self.buffer_rows)
        if self.graph is not None and self.graph.num_nodes != self.num_nodes:
            raise UsageError(
                f"graph has {self.graph.num_nodes} nodes but probs has {self.num_nodes} entries"
            )
        if self.alpha is not None and not 0.0 <= float(self.alpha) <= 1.0:
            raise UsageError(f"--alpha: must be in [0, 1], got {self.alpha}")
        if not 0.0 <= float(self.replicate) <= 1.0:
            raise UsageError(f"--replicate: must be in [0, 1], got {self.replicate}")

    @property
    def num_nodes(self) -> int:
        return int(self.probs.shape[0])


def hottest_order(
    probs: np.ndarray, k: int | None = None, among: np.ndarray | None = None
) -> np.ndarray:
    """Node ids sorted by ``probs`` descending, ties by ascending id (int64): the ``V`` of
    Algorithm 1 line 2.

    Args:
        probs: float ``[N]`` by global id.
        k: return only the first ``k`` of the order (O(N + k log k) with a partial sort instead
            of O(N log N)); None = all.
        among: optional int64 ids to rank (a subset of the nodes, e.g. one partition); None = all.
            ValueError unless they are distinct 1-D integer ids in ``[0, N)`` (a bool mask is not
            a list of ids; -1 would rank the last node under an id no node has).
    """
    p = np.asarray(probs, dtype=np.float64)
    if among is None:
        ids, vals = np.arange(p.shape[0], dtype=np.int64), p
    else:
        from ..sampling.threaded import check_seeds

        ids = np.sort(check_seeds(among, p.shape[0], "among"))  # ascending: ties resolve by id
        if (np.diff(ids) == 0).any():
            raise ValueError("among: need distinct node ids")
        vals = p[ids]
    m = ids.shape[0]
    k = m if k is None else max(0, min(int(k), m))
    if k == 0:
        return np.empty(0, dtype=np.int64)
    if k < m:
        # the k-th largest value t; keep all values > t and the lowest ids among those == t
        t = -np.partition(-vals, k - 1)[k - 1]
        gt = np.flatnonzero(vals > t)
        eq = np.flatnonzero(vals == t)[: k - gt.shape[0]]
        sel = np.sort(np.concatenate([gt, eq]))
        ids, vals = ids[sel], vals[sel]
    return ids[np.argsort(-vals, kind="stable")]


#: strategy name -> "module:function" (resolved lazily, so importing the package stays cheap)
STRATEGIES: dict[str, str] = {
    "alg1": "gnnio.placement.alg1:place_alg1",
    "rule1": "gnnio.placement.rule1:place_rule1",
    "interleaved": "gnnio.placement.interleaved:place_interleaved",
    "mod": "gnnio.placement.mod:place_mod",
    "naive": "gnnio.placement.baselines:place_naive",
    "random": "gnnio.placement.baselines:place_random",
    "metis": "gnnio.placement.baselines:place_metis",
    "pagraph": "gnnio.placement.baselines:place_pagraph",
}


def _resolve(name: str) -> Callable[[PlacementRequest], Placement]:
    if name not in STRATEGIES:
        raise UsageError(
            f"unknown placement strategy {name!r}; choose from {', '.join(STRATEGIES)}"
        )
    mod, fn = STRATEGIES[name].split(":")
    return getattr(importlib.import_module(mod), fn)


def place(name: str, request: PlacementRequest) -> Placement:
    """Run strategy ``name`` on ``request``; sets ``prep_s`` to the measured wall-clock time (plus
    the original partitioning seconds when a cached partition was reused)."""
    fn = _resolve(name)
    t0 = time.perf_counter()
    p = fn(request)
    p.prep_s = time.perf_counter() - t0 + float(p.params.get("partition_reused_s", 0.0))
    return p


def save_placement(
    placement: Placement, path: str | os.PathLike, option: str = "placement file"
) -> Path:
    """Write a placement to an ``.npz`` file (no pickled objects; lookups are rebuilt on load),
    atomically under a temporary name of its own (:func:`gnnio.utils.outputs.write_atomic`: never
    over a directory, a device or a dataset's file; a full disk is one line naming ``option``)."""
    from ..utils.outputs import write_atomic

    path = Path(path)
    arrays: dict[str, np.ndarray] = {
        "format": np.array(PLACEMENT_FORMAT),
        "strategy": np.array(placement.strategy),
        "num_nodes": np.array(placement.num_nodes, dtype=np.int64),
        "group_sizes": np.array([len(g) for g in placement.groups], dtype=np.int64),
        "group_devices": np.array([d for g in placement.groups for d in g], dtype=np.int64),
        "peer_reads": np.array(bool(placement.peer_reads)),
        "params_json": np.array(json.dumps(placement.params, sort_keys=True)),
        "prep_s": np.array(float(placement.prep_s)),
    }
    for i, b in enumerate(placement.buffers):
        arrays[f"buffer_{i}"] = b
    if placement.parts is not None:
        arrays["parts"] = np.asarray(placement.parts, dtype=np.int16)
    write_atomic(path, lambda f: np.savez(f, **arrays), option)  # type: ignore[arg-type]  # numpy's stub types savez's 2nd parameter
    return path


def load_placement(path: str | os.PathLike) -> Placement:
    """Read a placement written by :func:`save_placement` (``allow_pickle=False``), every field
    checked (:mod:`gnnio.placement.validate`); :func:`~gnnio.placement.validate.check_for_dataset`
    checks it against a dataset."""
    return Placement(**read_fields(path))
