"""Neighbour sampling with PyG's semantics: each hop expands only the nodes new at the hop before.

:class:`~gnnio.sampling.uniform.UniformSampler` follows GraphSAGE and DGL: hop ``h + 1`` samples
afresh for *every* node reached so far (the seeds and hops ``1..h``), and each GNN layer has its
own block. PyG's ``NeighborLoader`` (pyg-lib's ``neighbor_sample``) instead expands only the
*frontier*: hop ``h + 1`` samples neighbours of the nodes first reached at hop ``h`` (hop 1: of the
seeds), and every sampled edge goes into one edge list, hop by hop. A model then runs layer ``i``
(0-based, ``L`` layers) on the edges of hops ``1..L-i``: this is what ``trim_to_layer`` with
``num_sampled_nodes`` / ``num_sampled_edges`` computes. :class:`FrontierSampler` samples that way,
so its batches are the ones ``NeighborLoader`` yields for the same seeds and fanouts, up to the
random draws:

* ``input_nodes`` (PyG's ``n_id``): the seeds, then the nodes new at hop 1 in order of first
  appearance in hop 1's edges, then those of hop 2, ...; ``meta["hop_nodes"]`` is
  ``[n_0, n_1, ...]``, the size of ``input_nodes`` after each hop (PyG's ``num_sampled_nodes`` are
  its differences);
* edges of a hop are grouped by the expanded (destination) node in local-id order, each node's
  neighbours in sampling order (all of them in CSR order when ``deg <= fanout`` or ``fanout = -1``,
  exactly as pyg-lib); ``meta["hop_edges"]`` lists the edges per hop (PyG's
  ``num_sampled_edges``) and ``meta["edge_pos"]`` (int64 ``[E]``) each edge's position in the CSR,
  i.e. PyG's ``e_id`` when the CSR is PyG's CSC (gnnio's CSR of in-neighbours is);
* ``blocks[i]`` (input layer first) holds the edges of hops ``1..L-i``: ``dst`` nodes
  ``input_nodes[:n_{L-i-1}]``, ``src`` nodes ``input_nodes[:n_{L-i}]``, and ``edge_index`` a prefix
  view of one ``[2, E]`` array (``blocks[0]`` is the whole batch). So gnnio's block models compute
  on these batches exactly what a PyG model with ``trim_to_layer`` computes.

Draws: a node with ``deg > fanout`` takes ``fanout`` distinct CSR positions (Floyd's algorithm) from
the counter-based stream keyed by ``(seed, call key, hop, node id)`` that
:class:`~gnnio.sampling.uniform.UniformSampler` uses, so hop 1 draws the same neighbours as
``UniformSampler`` with the same seed and ``epoch_seed``; pyg-lib's own random numbers are not
reproduced. ``replace=True`` draws with replacement (PyG's ``replace``); no temporal or weighted
sampling (PyG's ``time_attr``, ``weight_attr``); disjoint subgraphs are
:class:`gnnio.pyg.disjoint.DisjointSampler`, one call per seed.

Cost: one serial numba pass per hop over the frontier (pyg-lib is serial per batch too); a
loader runs several batches at once with ``num_workers``. Each concurrent call holds a dense
``[num_nodes]`` global -> local map (4 bytes per node) from a small pool; only the entries a call
set are cleared afterwards.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from numba import njit

from ..graph.csr import CSRGraph
from ._kernels import (
    _GAMMA,
    _LINEAR_MAX_K,
    _floyd_hashed,
    _floyd_linear,
    mix64,
    relabel_into,
    reset_range,
)
from .base import Block, MiniBatch
from .threaded import ThreadedCPUSampler, _hop_key, check_seeds

__all__ = ["FrontierSampler"]


@njit(cache=True, nogil=True)
def _sample_frontier(indptr, indices, nodes, lo, hi, fanout, hop_key, loc, base, replace):
    """Sample the rows ``nodes[lo:hi]`` (local ids ``lo..hi-1``) of one hop.

    Returns ``(src, dst, pos, new)``: per edge the neighbour's local id, the expanded node's local
    id and the edge's CSR position; ``new`` the global ids first seen in this hop (numbered
    ``base, base + 1, ...`` in ``loc``, in order of first appearance). With ``replace`` a node
    with ``d > 0`` neighbours takes ``fanout`` independent uniform draws (pyg-lib's rule: also
    when ``d <= fanout``); ``fanout < 0`` still takes every neighbour once.
    """
    n = hi - lo
    offs = np.empty(n + 1, dtype=np.int64)
    offs[0] = 0
    for r in range(n):
        v = nodes[lo + r]
        d = indptr[v + 1] - indptr[v]
        if replace and fanout >= 0:
            offs[r + 1] = offs[r] + (fanout if d > 0 else 0)
        else:
            offs[r + 1] = offs[r] + (d if (fanout < 0 or d <= fanout) else fanout)
    e = offs[n]
    pos = np.empty(e, dtype=np.int64)
    dst = np.empty(e, dtype=np.int64)
    for r in range(n):
        v = nodes[lo + r]
        start = indptr[v]
        d = indptr[v + 1] - start
        o = offs[r]
        k = offs[r + 1] - o
        for q in range(o, o + k):
            dst[q] = lo + r
        if replace and fanout >= 0 and k > 0:
            state = mix64(hop_key ^ (np.uint64(v) * _GAMMA))
            for q in range(o, o + k):
                state = mix64(state + _GAMMA)
                pos[q] = start + np.int64(state % np.uint64(d))
        elif k == d:
            for q in range(k):
                pos[o + q] = start + q
        elif k > 0:
            state = mix64(hop_key ^ (np.uint64(v) * _GAMMA))
            if k <= _LINEAR_MAX_K:
                _floyd_linear(pos, o, d, k, state)
            else:
                _floyd_hashed(pos, o, d, k, state)
            for q in range(o, o + k):
                pos[q] += start
    src = np.empty(e, dtype=np.int64)
    for q in range(e):
        src[q] = indices[pos[q]]
    new = np.empty(e, dtype=np.int64)
    cnt = relabel_into(src, loc, base, new)  # global -> local ids, new nodes in first-seen order
    return src, dst, pos, new[:cnt].copy()


@njit(cache=True, nogil=True)
def _insert_seeds(seeds, loc):
    """``loc[seeds[i]] = i``; returns -1, or the index of the first repeated seed."""
    for i in range(seeds.shape[0]):
        g = seeds[i]
        if loc[g] >= 0:
            return i
        loc[g] = i
    return -1


class FrontierSampler(ThreadedCPUSampler):
    """PyG ``NeighborLoader`` sampling: hop ``h + 1`` expands only hop ``h``'s new nodes (see the
    module docstring for the batch layout).

    Args:
        graph: CSR of in-neighbours (NumPy arrays, memmaps or CPU tensors).
        fanouts: neighbours per expanded node for hop 1, 2, ... (PyG's ``num_neighbors``;
            ``-1`` = all, ``0`` = none).
        seed: base random seed.
        replace: draw neighbours with replacement (PyG's ``replace=True``): ``fanout``
            independent uniform draws per expanded node with at least one neighbour, so an edge
            may repeat; ``-1`` still takes every neighbour once.

    :meth:`sample` is thread-safe (each call takes its own id map from a pool).
    """

    def __init__(
        self, graph: CSRGraph, fanouts: Sequence[int], seed: int = 0, replace: bool = False
    ):
        self._init_threads(fanouts, seed, 1)
        self._init_csr(graph)
        self.replace = bool(replace)

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def sample(self, seeds, epoch_seed: int | None = None) -> MiniBatch:
        """Sample ``len(fanouts)`` hops around ``seeds`` (distinct int64 global ids).

        ``epoch_seed`` as in :meth:`gnnio.sampling.UniformSampler.sample`: when given the batch
        depends only on ``(seed, epoch_seed, seeds)``. Raises ValueError for invalid or repeated
        seeds.
        """
        key = self._next_key(epoch_seed)
        seeds = check_seeds(seeds, self.num_nodes)
        loc = self._take_loc()
        dup = int(_insert_seeds(seeds, loc))
        if dup >= 0:
            reset_range(seeds, 0, dup, loc)
            self._give_loc(loc)
            raise ValueError(
                f"seeds: node id {int(seeds[dup])} appears more than once; seeds must be distinct"
            )
        # (if a hop raises, ``loc`` still holds entries and is dropped rather than pooled)
        parts, srcs, dsts, poss = [seeds], [], [], []
        hop_nodes = [int(seeds.shape[0])]
        nodes, lo = seeds, 0
        for h, fanout in enumerate(self.fanouts):
            hi = hop_nodes[-1]
            src, dst, pos, new = _sample_frontier(
                self.indptr, self.indices, nodes, lo, hi, np.int64(fanout), _hop_key(key, h),
                loc, np.int64(hi), self.replace,
            )  # fmt: skip
            srcs.append(src)
            dsts.append(dst)
            poss.append(pos)
            parts.append(new)
            if new.shape[0]:
                nodes = np.concatenate(parts)
            lo = hi
            hop_nodes.append(hi + int(new.shape[0]))
        input_nodes = np.concatenate(parts)
        reset_range(input_nodes, 0, input_nodes.shape[0], loc)
        self._give_loc(loc)
        return _assemble(seeds, input_nodes, srcs, dsts, poss, hop_nodes)

    # a pool of dense id maps, all -1 between calls
    def _take_loc(self) -> np.ndarray:
        with self._lock:
            if self._scratch:
                return self._scratch.pop()
        return np.full(self.num_nodes, -1, dtype=self._loc_dtype)

    def _give_loc(self, loc: np.ndarray) -> None:
        with self._lock:
            self._scratch.append(loc)


def _assemble(seeds, input_nodes, srcs, dsts, poss, hop_nodes) -> MiniBatch:
    hop_edges = [int(s.shape[0]) for s in srcs]
    edges = torch.from_numpy(np.stack([np.concatenate(srcs), np.concatenate(dsts)]))
    cum = np.cumsum([0, *hop_edges])
    L = len(hop_edges)
    blocks = [
        Block(
            edge_index=edges[:, : int(cum[L - i])],
            num_src=hop_nodes[L - i],
            num_dst=hop_nodes[L - i - 1],
        )
        for i in range(L)
    ]
    return MiniBatch(
        seeds=torch.from_numpy(seeds),
        input_nodes=torch.from_numpy(input_nodes),
        blocks=blocks,
        meta={
            "hop_nodes": list(hop_nodes),
            "hop_edges": hop_edges,
            "edge_pos": torch.from_numpy(np.concatenate(poss)),
            "expand": "new",
        },
    )
