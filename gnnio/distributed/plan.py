"""What a rank trains on: the placement of feature rows (a ``gnnio plan`` file, checked against
the dataset and the ranks, or a strategy computed on rank 0 and broadcast) and, with
``--local-seeds``, the order of the rank's own training nodes."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..errors import UsageError
from ..ordering import RandomOrder
from ..utils.pages import drop_pages
from .context import DistContext

__all__ = ["LocalSeedsOrder", "check_placement_file", "get_placement", "proximity_order"]


class LocalSeedsOrder(RandomOrder):
    """This rank's own seeds, shuffled per epoch (or in ``order``'s epoch order, e.g. BGL's PO
    order over the same seeds), cut into exactly ``num_batches`` batches (the same count on every
    rank, so collectives and DDP steps stay matched)."""

    def __init__(self, seeds, batch_size: int, num_batches: int, seed: int = 0, order=None):
        super().__init__(seeds, batch_size, seed=seed)
        if self.num_seeds < num_batches:
            raise UsageError(
                f"--local-seeds: a partition has {self.num_seeds} training nodes, fewer than "
                f"the {num_batches} batches every rank must take"
            )
        self._num_batches = int(num_batches)
        self.inner = order  # a one-rank SeedOrder over the same seeds, or None (random)
        for k in ("num_sequences", "bound_value", "bound_met", "errors"):  # PO facts, summary
            if hasattr(order, k):
                setattr(self, k, getattr(order, k))

    @property
    def num_batches(self) -> int:
        return self._num_batches

    def epoch_order(self, epoch: int) -> np.ndarray:
        if self.inner is not None:
            return self.inner.epoch_order(epoch)
        return super().epoch_order(epoch)

    def batches(self, epoch: int):
        share = torch.from_numpy(np.ascontiguousarray(self.shard(epoch)))
        yield from torch.tensor_split(share, self._num_batches)


def check_placement_file(pl, path, ds, world_size: int, local_seeds: bool = False) -> None:
    """Refuse (one line, saying which) a placement file made for another dataset (or recording
    none) or another number of devices, or one without a partition for ``--local-seeds``."""
    from ..placement.validate import check_for_dataset

    check_for_dataset(pl, path, ds)  # node count and the dataset's checksums
    if pl.num_devices != world_size:
        raise UsageError(
            f"--placement {path}: made for {pl.num_devices} devices, the run has {world_size} ranks"
        )
    if local_seeds and pl.parts is None:
        raise UsageError(
            f"--local-seeds: placement '{pl.strategy}' in {path} has no partition; save a "
            "metis, naive or random placement, or use --placement-strategy metis|naive|random"
        )


def get_placement(ds, cfg, ctx: DistContext):
    """The run's placement: ``cfg.placement`` (checked against the dataset and the ranks) or
    ``cfg.placement_strategy`` (default ``alg1``) computed on rank 0 and broadcast."""
    from ..placement import Placement, PlacementRequest, load_placement, place
    from ..utils.counts import top_count

    n = ds.num_nodes
    if cfg.placement is not None:
        pl = load_placement(cfg.placement)
        check_placement_file(pl, cfg.placement, ds, ctx.world_size, cfg.local_seeds)
        return pl
    strategy = cfg.placement_strategy or "alg1"
    payload: list[Any] = [None]
    if ctx.is_main:
        from ..preprocess.hotness import compute_score

        try:
            probs = compute_score(
                "sj", ds, fanouts=cfg.fanouts, batch_size=cfg.batch_size, progress=cfg.progress
            )
            req = PlacementRequest(
                probs=probs,
                topology=ctx.topo,
                buffer_rows=top_count(cfg.buffer, n),
                graph=ds.graph,
                train_idx=np.asarray(ds.train_idx, dtype=np.int64),
                num_layers=cfg.num_layers,
                seed=cfg.seed,
                progress=cfg.progress,
            )
            pl = place(strategy, req)
            # the score and the placement read the whole CSR: its pages leave this rank's
            # mapping (the page cache keeps them); a partitioned run samples its shard only
            drop_pages(ds.graph.indptr)
            drop_pages(ds.graph.indices)
            payload = [
                {
                    "strategy": pl.strategy,
                    "groups": [list(g) for g in pl.groups],
                    "buffers": [np.asarray(b, dtype=np.int64) for b in pl.buffers],
                    "peer_reads": bool(pl.peer_reads),
                    "params": dict(pl.params),
                    "prep_s": float(pl.prep_s),
                    "parts": None if pl.parts is None else np.asarray(pl.parts),
                }
            ]
        except Exception as e:  # noqa: BLE001 - tell the other ranks, then fail everywhere
            payload = [{"error": f"--placement-strategy {strategy}: {e}".splitlines()[0]}]
    ctx.broadcast_object_list(payload, src=0)
    p = payload[0]
    if "error" in p:
        raise UsageError(p["error"])
    return Placement(
        strategy=p["strategy"],
        num_nodes=n,
        groups=tuple(tuple(g) for g in p["groups"]),
        buffers=p["buffers"],
        peer_reads=p["peer_reads"],
        params=p["params"],
        prep_s=p["prep_s"],
        parts=p["parts"],
    )


def proximity_order(ds, cfg, seeds, labels, batch_size, seed, rank, world_size, equal_batches):
    """BGL's proximity-aware order of ``seeds`` (``labels``: a rank's
    :class:`~gnnio.distributed.labels.SeedLabels`); every rank builds the same one and takes its
    slice. Its BFS walks the whole graph's CSR (``ds.graph``) on every rank: with ``--order po``
    the pages it touched stay mapped, so that part of a rank's memory does not shrink with the
    shard (the default random order reads no CSR)."""
    from ..ordering.po import ProximityOrder

    seeds = np.asarray(seeds, dtype=np.int64)
    lab = labels.numpy_of(seeds)  # aligned with the seeds (a rank holds no [N] labels)
    if seeds.shape[0] == ds.graph.num_nodes:  # ProximityOrder reads N labels by global id
        by_id = np.empty_like(lab)
        by_id[seeds] = lab
        lab = by_id
    return ProximityOrder(
        ds.graph,
        seeds,
        lab,
        batch_size,
        seed=seed,
        num_sequences=cfg.po_sequences,
        rank=rank,
        world_size=world_size,
        equal_batches=equal_batches,
        progress=cfg.progress,
    )
