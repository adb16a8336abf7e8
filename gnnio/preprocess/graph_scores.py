"""Hotness scores computed from the graph alone (and the training nodes): degrees, reverse
PageRank, weighted reverse PageRank, Song & Jiang's L-hop estimate. The score family, the edge
directions and the registry are described in :mod:`gnnio.preprocess.hotness`.

Linear algebra. With ``M`` the ``N x N`` 0/1 matrix of the CSR (``M[v, u] = 1`` iff ``u -> v``),
every propagation below is ``y = M^T x``, i.e. ``y[u] = sum over edges u -> v of x[v]``: each node
collects from the nodes that aggregate from it. :func:`propagate` computes it in one pass over the
CSR (numba, O(N + E), no extra copy of the edges).

Within a memory budget (``chunk_bytes``, issue 25 item 1; :func:`gnnio.preprocess.hotness.compute_score`
turns ``--memory-budget`` into it): every pass over the edges runs in consecutive ranges of rows
whose pages of ``indices`` are dropped after each range (:func:`gnnio.utils.pages.drop_pages`). The
ranges are visited in order and each edge adds to its sum in the same order as in one pass, so
the scores are the same numbers, bit for bit; the per-node arrays (:data:`FIXED_BYTES_PER_NODE`)
stay in RAM.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit

from ..errors import DatasetError, UsageError
from ..graph.csr import CSRGraph, check_graph
from ..utils.pages import drop_pages
from ..utils.progress import bar
from .budget import edge_ranges, row_ranges

__all__ = [
    "DEFAULT_DAMPING",
    "FIXED_BYTES_PER_NODE",
    "degree",
    "in_degree",
    "out_degree",
    "propagate",
    "reverse_pagerank",
    "sj_estimate",
    "weighted_reverse_pagerank",
]

#: damping factor d. Data Tiering leaves its value unstated ("damp d" is an input of Algorithm 1);
#: we use the customary PageRank value (Brin & Page), also the default of DGL's PageRank example.
DEFAULT_DAMPING = 0.85

#: bytes per node a score holds in RAM besides its chunks (``indptr``, the degrees, the score
#: vectors and their temporaries), what ``--memory-budget`` counts as fixed
FIXED_BYTES_PER_NODE = {
    "degree": 16, "out_degree": 16, "in_degree": 24, "rpr": 64, "wrpr": 64, "sj": 72,
    "sj_fanout": 72,
}  # fmt: skip

#: graphs with at least this many edges show progress bars (when ``progress=True``)
_PROGRESS_MIN_EDGES = 1 << 20


def _show(graph: CSRGraph, progress: bool) -> bool:
    return bool(progress) and graph.num_edges >= _PROGRESS_MIN_EDGES


# --------------------------------------------------------------------------------------------
# kernels


@njit(cache=True, nogil=True)
def _propagate_rows(indptr, indices, x, out, a, b):
    """``out[u] += x[v]`` for every edge of the CSR rows ``v`` in ``[a, b)`` (serial scatter)."""
    for v in range(a, b):
        xv = x[v]
        if xv == 0.0:
            continue
        for e in range(indptr[v], indptr[v + 1]):
            out[indices[e]] += xv


@njit(cache=True, nogil=True)
def _count_values(indices, s, e, counts):
    """``counts[indices[k]] += 1`` for ``k`` in ``[s, e)``."""
    for k in range(s, e):
        counts[indices[k]] += 1


def propagate(
    graph: CSRGraph,
    x: np.ndarray,
    out: np.ndarray | None = None,
    chunk_bytes: int | None = None,
) -> np.ndarray:
    """``M^T x``: for every node ``u``, the sum of ``x[v]`` over its out-edges ``u -> v``.

    Args:
        graph: CSR of in-neighbours (row ``v`` lists the ``u`` with ``u -> v``).
        x: float64 ``[N]`` values on the aggregating (destination) nodes, global ids.
        out: optional float64 ``[N]`` buffer to write into.
        chunk_bytes: walk the edges in ranges of rows making at most this many bytes of
            ``indices`` resident, dropped after each (module docstring); the same sums.

    Returns:
        float64 ``[N]`` indexed by global id. One pass over the edges, O(N + E).
    """
    check_graph(graph)  # (the kernel adds at every index unchecked)
    n = int(np.shape(graph.indptr)[0]) - 1
    x = np.ascontiguousarray(x, dtype=np.float64)
    if x.shape != (n,):
        raise ValueError(f"propagate: x must have shape ({n},), got {x.shape}")
    if out is None:
        out = np.empty(n, dtype=np.float64)
    elif not isinstance(out, np.ndarray) or out.shape != (n,) or out.dtype != np.float64:
        # (the kernel adds into out[u] for every node id u unchecked: past a shorter buffer)
        got = f"{out.dtype} {out.shape}" if isinstance(out, np.ndarray) else type(out).__name__
        raise ValueError(f"propagate: out must be a float64 array of shape ({n},), got {got}")
    out[:] = 0.0
    indptr, indices = np.asarray(graph.indptr), np.asarray(graph.indices)
    if chunk_bytes is None:
        _propagate_rows(indptr, indices, x, out, 0, n)
        return out
    for a, b in row_ranges(indptr, chunk_bytes, indices.dtype.itemsize):
        _propagate_rows(indptr, indices, x, out, a, b)
        drop_pages(graph.indices, int(indptr[a]), int(indptr[b]))
    return out


# --------------------------------------------------------------------------------------------
# degree scores


def out_degree(
    graph: CSRGraph, progress: bool = True, chunk_bytes: int | None = None
) -> np.ndarray:
    """Paper out-degree of every node: how many nodes aggregate from it (float64 ``[N]``).

    This is Data Tiering's first score ("a node with a high out degree has a higher cumulative
    chance of being selected"), = :meth:`CSRGraph.out_degrees` in gnnio's direction terms.
    ``chunk_bytes``: count in ranges of edges, each dropped after it (the same counts).
    """
    del progress  # one bincount: nothing to show
    if chunk_bytes is None:
        return graph.out_degrees().astype(np.float64)
    indices = np.asarray(graph.indices)
    counts = np.zeros(graph.num_nodes, dtype=np.int64)
    for s, e in edge_ranges(indices.shape[0], chunk_bytes, indices.dtype.itemsize):
        _count_values(indices, s, e, counts)
        drop_pages(graph.indices, s, e)
    return counts.astype(np.float64)


#: the paper's "degree" score
degree = out_degree


def in_degree(graph: CSRGraph, progress: bool = True, chunk_bytes: int | None = None) -> np.ndarray:
    """Row length of every node: how many in-neighbours it aggregates from (float64 ``[N]``).
    It reads ``indptr`` only, which the budget counts whole (``chunk_bytes`` is not needed)."""
    del progress, chunk_bytes
    return graph.in_degrees().astype(np.float64)


# --------------------------------------------------------------------------------------------
# reverse PageRank


def _check_damping(damping: float) -> float:
    d = float(damping)
    if not 0.0 <= d <= 1.0:
        raise UsageError(f"damping: must be in [0, 1], got {damping}")
    return d


def _rpr_iterate(
    graph: CSRGraph,
    r: np.ndarray,
    iterations: int,
    damping: float,
    tol: float | None,
    progress: bool,
    desc: str,
    chunk_bytes: int | None = None,
) -> np.ndarray:
    """Run the reverse-PageRank update ``iterations`` times from the scores ``r`` (see
    :func:`reverse_pagerank`); stop early when the L1 change drops below ``tol``."""
    if iterations < 0:
        raise UsageError(f"iterations: must be >= 0, got {iterations}")
    d = _check_damping(damping)
    n = graph.num_nodes
    indeg = graph.in_degrees().astype(np.float64)
    inv = np.zeros(n, dtype=np.float64)
    np.divide(1.0, indeg, out=inv, where=indeg > 0)
    share = np.empty(n, dtype=np.float64)
    nxt = np.empty(n, dtype=np.float64)
    teleport = (1.0 - d) / n if n else 0.0
    with bar(iterations, desc=desc, unit="iter", enabled=_show(graph, progress)) as pb:
        for _ in range(iterations):
            np.multiply(r, inv, out=share)  # a node's score divided by ITS in-degree
            propagate(
                graph, share, out=nxt, chunk_bytes=chunk_bytes
            )  # ... summed over the nodes it targets
            nxt *= d
            nxt += teleport
            delta = float(np.abs(nxt - r).sum()) if tol is not None else None
            r, nxt = nxt, r
            pb.update(1)
            if delta is not None and tol is not None and delta < tol:
                break
    return r


def reverse_pagerank(
    graph: CSRGraph,
    iterations: int = 20,
    damping: float = DEFAULT_DAMPING,
    tol: float | None = None,
    progress: bool = True,
    chunk_bytes: int | None = None,
) -> np.ndarray:
    """Reverse PageRank (Bar-Yossef & Mashiach 2008), as Data Tiering §3.1 / Fig. 2 describe it.

    PageRank on the reversed graph: a node's score is the sum, over the nodes it targets (the nodes
    that aggregate from it), of their scores each divided by *their* in-degree, damped, plus a
    uniform teleport term. With ``N`` nodes, damping ``d`` and ``indeg(v)`` = paper in-degree
    (row length in gnnio's CSR)::

        r_0(u)     = 1 / N
        r_{t+1}(u) = (1 - d) / N + d * sum_{v : u -> v} r_t(v) / indeg(v)

    i.e. ``r_{t+1} = (1 - d)/N + d * M^T (r_t / indeg)``. "If node A has a high in degree ... we
    divide the score of node A by the in degree before propagating it to the other nodes" (the nodes
    targeting A). Nodes of in-degree 0 target nobody's in-list, so nothing is divided by zero; their
    mass is not redistributed (as in DGL's PageRank example, which the paper's DGL-based
    implementation follows), so the scores need not sum to 1 -- only their order is used.

    Args:
        graph: CSR of in-neighbours.
        iterations: number of updates (fixed; the paper runs "until the scores converge").
        damping: ``d`` in [0, 1].
        tol: optional early stop when ``||r_{t+1} - r_t||_1 < tol``.
        progress: progress bar (on graphs with >= 2^20 edges).
        chunk_bytes: walk the edges in chunks of at most this many resident bytes (module
            docstring); the same scores, bit for bit.

    Returns:
        float64 ``[N]`` scores by global id.
    """
    n = graph.num_nodes
    r = np.full(n, 1.0 / n if n else 0.0, dtype=np.float64)
    return _rpr_iterate(
        graph, r, iterations, damping, tol, progress, "reverse pagerank", chunk_bytes
    )


def _check_train_idx(train_idx: np.ndarray | None, n: int) -> np.ndarray:
    if train_idx is None:
        raise DatasetError("train_idx: this score needs the training nodes, the dataset has none")
    t = np.asarray(train_idx)
    if t.ndim != 1 or (t.size and not np.issubdtype(t.dtype, np.integer)):
        raise UsageError(
            f"train_idx: need a 1-D array of integer node ids, got {t.dtype} {t.shape}"
        )
    if t.size == 0:
        raise DatasetError("train_idx: is empty; this score needs at least one training node")
    t = t.astype(np.int64, copy=False)
    lo, hi = int(t.min()), int(t.max())
    if lo < 0 or hi >= n:
        raise UsageError(f"train_idx: node id {lo if lo < 0 else hi} out of range [0, {n})")
    return t


def weighted_reverse_pagerank(
    graph: CSRGraph,
    train_idx: np.ndarray,
    iterations: int = 5,
    damping: float = DEFAULT_DAMPING,
    progress: bool = True,
    chunk_bytes: int | None = None,
) -> np.ndarray:
    """Weighted reverse PageRank: Data Tiering Algorithm 1.

    Reverse PageRank (see :func:`reverse_pagerank`) whose *initial* scores favour the labeled
    (training) nodes, the only possible start points of sampling::

        weight    = N / |train_idx|                    (Alg. 1 line 8)
        r_0(u)    = 1/N * (weight if u in train_idx else 1)   (lines 4-7, 9-11)
        r_{t+1}   = (1 - d)/N + d * M^T (r_t / indeg)  (the reverse-PageRank update)

    run for a small fixed number of iterations (5 in the paper) on purpose: "by running pagerank
    long enough, the initial impact of the initial scores wear down", so it is *not* run to
    convergence. A training node listed twice is weighted once.

    Args:
        graph: CSR of in-neighbours.
        train_idx: int global ids of the training (labeled) nodes; must be non-empty.
        iterations: number of updates (paper: 5).
        damping: ``d`` (paper: unstated; :data:`DEFAULT_DAMPING`).
        progress: progress bar (on graphs with >= 2^20 edges).
        chunk_bytes: walk the edges in chunks of at most this many resident bytes (module
            docstring); the same scores, bit for bit.

    Returns:
        float64 ``[N]`` scores by global id.
    """
    n = graph.num_nodes
    t = np.unique(_check_train_idx(train_idx, n))
    weight = n / t.size
    r = np.full(n, 1.0 / n, dtype=np.float64)
    r[t] *= weight
    desc = "weighted reverse pagerank"
    return _rpr_iterate(graph, r, iterations, damping, None, progress, desc, chunk_bytes)


# --------------------------------------------------------------------------------------------
# Song & Jiang's L-hop estimate


def sj_estimate(
    graph: CSRGraph,
    train_idx: np.ndarray,
    num_layers: int = 3,
    fanouts: Sequence[int] | None = None,
    progress: bool = True,
    chunk_bytes: int | None = None,
) -> np.ndarray:
    """Song & Jiang (ICS '22) §3.2: sampling probability from L-hop training-node counts, by SpMV.

    The paper: "the access frequency of a node is the number of training nodes in its L-hop
    neighbors ... We use f / N_t as an estimation of the sampling probability", computed "as sparse
    matrix-vector multiplication". A node ``u`` is in the L-hop neighbourhood of a training node
    ``t`` when a path ``u -> ... -> t`` of at most ``L`` edges exists (``t`` aggregates from ``u``
    through L layers). With ``1_T`` the indicator of the training nodes and ``M^T`` as in the module
    docstring (``I`` keeps a node in its own neighbourhood, the self-loop of a GCN layer)::

        h_0 = 1_T
        h_l = h_{l-1} + M^T h_{l-1}        (l = 1..L)
        p   = h_L / N_t

    ``h_L = (I + M^T)^L 1_T``: ``h_L[u]`` counts the *lazy walks* of L steps (each step an edge or
    a stay) from ``u`` to training nodes, i.e. the walks of ``k <= L`` edges each ``C(L, k)``
    times -- the SpMV form of the paper's count. It is at least the number of distinct training
    nodes within L hops (each has a walk of at most L edges) and in general larger, even on a
    tree (an edge ``u -> t``, L = 2: 2 lazy walks for 1 node); on the paper's 6-node example ``f = [4, 6, 6, 6, 5, 5]`` becomes ``[6, 14, 16, 12, 7, 7]``, with the
    same ranking.

    With ``fanouts`` (uniform node-wise sampling, ``fanouts[0]`` = hop 1, as in
    :class:`gnnio.sampling.UniformSampler`) every edge ``u -> v`` at hop ``l`` is weighted by the
    probability ``min(1, k_l / indeg(v))`` that the sampler takes it, giving the expected number of
    times ``u`` is sampled in one epoch (each training node is a seed once)::

        e_0 = 1_T
        e_l = M^T (e_{l-1} * min(1, k_l / indeg))   (k_l = fanouts[l-1]; -1 = all neighbours)
        p   = (e_0 + e_1 + ... + e_L) / N_t

    A node reached twice in a batch is counted twice here but read once by the sampler; the two
    differ by a monotone factor for nodes reached from many batches, so the ranking is close.

    Args:
        graph: CSR of in-neighbours.
        train_idx: int global ids of the training nodes (non-empty).
        num_layers: ``L`` (used when ``fanouts`` is None).
        fanouts: per-hop fanouts; when given, ``L = len(fanouts)`` and the weighted form is used.
        progress: progress bar (on graphs with >= 2^20 edges).
        chunk_bytes: walk the edges in chunks of at most this many resident bytes (module
            docstring); the same scores, bit for bit.

    Returns:
        float64 ``[N]`` estimated sampling probability per epoch, by global id.
    """
    n = graph.num_nodes
    t = np.unique(_check_train_idx(train_idx, n))
    h = np.zeros(n, dtype=np.float64)
    h[t] = 1.0
    nxt = np.empty(n, dtype=np.float64)
    if fanouts is None:
        if num_layers < 0:
            raise UsageError(f"num_layers: must be >= 0, got {num_layers}")
        with bar(num_layers, desc="sj estimate", unit="hop", enabled=_show(graph, progress)) as pb:
            for _ in range(num_layers):
                propagate(graph, h, out=nxt, chunk_bytes=chunk_bytes)
                h += nxt
                pb.update(1)
        return h / t.size
    ks = [int(k) for k in fanouts]
    if any(k < -1 for k in ks):
        raise UsageError(f"fanouts: each must be >= 0 or -1 (all neighbours), got {ks}")
    indeg = graph.in_degrees().astype(np.float64)
    total = h.copy()
    take = np.empty(n, dtype=np.float64)
    with bar(len(ks), desc="sj estimate", unit="hop", enabled=_show(graph, progress)) as pb:
        for k in ks:
            if k < 0:
                take[:] = 1.0
            else:
                take[:] = 0.0
                np.divide(float(k), indeg, out=take, where=indeg > 0)
                np.minimum(take, 1.0, out=take)
            propagate(graph, h * take, out=nxt, chunk_bytes=chunk_bytes)
            h, nxt = nxt, h
            total += h
            pb.update(1)
    return total / t.size
