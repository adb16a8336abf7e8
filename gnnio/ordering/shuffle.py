"""The order in which training seeds are visited, per epoch and per rank.

:class:`SeedOrder` is the contract: a subclass only says how to order *all* seeds for an epoch
(:meth:`SeedOrder.epoch_order`, identical on every rank); the base class shards that sequence over
ranks and cuts it into batches. :class:`RandomOrder` is the usual seeded shuffle; a
proximity-aware order (BGL's BFS sequences) plugs in the same way.

Sharding: rank ``r`` of ``W`` takes the contiguous slice ``[r * n // W, (r + 1) * n // W)`` of the
epoch's sequence, so ranks never share a seed and together cover all ``n`` seeds. Shares differ by
at most one seed, so with ``drop_last=False`` their batch counts can differ by one when
``n % W != 0``; DDP training (which needs equal counts) should use ``drop_last=True``, which gives
every rank ``(n // W) // batch_size`` full batches, or ``equal_batches=True``, which keeps every
seed: each rank cuts its share into the same ``ceil(ceil(n / W) / batch_size)`` batches of
near-equal size (sizes differ by at most one), so every training node is a seed exactly once per
epoch and every rank takes the same number of steps.
"""

from __future__ import annotations

import operator
from abc import ABC, abstractmethod
from collections.abc import Iterator

import numpy as np
import torch

__all__ = ["SeedOrder", "RandomOrder", "equal_batches_shortfall"]


def equal_batches_shortfall(num_seeds: int, batch_size: int, world_size: int) -> str | None:
    """Why ``num_seeds`` seeds cannot be dealt to ``world_size`` ranks in equal batch counts:
    ``"fewer"`` (some but fewer seeds than ranks: a rank would get none), ``"indivisible"``
    (batches of one and a count the ranks do not divide: shares of c and c - 1 seeds in c
    batches would give a rank an empty batch), or None when they can be."""
    if 0 < num_seeds < world_size:
        return "fewer"
    if batch_size == 1 and num_seeds % world_size:
        return "indivisible"
    return None


class SeedOrder(ABC):
    """Batches of seed ids (global node ids) per epoch, sharded over ranks.

    Args:
        seeds: ``[n]`` int global node ids to visit each epoch (e.g. ``train_idx``).
        batch_size: seeds per batch (the last batch of a rank may be smaller unless ``drop_last``).
        drop_last: drop each rank's last, incomplete batch.
        rank, world_size: this process's share; see module docstring.
        equal_batches: the same number of batches on every rank, no seed dropped (module
            docstring); excludes ``drop_last``.
    """

    def __init__(
        self,
        seeds: torch.Tensor | np.ndarray,
        batch_size: int,
        drop_last: bool = False,
        rank: int = 0,
        world_size: int = 1,
        equal_batches: bool = False,
    ):
        if isinstance(seeds, torch.Tensor):
            seeds = seeds.detach().cpu().numpy()
        arr = np.asarray(seeds)
        if arr.ndim != 1:
            raise ValueError(f"seeds: need a 1-D array of node ids, got shape {tuple(arr.shape)}")
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"seeds: need integer node ids, got dtype {arr.dtype}")
        try:  # (a float is never truncated, a string never read as a number)
            batch_size = operator.index(batch_size)
        except TypeError:
            raise TypeError(f"batch_size: need an integer, got {batch_size!r}") from None
        if batch_size < 1:
            raise ValueError(f"batch_size: must be >= 1, got {batch_size}")
        if int(world_size) < 1:
            raise ValueError(f"world_size: must be >= 1, got {world_size}")
        if not 0 <= int(rank) < int(world_size):
            raise ValueError(f"rank: must be in [0, {world_size}), got {rank}")
        self.seeds = np.array(
            arr, dtype=np.int64
        )  # own copy: memmaps and caller arrays stay untouched
        self.batch_size = int(batch_size)
        self.drop_last = bool(drop_last)
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.equal_batches = bool(equal_batches)
        if self.equal_batches and self.drop_last:
            raise ValueError("equal_batches and drop_last exclude each other")
        short = self.equal_batches and equal_batches_shortfall(
            self.num_seeds, self.batch_size, self.world_size
        )
        if short == "fewer":
            raise ValueError(
                f"equal_batches: {self.num_seeds} seeds cannot give each of {self.world_size} "
                "ranks a batch"
            )
        if short == "indivisible":
            raise ValueError(
                f"equal_batches: batch size 1 needs a seed count divisible by the {world_size} "
                f"ranks, got {self.num_seeds}"
            )

    @abstractmethod
    def epoch_order(self, epoch: int) -> np.ndarray:
        """All ``n`` seeds (global ids, int64) in this epoch's visiting order, the same on every
        rank. Must be a permutation of :attr:`seeds` and depend only on the epoch and settings."""

    @property
    def num_seeds(self) -> int:
        """Seeds per epoch, all ranks together."""
        return int(self.seeds.shape[0])

    def _bounds(self) -> tuple[int, int]:
        n, w, r = self.num_seeds, self.world_size, self.rank
        return r * n // w, (r + 1) * n // w

    @property
    def shard_size(self) -> int:
        """Seeds this rank visits per epoch (before ``drop_last``)."""
        lo, hi = self._bounds()
        return hi - lo

    @property
    def num_batches(self) -> int:
        """Batches this rank yields per epoch."""
        s, b = self.shard_size, self.batch_size
        if self.equal_batches:
            most = -(-self.num_seeds // self.world_size)  # the largest rank share
            return -(-most // b)
        return s // b if self.drop_last else -(-s // b)

    def __len__(self) -> int:
        return self.num_batches

    def shard(self, epoch: int) -> np.ndarray:
        """This rank's seeds for ``epoch``, in visiting order (int64 global ids)."""
        lo, hi = self._bounds()
        return self.epoch_order(epoch)[lo:hi]

    def batches(self, epoch: int) -> Iterator[torch.Tensor]:
        """This rank's batches for ``epoch`` as int64 tensors of global ids."""
        share = torch.from_numpy(np.ascontiguousarray(self.shard(epoch)))
        b = self.batch_size
        if self.equal_batches:  # (no seeds: no batch, as without equal_batches)
            if self.num_batches:
                yield from torch.tensor_split(share, self.num_batches)
            return
        for i in range(self.num_batches):
            yield share[i * b : (i + 1) * b]


class RandomOrder(SeedOrder):
    """Uniformly random order: a fresh permutation each epoch, from ``(seed, epoch)`` only.

    The generator is NumPy's PCG64 seeded with the entropy pair ``[seed, epoch]``
    (``np.random.default_rng([seed, epoch])``), so every rank computes the same permutation
    without communicating, and any epoch can be reproduced on its own.
    """

    def __init__(
        self,
        seeds: torch.Tensor | np.ndarray,
        batch_size: int,
        seed: int = 0,
        drop_last: bool = False,
        rank: int = 0,
        world_size: int = 1,
        equal_batches: bool = False,
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
        self.seed = int(seed)

    def epoch_order(self, epoch: int) -> np.ndarray:
        if int(epoch) < 0:
            raise ValueError(f"epoch: must be >= 0, got {epoch}")
        rng = np.random.default_rng([self.seed, int(epoch)])
        return self.seeds[rng.permutation(self.num_seeds)]
