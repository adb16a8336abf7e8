"""Partitioning baselines of Song & Jiang §5.1: NAIVE, RAND, METIS and PaGraph.

Each splits the nodes into one part per GPU (over *all* GPUs of the machine, as the paper divides
the graph "into four parts" for four GPUs) and then, as PaGraph does for graphs larger than GPU
memory, each GPU buffers the ``BSIZE`` most frequently accessed nodes of its own part (largest
``probs``, the same estimate every strategy gets). A GPU reads a row from its buffer, else from a
GPU of its NVLink group holding it, else from host memory -- except PaGraph, which "does not use the
interconnection among GPUs": local or host only.

* ``naive``: consecutive id ranges of ``ceil(N / n)`` nodes.
* ``random``: a random permutation (``seed``) cut into ``naive`` ranges.
* ``metis``: METIS k-way partition (pymetis) of the symmetrized graph without self loops, equal node
  counts as METIS' balance target. The symmetrization is part of the measured time.
* ``pagraph``: PaGraph's training-node partitioning (Lin et al., SoCC '20): training nodes are
  visited in id order; node ``v`` joins the part ``i`` maximizing
  ``|TV_i ∩ IN(v)| * (TV_avg - |TV_i|) / |PV_i|``, where ``IN(v)`` is the full ``L``-hop
  in-neighbourhood of ``v`` (itself included), ``TV_i`` the training nodes already in part ``i``,
  ``TV_avg = N_t / n`` and ``PV_i`` the nodes of part ``i`` so far (ties, e.g. the first visit:
  fewest training nodes, then lowest index); then ``IN(v)`` joins ``PV_i`` (parts overlap: a node
  may sit in several). Each GPU buffers the hottest ``BSIZE`` nodes of its ``PV_i``. The cost is
  ``sum_v |IN(v)|``, up to ``N_t * E`` -- quadratic on graphs whose ``L``-hop neighbourhoods cover
  much of the graph -- so graphs with more than ``PlacementRequest.pagraph_max_nodes`` nodes
  (default 200,000) are refused with a :class:`~gnnio.errors.UsageError`; the paper itself could not
  partition ogbn-products (2.4M nodes) into 8 parts within five hours.
"""

from __future__ import annotations

import time

import numpy as np
from numba import njit

from ..errors import DatasetError, UsageError
from ..preprocess.partition.methods import metis_parts
from ..utils.progress import bar
from . import Placement, PlacementRequest, hottest_order

__all__ = [
    "place_naive",
    "place_random",
    "place_metis",
    "place_pagraph",
    "buffers_from_parts",
    "metis_parts",
    "pagraph_partition",
]


def buffers_from_parts(parts: np.ndarray, probs: np.ndarray, n_dev: int, bsize: int) -> list:
    """For each device ``d``: the ``bsize`` nodes with ``parts == d`` of largest ``probs``."""
    parts = np.asarray(parts)
    return [hottest_order(probs, k=bsize, among=np.flatnonzero(parts == d)) for d in range(n_dev)]


def _partition_placement(
    name: str, req: PlacementRequest, parts: np.ndarray, **params
) -> Placement:
    topo = req.topology
    return Placement(
        strategy=name,
        num_nodes=req.num_nodes,
        groups=topo.groups,
        buffers=buffers_from_parts(parts, req.probs, topo.num_gpus, req.buffer_rows),
        peer_reads=topo.peers_cheaper,
        params=params,
        parts=parts.astype(np.int16),
    )


def place_naive(req: PlacementRequest) -> Placement:
    """NAIVE: part ``d`` = ids ``[d * ceil(N/n), (d + 1) * ceil(N/n))``."""
    n, k = req.num_nodes, req.topology.num_gpus
    size = max(1, -(-n // k))
    parts = (np.arange(n, dtype=np.int64) // size).astype(np.int16)
    return _partition_placement("naive", req, parts)


def place_random(req: PlacementRequest) -> Placement:
    """RAND: a seeded random permutation, cut into NAIVE ranges."""
    n, k = req.num_nodes, req.topology.num_gpus
    size = max(1, -(-n // k))
    perm = np.random.default_rng(req.seed).permutation(n)
    parts = np.empty(n, dtype=np.int16)
    parts[perm] = (np.arange(n, dtype=np.int64) // size).astype(np.int16)
    return _partition_placement("random", req, parts, seed=int(req.seed))


def _cached(req: PlacementRequest, key: tuple, compute):
    """``compute()`` or its cached value; returns ``(value, seconds, reused)``."""
    cache = req.partition_cache
    if cache is not None and key in cache:
        value, secs = cache[key]
        return value, secs, True
    t0 = time.perf_counter()
    value = compute()
    secs = time.perf_counter() - t0
    if cache is not None:
        cache[key] = (value, secs)
    return value, secs, False


def place_metis(req: PlacementRequest) -> Placement:
    """METIS: one part per GPU (pymetis), each GPU buffers its part's hottest rows."""
    if req.graph is None:
        raise UsageError("strategy 'metis' needs the graph")
    k = req.topology.num_gpus
    parts, secs, reused = _cached(req, ("metis", k), lambda: metis_parts(req.graph, k))
    extra = {"partition_reused_s": secs} if reused else {}
    return _partition_placement("metis", req, parts, partition_s=secs, **extra)


@njit(cache=True)
def _pagraph_chunk(
    indptr,
    indices,
    train,
    start,
    stop,
    L,
    is_train,
    tv_part,
    tv_count,
    pv_count,
    member,
    stamp,
    frontier,
    nxt,
    hood,
    tv_avg,
):  # pragma: no cover - compiled
    """Assign training nodes ``train[start:stop]`` (state arrays updated in place)."""
    K = tv_count.shape[0]
    cnt = np.zeros(K, dtype=np.int64)
    for t in range(start, stop):
        v = train[t]
        mark = t + 1
        # full L-hop in-neighbourhood of v (v included), BFS over in-neighbour lists
        stamp[v] = mark
        hood[0] = v
        nh = 1
        frontier[0] = v
        nf = 1
        for _ in range(L):
            nn = 0
            for a in range(nf):
                u = frontier[a]
                for e in range(indptr[u], indptr[u + 1]):
                    w = indices[e]
                    if stamp[w] != mark:
                        stamp[w] = mark
                        hood[nh] = w
                        nh += 1
                        nxt[nn] = w
                        nn += 1
            for a in range(nn):
                frontier[a] = nxt[a]
            nf = nn
            if nf == 0:
                break
        for k in range(K):
            cnt[k] = 0
        for a in range(nh):
            u = hood[a]
            if is_train[u] and tv_part[u] >= 0:
                cnt[tv_part[u]] += 1
        best = 0
        best_score = -1e300
        for k in range(K):
            s = cnt[k] * (tv_avg - tv_count[k]) / max(pv_count[k], 1)
            if s > best_score or (s == best_score and tv_count[k] < tv_count[best]):
                best_score = s
                best = k
        tv_part[v] = best
        tv_count[best] += 1
        for a in range(nh):
            u = hood[a]
            if member[best, u] == 0:
                member[best, u] = 1
                pv_count[best] += 1


def pagraph_partition(
    graph, train_idx: np.ndarray, nparts: int, num_layers: int, progress: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """PaGraph's partitioning (see module docstring).

    Returns:
        ``(tv_part, member)``: int16 ``[N]`` part of each training node (-1 for other nodes) and
        uint8 ``[nparts, N]`` membership of every node in every part's ``PV_i``.
    """
    n = graph.num_nodes
    train = np.unique(np.asarray(train_idx, dtype=np.int64))
    if train.size == 0:
        raise DatasetError("strategy 'pagraph' needs training nodes; the dataset has none")
    indptr = np.asarray(graph.indptr, dtype=np.int64)
    indices = np.asarray(graph.indices)
    is_train = np.zeros(n, dtype=np.bool_)
    is_train[train] = True
    tv_part = np.full(n, -1, dtype=np.int64)
    tv_count = np.zeros(nparts, dtype=np.int64)
    pv_count = np.zeros(nparts, dtype=np.int64)
    member = np.zeros((nparts, n), dtype=np.uint8)
    stamp = np.zeros(n, dtype=np.int64)
    frontier = np.empty(n, dtype=np.int64)
    nxt = np.empty(n, dtype=np.int64)
    hood = np.empty(n, dtype=np.int64)
    tv_avg = train.size / nparts
    step = 256
    with bar(train.size, desc="pagraph partition", unit="train node", enabled=progress) as pb:
        for s in range(0, train.size, step):
            e = min(train.size, s + step)
            _pagraph_chunk(
                indptr,
                indices,
                train,
                s,
                e,
                int(num_layers),
                is_train,
                tv_part,
                tv_count,
                pv_count,
                member,
                stamp,
                frontier,
                nxt,
                hood,
                float(tv_avg),
            )
            pb.update(e - s)
    return tv_part.astype(np.int16), member


def place_pagraph(req: PlacementRequest) -> Placement:
    """PaGraph: training-node partitioning, hottest ``BSIZE`` of each part's L-hop closure on its
    GPU, no peer reads. Refuses graphs above ``req.pagraph_max_nodes`` nodes (quadratic cost)."""
    if req.graph is None or req.train_idx is None:
        raise UsageError("strategy 'pagraph' needs the graph and the training nodes")
    if req.num_nodes > req.pagraph_max_nodes:
        raise UsageError(
            f"strategy 'pagraph': {req.num_nodes:,} nodes is above its cap of "
            f"{req.pagraph_max_nodes:,} (its partitioning is quadratic); raise --pagraph-max-nodes"
        )
    k = req.topology.num_gpus
    (tv_part, member), secs, reused = _cached(
        req,
        ("pagraph", k, int(req.num_layers)),
        lambda: pagraph_partition(req.graph, req.train_idx, k, req.num_layers, req.progress),
    )
    buffers = [
        hottest_order(req.probs, k=req.buffer_rows, among=np.flatnonzero(member[d]))
        for d in range(k)
    ]
    return Placement(
        strategy="pagraph",
        num_nodes=req.num_nodes,
        groups=req.topology.groups,
        buffers=buffers,
        peer_reads=False,
        params={
            "num_layers": int(req.num_layers),
            "part_rows": [int(x) for x in member.sum(axis=1)],
            "partition_s": secs,
            **({"partition_reused_s": secs} if reused else {}),
        },
        parts=tv_part,
    )
