"""BGL's proximity-aware ordering (Liu et al., NSDI 2023, §3.2.2): seeds in BFS order, so that
consecutive mini-batches sample overlapping neighbourhoods and a FIFO feature cache hits more.

BGL's recipe: several BFS sequences of the training nodes, each from a random root; a batch takes
training nodes from the sequences round-robin; each sequence is circularly shifted by a random
offset (giant graphs have many small components, which a BFS appends at the end); the number of
sequences is the smallest whose shuffling error meets Meng et al.'s bound ``sqrt(b M) / n``; the
sequences are generated before training and reused with fresh randomness every epoch. How gnnio
does each step:

1. **BFS sequences (the pool).** One multi-source BFS from ``pool_size`` random training seeds
   (numba, O(N + E), edges in both directions: the sampler reads in-neighbours, and two seeds
   sharing neighbours in either direction share sampled rows) splits the seeds into ``pool_size``
   BFS trees -- *regions* -- each listing its seeds in BFS visiting order. The BFS walks every
   node; a region lists only the training seeds (the traversal *projected to the seeds*). When the
   queue runs dry, the next unvisited seed of a random permutation starts a new tree, appended to
   the regions in turn ("appended at the end of each BFS sequence"). Regions are disjoint, so
   sequences built from them never repeat a seed and every epoch is a permutation.
2. **k sequences -> one epoch.** Each epoch (seeded by ``(seed, epoch)`` only) deals the regions,
   in a random order, round-robin into ``k`` sequences (a sequence is the concatenation of its
   regions, each in BFS order), shifts every sequence circularly by a random offset, and reads the
   sequences round-robin, weighted by length so that all of them end together: item ``i`` of
   sequence ``g`` (length ``L_g``) has the key ``(i + u_g) / L_g`` (``u_g`` uniform in
   ``[0, 1)``) and the epoch lists the seeds by increasing key (a k-way heap merge). Batches are
   consecutive ``batch_size`` slices, sharded over ranks by :class:`~gnnio.ordering.SeedOrder`:
   each batch holds about ``batch_size * L_g / n`` BFS-consecutive seeds of every sequence, and
   batch ``i + 1`` continues every sequence where batch ``i`` left it (temporal locality).
3. **How many sequences.** The *shuffling error* of an order is the total-variation distance
   between the label distribution of a mini-batch and the label distribution of all training
   seeds, averaged over the epoch's full batches (all ranks):
   ``eps = mean_i 1/2 sum_c |p_i(c) - q(c)|`` (:func:`shuffling_error`). The automatic choice
   tries k = 1, 2, ... ``max_sequences`` in turn, each estimated on one order built as in step 2
   from a fixed estimation seed, and keeps the first k with ``eps <= bound``.

   The bound. BGL's ``sqrt(b M) / n`` (``b`` batch size, ``M`` workers = ``world_size``, ``n``
   training seeds) is ``bound="paper"``. Measured (docs/benchmarks.md, "PO against random shuffle"): with eps the *per-batch*
   label TV, even a uniformly random order has eps of order ``sqrt(C / b)`` (the sampling noise of
   ``b`` draws over ``C`` classes), far above ``sqrt(bM)/n`` for any real training set, so the
   literal bound is reached by no order and the search always ends at ``max_sequences`` (with a
   warning). The default ``bound="random"`` runs the same search against the floor a shuffle
   actually reaches: the shuffling error of a uniformly random order of the same seeds and batch
   size, estimated once with the same code, times ``1 + slack``. A float is used as given.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
from numba import njit

from ..graph.csr import CSRGraph
from ..utils.progress import bar
from .shuffle import SeedOrder

__all__ = [
    "BFSRegions",
    "ProximityOrder",
    "bfs_regions",
    "combine_regions",
    "paper_bound",
    "shuffling_error",
    "transpose_csr",
]


# ---- kernels ---------------------------------------------------------------------------------


@njit(cache=True)
def _transpose_kernel(indptr, indices, n):  # pragma: no cover - compiled
    counts = np.zeros(n + 1, dtype=np.int64)
    for e in range(indices.shape[0]):
        counts[indices[e] + 1] += 1
    for v in range(n):
        counts[v + 1] += counts[v]
    rptr = counts.copy()
    ridx = np.empty(indices.shape[0], dtype=indices.dtype)
    fill = counts[:n].copy()
    for v in range(n):
        for e in range(indptr[v], indptr[v + 1]):
            u = indices[e]
            ridx[fill[u]] = v
            fill[u] += 1
    return rptr, ridx


def transpose_csr(graph: CSRGraph) -> tuple[np.ndarray, np.ndarray]:
    """``(indptr, indices)`` of the transposed CSR (out-neighbours), by counting sort, O(N + E)."""
    return _transpose_kernel(
        np.asarray(graph.indptr, dtype=np.int64), np.asarray(graph.indices), graph.num_nodes
    )


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
    """One multi-source BFS from ``num_regions`` random seeds (module docstring, step 1), O(N + E).

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
    """One epoch's permutation of seed positions from ``k`` sequences (module docstring, step 2).

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


def _batch_bounds(n: int, batch_size: int, world_size: int) -> list[tuple[int, int]]:
    """``[start, end)`` of every *full* batch of every rank (the :class:`SeedOrder` sharding); the
    last partial batch of a rank is used only when the rank has no full batch."""
    out = []
    for r in range(world_size):
        lo, hi = r * n // world_size, (r + 1) * n // world_size
        full = (hi - lo) // batch_size
        out += [(lo + i * batch_size, lo + (i + 1) * batch_size) for i in range(full)]
        if full == 0 and hi > lo:
            out.append((lo, hi))
    return out


def shuffling_error(
    order_labels: np.ndarray, batch_size: int, world_size: int = 1, num_classes: int | None = None
) -> float:
    """Mean over batches of the total-variation distance between a batch's label distribution and
    the label distribution of all seeds (module docstring, step 3).

    Args:
        order_labels: int labels of the seeds in epoch order (``-1`` = unlabeled: ignored, both in
            the batches and in the global distribution).
        batch_size: seeds per batch; ``world_size``: ranks (contiguous shards, as SeedOrder).
        num_classes: number of classes (default ``max label + 1``).

    Returns:
        A value in ``[0, 1]``: 0 when every batch has exactly the global proportions.
    """
    lab = np.asarray(order_labels, dtype=np.int64)
    n = lab.shape[0]
    valid = lab >= 0
    if n == 0 or not valid.any():
        return 0.0
    c = int(num_classes) if num_classes is not None else int(lab[valid].max()) + 1
    q = np.bincount(lab[valid], minlength=c).astype(np.float64)
    q /= q.sum()
    bounds = _batch_bounds(n, int(batch_size), int(world_size))
    batch_of = np.full(n, -1, dtype=np.int64)
    for i, (s, e) in enumerate(bounds):
        batch_of[s:e] = i
    keep = valid & (batch_of >= 0)
    counts = np.bincount(batch_of[keep] * c + lab[keep], minlength=len(bounds) * c).reshape(-1, c)
    sizes = counts.sum(1)
    used = sizes > 0
    if not used.any():
        return 0.0
    p = counts[used] / sizes[used, None]
    return float(0.5 * np.abs(p - q[None, :]).sum(1).mean())


def paper_bound(batch_size: int, world_size: int, num_seeds: int) -> float:
    """BGL's (Meng et al.'s) convergence condition on the shuffling error: ``sqrt(b M) / n``."""
    return math.sqrt(batch_size * world_size) / max(1, num_seeds)


# ---- the order -------------------------------------------------------------------------------


class ProximityOrder(SeedOrder):
    """BGL's proximity-aware seed order (module docstring).

    Args:
        graph: the training graph (:class:`~gnnio.graph.csr.CSRGraph`, in-neighbour CSR).
        seeds: ``[n]`` training seeds (distinct global ids).
        labels: int labels, either ``[num_nodes]`` by global id or ``[n]`` aligned with ``seeds``
            (``-1`` = unlabeled, ignored); used only to choose the number of sequences.
        batch_size: seeds per batch.
        seed: seed of everything random (BFS roots, per-epoch dealing, shifts and offsets).
        num_sequences: k; None = the smallest k meeting ``bound`` (``errors`` keeps the estimates).
        rank, world_size, drop_last: sharding, as :class:`~gnnio.ordering.SeedOrder`.
        max_sequences: largest k the automatic choice tries (default ``min(batch_size, 1024)``:
            beyond ``batch_size`` a sequence gives less than one seed per batch).
        pool_size: BFS regions generated once (default ``max(k, max_sequences)``, at most n).
        bound: ``"random"`` (default), ``"paper"`` or a float; see module docstring, step 3.
        slack: tolerance over the random order's error for ``bound="random"``.
        draws: random draws averaged for each shuffling-error estimate (the random baseline and
            every candidate k); one draw is too noisy: the first k passing by luck was chosen
            and k varied a lot between seeds.
        progress: a progress bar over the k tried by the automatic choice.

    Attributes:
        num_sequences: the k used.
        regions: the :class:`BFSRegions` pool.
        errors: ``{k: estimated shuffling error}`` for every k tried (empty if k was given).
        bound_value: the bound the automatic choice used (None if k was given).
        bound_met: False when no k up to ``max_sequences`` met the bound (k = ``max_sequences``).
    """

    def __init__(
        self,
        graph: CSRGraph,
        seeds,
        labels,
        batch_size: int,
        seed: int = 0,
        num_sequences: int | None = None,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = False,
        max_sequences: int | None = None,
        pool_size: int | None = None,
        bound: str | float = "random",
        slack: float = 0.25,
        draws: int = 8,
        progress: bool = False,
    ):
        super().__init__(seeds, batch_size, drop_last=drop_last, rank=rank, world_size=world_size)
        if int(seed) < 0:
            raise ValueError(f"seed: must be >= 0, got {seed}")
        n = self.num_seeds
        if n and (self.seeds.min() < 0 or self.seeds.max() >= graph.num_nodes):
            raise ValueError(f"seeds: ids must be in [0, {graph.num_nodes})")
        if np.unique(self.seeds).shape[0] != n:
            raise ValueError("seeds: contain duplicates")
        if num_sequences is not None and int(num_sequences) < 1:
            raise ValueError(f"num_sequences: must be >= 1, got {num_sequences}")
        if max_sequences is None:
            max_sequences = min(self.batch_size, 1024)
        if int(max_sequences) < 1:
            raise ValueError(f"max_sequences: must be >= 1, got {max_sequences}")
        if not (isinstance(bound, (int, float)) or bound in ("random", "paper")):
            raise ValueError(f"bound: 'random', 'paper' or a number, got {bound!r}")
        self.seed = int(seed)
        if int(draws) < 1:
            raise ValueError(f"draws: must be >= 1, got {draws}")
        self.draws = int(draws)
        self.labels = self._seed_labels(labels, graph.num_nodes)
        self.max_sequences = int(max_sequences)
        self.errors: dict[int, float] = {}
        self.bound_value: float | None = None
        self.bound_met = True
        pool = int(pool_size) if pool_size is not None else self.max_sequences
        pool = max(pool, int(num_sequences or 1))
        self.regions = bfs_regions(
            graph, self.seeds, pool, np.random.default_rng([self.seed, 0x5E0])
        )
        if n == 0:
            self.num_sequences = 1
        elif num_sequences is None:
            self.num_sequences = self._choose(bound, float(slack), progress)
        else:
            self.num_sequences = min(int(num_sequences), self.regions.num_regions)

    def _seed_labels(self, labels, num_nodes: int) -> np.ndarray:
        lab = np.asarray(labels)
        if lab.ndim != 1 or not np.issubdtype(lab.dtype, np.integer):
            raise ValueError("labels: need a 1-D integer array")
        if lab.shape[0] == num_nodes:
            return lab[self.seeds].astype(np.int64)
        if lab.shape[0] == self.num_seeds:
            return lab.astype(np.int64)
        raise ValueError(
            f"labels: need {num_nodes} (one per node) or {self.num_seeds} (one per seed) entries, "
            f"got {lab.shape[0]}"
        )

    def _error_of(self, perm: np.ndarray) -> float:
        return shuffling_error(self.labels[perm], self.batch_size, self.world_size)

    def _choose(self, bound, slack: float, progress: bool) -> int:
        """Smallest k in ``1..max_sequences`` whose estimated shuffling error meets the bound."""
        n = self.num_seeds
        if bound == "paper":
            b = paper_bound(self.batch_size, self.world_size, n)
        elif bound == "random":
            b = float(
                np.mean(
                    [
                        self._error_of(np.random.default_rng([self.seed, 0xE58, d]).permutation(n))
                        for d in range(self.draws)
                    ]
                )
            ) * (1.0 + slack)
        else:
            b = float(bound)
        self.bound_value = b
        top = min(self.max_sequences, self.regions.num_regions)
        with bar(top, "shuffling error", "k", enabled=progress) as pb:
            for k in range(1, top + 1):
                self.errors[k] = float(
                    np.mean(
                        [
                            self._error_of(
                                combine_regions(
                                    self.regions, k, np.random.default_rng([self.seed, 0xE57, k, d])
                                )
                            )
                            for d in range(self.draws)
                        ]
                    )
                )
                pb.update(1)
                if self.errors[k] <= b:
                    return k
        self.bound_met = False
        warnings.warn(
            f"ProximityOrder: no k <= {top} sequences reaches shuffling error {b:.3g} "
            f"(best {min(self.errors.values()):.3g}); using k = {top}",
            stacklevel=3,
        )
        return top

    def epoch_permutation(self, epoch: int) -> np.ndarray:
        """``epoch``'s order as positions into :attr:`seeds` (int64 ``[n]``)."""
        if int(epoch) < 0:
            raise ValueError(f"epoch: must be >= 0, got {epoch}")
        if self.num_seeds == 0:
            return np.zeros(0, dtype=np.int64)
        rng = np.random.default_rng([self.seed, int(epoch), 0xB61])
        return combine_regions(self.regions, self.num_sequences, rng)

    def epoch_order(self, epoch: int) -> np.ndarray:
        return self.seeds[self.epoch_permutation(epoch)]

    def shuffling_error(self, epoch: int = 0) -> float:
        """The shuffling error of ``epoch``'s order (module docstring, step 3)."""
        return self._error_of(self.epoch_permutation(epoch))

    def __repr__(self) -> str:
        return (
            f"ProximityOrder(n={self.num_seeds}, batch_size={self.batch_size}, "
            f"num_sequences={self.num_sequences}, blocks={self.regions.num_regions}, "
            f"rank={self.rank}/{self.world_size})"
        )
