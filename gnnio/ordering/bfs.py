"""BFS regions of the training seeds and their per-epoch combination into ``k`` sequences: steps 1
and 2 of BGL's proximity-aware order (:mod:`gnnio.ordering.po`, whose docstring describes them).
The traversals are numba kernels, O(N + E); the graph's transpose gives the out-edges.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from ..graph.csr import CSRGraph
from ..graph.transpose import transpose_csr

__all__ = ["BFSRegions", "bfs_regions", "combine_regions", "transpose_csr"]


@njit(cache=True, nogil=True)
def _multi_source_bfs(
    indptr, indices, rptr, ridx, seed_pos, roots, restart, num_regions, out_pos, out_region
):  # pragma: no cover - compiled
    """Level-synchronous BFS from all ``roots`` at once over both edge directions; a node joins
    the region of the node that reached it. When the queue runs dry the next unvisited seed of
    ``restart`` starts a new tree, assigned to region ``next % num_regions``. Writes the seeds
    (as positions ``seed_pos[v]``) in visiting order to ``out_pos`` and their regions to
    ``out_region``; returns how many seeds were written."""
    nn = indptr.shape[0] - 1
    n_seeds = out_pos.shape[0]
    region = np.full(nn, -1, dtype=np.int32)
    queue = np.empty(nn, dtype=np.int64)
    head = 0
    tail = 0
    for i in range(roots.shape[0]):
        r = roots[i]
        if region[r] < 0:
            region[r] = i
            queue[tail] = r
            tail += 1
    nxt = roots.shape[0]
    ri = 0
    k = 0
    while k < n_seeds:
        if head == tail:
            while ri < restart.shape[0] and region[restart[ri]] >= 0:
                ri += 1
            if ri == restart.shape[0]:
                break
            r = restart[ri]
            region[r] = nxt % num_regions
            nxt += 1
            queue[tail] = r
            tail += 1
        v = queue[head]
        head += 1
        p = seed_pos[v]
        g = region[v]
        if p >= 0:
            out_pos[k] = p
            out_region[k] = g
            k += 1
        for e in range(indptr[v], indptr[v + 1]):
            u = indices[e]
            if region[u] < 0:
                region[u] = g
                queue[tail] = u
                tail += 1
        for e in range(rptr[v], rptr[v + 1]):
            u = ridx[e]
            if region[u] < 0:
                region[u] = g
                queue[tail] = u
                tail += 1
    return k


@dataclass
class BFSRegions:
    """The seeds split into BFS blocks by one multi-source BFS (see :func:`bfs_regions`).

    Attributes:
        seeds_by_region: int64 ``[n]`` seed positions (indices into the seed array), grouped by
            block, each block a run of one BFS tree's visiting order.
        sizes: int64 ``[B]`` seeds per block (all >= 1, at most ``ceil(n / num_roots)``).
        starts: int64 ``[B]`` offset of each block in ``seeds_by_region``.
    """

    seeds_by_region: np.ndarray
    sizes: np.ndarray
    starts: np.ndarray

    @property
    def num_regions(self) -> int:
        return int(self.sizes.shape[0])


def bfs_regions(
    graph: CSRGraph,
    seeds: np.ndarray,
    num_regions: int,
    rng: np.random.Generator,
    transposed: tuple[np.ndarray, np.ndarray] | None = None,
) -> BFSRegions:
    """One multi-source BFS from ``num_regions`` random seeds (:mod:`gnnio.ordering.po`, step 1), O(N + E).

    Unreached components restart from random unvisited seeds, appended to the trees in turn. Each
    tree's seed list (BFS order) is cut into blocks of at most ``ceil(n / num_regions)`` seeds, so
    there are between ``num_regions`` and ``2 * num_regions`` blocks."""
    seeds = np.asarray(seeds, dtype=np.int64)
    n = int(seeds.shape[0])
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return BFSRegions(empty, empty, empty)
    r = max(1, min(int(num_regions), n))
    seed_pos = np.full(graph.num_nodes, -1, dtype=np.int64)
    seed_pos[seeds] = np.arange(n, dtype=np.int64)
    rptr, ridx = transposed if transposed is not None else transpose_csr(graph)
    perm = seeds[rng.permutation(n)]
    out_pos = np.empty(n, dtype=np.int64)
    out_region = np.empty(n, dtype=np.int32)
    got = _multi_source_bfs(
        np.asarray(graph.indptr, dtype=np.int64),
        np.asarray(graph.indices),
        rptr,
        ridx,
        seed_pos,
        perm[:r],
        perm[r:],
        r,
        out_pos,
        out_region,
    )
    if got != n:  # pragma: no cover - every seed is a root or a restart candidate
        raise AssertionError(f"BFS reached {got} of {n} seeds")
    by = np.argsort(out_region, kind="stable")
    sizes = np.bincount(out_region, minlength=r).astype(np.int64)
    # split every region into consecutive blocks of at most ceil(n / r) seeds: in a power-law
    # graph a root next to a hub claims most of the graph, and one giant region would dominate
    # every batch (BGL's block generator caps block size the same way, §3.3)
    cap = -(-n // r)
    pieces = -(-sizes // cap)
    block_sizes = np.full(int(pieces.sum()), cap, dtype=np.int64)
    last = np.cumsum(pieces) - 1
    block_sizes[last] = sizes - (pieces - 1) * cap
    starts = np.cumsum(block_sizes) - block_sizes
    return BFSRegions(out_pos[by], block_sizes, starts)


@njit(cache=True)
def _proportional_merge(starts, lengths, shifts, offsets, out):  # pragma: no cover - compiled
    """Merge ``k`` sequences (``layout[starts[g] : starts[g] + lengths[g]]``, read from index
    ``shifts[g]`` circularly) by the key ``(i + offsets[g]) / lengths[g]`` of their i-th item,
    smallest first (a binary heap over the k heads); writes layout indices to ``out``."""
    k = starts.shape[0]
    heap_key = np.empty(k, dtype=np.float64)
    heap_g = np.empty(k, dtype=np.int64)
    taken = np.zeros(k, dtype=np.int64)
    size = 0
    for g in range(k):
        if lengths[g] > 0:
            # sift up
            key = offsets[g] / lengths[g]
            i = size
            size += 1
            while i > 0:
                parent = (i - 1) // 2
                if heap_key[parent] <= key:
                    break
                heap_key[i] = heap_key[parent]
                heap_g[i] = heap_g[parent]
                i = parent
            heap_key[i] = key
            heap_g[i] = g
    o = 0
    while size > 0:
        g = heap_g[0]
        t = taken[g]
        out[o] = starts[g] + (shifts[g] + t) % lengths[g]
        o += 1
        taken[g] = t + 1
        if t + 1 < lengths[g]:
            key = (t + 1 + offsets[g]) / lengths[g]
        else:  # exhausted: move the last heap item to the root
            size -= 1
            key = heap_key[size]
            g = heap_g[size]
        # sift down (key, g) from the root
        i = 0
        while True:
            c = 2 * i + 1
            if c >= size:
                break
            if c + 1 < size and heap_key[c + 1] < heap_key[c]:
                c += 1
            if heap_key[c] >= key:
                break
            heap_key[i] = heap_key[c]
            heap_g[i] = heap_g[c]
            i = c
        if size > 0:
            heap_key[i] = key
            heap_g[i] = g


def combine_regions(regions: BFSRegions, k: int, rng: np.random.Generator) -> np.ndarray:
    """One epoch's permutation of seed positions from ``k`` sequences (:mod:`gnnio.ordering.po`,
    step 2).

    The regions, in a random order, are dealt round-robin into ``k`` sequences (each the
    concatenation of its regions); each sequence is circularly shifted by a random offset; the
    sequences are read round-robin weighted by length: item ``i`` of sequence ``g`` (length
    ``L_g``) has key ``(i + u_g) / L_g`` with a random ``u_g`` in ``[0, 1)``, so every sequence
    contributes in proportion to its length and all of them end together.
    """
    r = regions.num_regions
    k = max(1, min(int(k), r))
    perm = rng.permutation(r)
    rank = np.empty(r, dtype=np.int64)
    rank[perm] = np.arange(r)
    group = rank % k
    # new layout: sequences back to back, each the concatenation of its regions in deal order
    order = np.lexsort((rank // k, group))
    sizes = regions.sizes[order]
    new_start_sorted = np.cumsum(sizes) - sizes
    lengths = np.bincount(group, weights=regions.sizes, minlength=k).astype(np.int64)
    seq_starts = np.cumsum(lengths) - lengths
    n = int(regions.sizes.sum())
    new_start = np.empty(r, dtype=np.int64)
    new_start[order] = new_start_sorted
    region_of = np.repeat(np.arange(r), regions.sizes)
    within = np.arange(n, dtype=np.int64) - regions.starts[region_of]
    layout = np.empty(n, dtype=np.int64)
    layout[new_start[region_of] + within] = regions.seeds_by_region
    shifts = (rng.random(k) * lengths).astype(np.int64)
    offsets = rng.random(k)
    out = np.empty(n, dtype=np.int64)
    _proportional_merge(seq_starts, lengths, shifts, offsets, out)
    return layout[out]
