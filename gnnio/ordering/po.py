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
   the regions in turn ("appended at the end of each BFS sequence"). Each region is then cut into
   blocks of at most ``ceil(n / pool_size)`` seeds (:func:`bfs_regions`), and the blocks, not whole
   trees, are dealt in step 2 (BGL deals nothing: it draws whole BFS sequences; the cut keeps one
   hub's giant tree out of every batch, docs/design.md). Regions are disjoint, so
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
   tries k = 1, 2, ... ``max_sequences`` in turn, each estimated as the mean over ``draws`` orders
   built as in step 2 from fixed estimation seeds, and keeps the first k with ``eps <= bound``
   (BGL stops once eps is "smaller than" the bound; ``<=`` differs only at equality).

   The bound. BGL's ``sqrt(b M) / n`` (``b`` batch size, ``M`` workers = ``world_size``, ``n``
   training seeds) is ``bound="paper"``. Measured (docs/benchmarks.md, "PO against random shuffle"): with eps the *per-batch*
   label TV, even a uniformly random order has eps of order ``sqrt(C / b)`` (the sampling noise of
   ``b`` draws over ``C`` classes), far above ``sqrt(bM)/n`` for any real training set, so the
   literal bound is reached by no order and the search always ends at ``max_sequences`` (with a
   warning). The default ``bound="random"`` runs the same search against the floor a shuffle
   actually reaches: the shuffling error of a uniformly random order of the same seeds and batch
   size, estimated once with the same code, times ``1 + slack``. A float is used as given.

Code: steps 1 and 2 are :mod:`gnnio.ordering.bfs`, the shuffling error and the paper's bound
:mod:`gnnio.ordering.quality` (their names are re-exported here); this module is the order.
"""

from __future__ import annotations

import numpy as np

from ..graph.csr import CSRGraph
from ..utils.progress import bar
from ..utils.warnings_at import warn
from .bfs import BFSRegions, bfs_regions, combine_regions, transpose_csr
from .quality import paper_bound, shuffling_error
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


# ---- the order -------------------------------------------------------------------------------


class ProximityOrder(SeedOrder):
    """BGL's proximity-aware seed order (module docstring).

    Args:
        graph: the training graph (:class:`~gnnio.graph.csr.CSRGraph`, in-neighbour CSR).
        seeds: ``[n]`` training seeds (distinct global ids).
        labels: int labels, either ``[num_nodes]`` by global id or ``[n]`` aligned with ``seeds``
            (``-1`` = unlabeled, ignored); used only to choose the number of sequences. When
            every node is a seed (``n == num_nodes``) they are read by global id.
        batch_size: seeds per batch.
        seed: seed of everything random (BFS roots, per-epoch dealing, shifts and offsets).
        num_sequences: k; None = the smallest k meeting ``bound`` (``errors`` keeps the estimates).
        rank, world_size, drop_last, equal_batches: sharding, as
            :class:`~gnnio.ordering.SeedOrder` (every rank builds the same order from the same
            arguments and takes its slice; ``world_size`` also enters the shuffling error).
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
        equal_batches: bool = False,
        max_sequences: int | None = None,
        pool_size: int | None = None,
        bound: str | float = "random",
        slack: float = 0.25,
        draws: int = 8,
        progress: bool = False,
    ):
        super().__init__(
            seeds,
            batch_size,
            drop_last=drop_last,
            rank=rank,
            world_size=world_size,
            equal_batches=equal_batches,
        )
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
        warn(
            f"ProximityOrder: no k <= {top} sequences reaches shuffling error {b:.3g} "
            f"(best {min(self.errors.values()):.3g}); using k = {top}"
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
