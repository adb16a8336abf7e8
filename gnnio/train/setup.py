"""How :func:`gnnio.train.train` builds its feature store, seed order and sampler from a
:class:`~gnnio.train.TrainConfig`. Kept apart from the loop so each data-I/O technique is one
readable recipe:

Feature store (innermost first)::

    plain store (memory | mmap)
      -> TieredFeatureStore        --gpu-cache-fraction F --score NAME   (Data Tiering)
         or MultiDeviceFeatureStore --placement FILE [--reader K]      (Song & Jiang)
      -> FeatureCache              --cache-policy P --cache-size F       (BGL)
         [over a host-memory level  --cpu-cache-size F2: BGL's two-level GPU + CPU cache]

* Tiering: the hot set is the top ``F * N`` nodes by ``--score``. If the dataset was reordered by
  that same score with the same parameters (``gnnio prepare --reorder`` / ``gnnio reorder``;
  :func:`hot_prefix`), the hot rows are the id prefix and routing is a boundary check; otherwise a
  lookup table routes each id. Without a GPU the GPU
  tier is simulated in CPU memory; the byte counts per tier (``gpu``, ``host``) are exact either way.
* Placement: a file written by ``gnnio plan --save``. This process reads as GPU ``reader`` of the
  placement; tiers ``local``, ``peer``, ``host``. Devices are real GPUs when enough are present and
  ``--device cuda``, simulated otherwise.
* Cache: a per-batch vectorized cache in front of whatever is below; ``static`` loads the top rows
  by ``--score`` once. Over a tiered store the cache holds rows the GPU tier does not (the tiered
  store already serves those), i.e. a static hot part plus a dynamic part.

The **GPU-resident set B** that locality-aware sampling favours is what lives on the training GPU:
the tiered store's hot rows, the reader's placement buffer (local) plus its NVLink peers' buffers,
or a static cache's rows. A dynamic cache's content changes every batch, so it does not define B.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch

from ..errors import UsageError
from ..utils.warnings_at import warn

__all__ = [
    "StoreSetup",
    "build_order",
    "build_sampler",
    "build_store",
    "hot_score",
    "needs_score",
]

CACHE_POLICIES = ("none", "static", "fifo", "lru", "lfu", "lookahead", "sieve", "s3fifo")
ORDERS = ("random", "po")


@dataclass
class StoreSetup:
    """What :func:`build_store` made.

    Attributes:
        store: the store the loader gathers from.
        tiers: tier names that always appear in ``bytes_by_tier`` (zero if unused).
        gpu_ids: sorted global ids resident on the training GPU (the set B of LAS), or None.
        info: facts for the summary (hot rows, strategy, cache capacity, ...).
        eval_store: the store evaluation reads through: ``store`` without a *dynamic* cache, so
            evaluation batches do not evict the training batches' rows.
        disk: the :class:`~gnnio.features.stores.disk.DiskFeatureStore` at the bottom
            (``--features-on disk``), else None; disk_below_gpu: the store right under a GPU
            tier over it (its counters split the GPU tier's "host" rows), else None.
    """

    store: Any
    tiers: tuple[str, ...]
    gpu_ids: np.ndarray | None
    info: dict[str, Any]
    eval_store: Any = None
    disk: Any = None
    disk_below_gpu: Any = None


def hot_prefix(ds, cfg) -> tuple[bool, str | None]:
    """Whether the id prefix of ``ds`` is the hot set ``cfg.score`` ranks, and why not (or a
    caveat): it is when ``gnnio reorder`` used that score with the parameters this run's score
    uses (``meta["reorder_score"]`` against :func:`~gnnio.preprocess.hotness.score_params` of
    ``--score``, ``--fanouts`` and ``--batch-size`` with the scores' defaults). A dataset reordered
    before gnnio recorded the parameters has only ``reordered_by``: its prefix is taken, as then."""
    from ..preprocess.hotness import score_params

    by = ds.meta.get("reordered_by")
    if by != cfg.score:
        return False, None
    recorded = ds.meta.get("reorder_score")
    if recorded is None:
        return True, f"reordered by '{by}' with parameters not recorded: taken as this run's"
    want = score_params(cfg.score, cfg.fanouts, cfg.batch_size)
    if recorded == want:
        return True, None
    keys = [k for k in dict.fromkeys([*want, *recorded]) if want.get(k) != recorded.get(k)]
    told = ", ".join(f"{k} {recorded.get(k)}" for k in keys)
    here = ", ".join(f"{k} {want.get(k)}" for k in keys)
    return False, f"reordered by '{by}' with {told}; this run's '{by}' uses {here}: ranked again"


def needs_score(ds, cfg) -> bool:
    """Whether :func:`build_store` needs the hotness score ``cfg.score``: to rank rows for a GPU
    tier of a dataset not already reordered by that score (:func:`hot_prefix`), or for a static
    cache."""
    tiered = cfg.gpu_cache_fraction is not None and not hot_prefix(ds, cfg)[0]
    tiered = tiered and cfg.gpu_cache_fraction < 1.0  # every row hot: no ranking needed
    if cfg.store == "disk":
        from .setup_disk import needs_disk_score

        return tiered or needs_disk_score(cfg)
    return tiered or (cfg.cache_policy == "static" and cfg.cache_size > 0)


def hot_score(ds, cfg, progress: bool) -> np.ndarray:
    """``cfg.score`` for ``ds`` (float64 [N], by global id; larger = hotter)."""
    from ..preprocess.hotness import compute_score

    return compute_score(
        cfg.score, ds, fanouts=cfg.fanouts, batch_size=cfg.batch_size, progress=progress
    )


def build_store(ds, cfg, device: torch.device, score: np.ndarray | None = None) -> StoreSetup:
    """The feature store of a training run (module docstring).

    ``score``: the hotness score ``cfg.score`` by global id, computed once by the caller
    (:func:`hot_score`) when :func:`needs_score` says the store needs it; None otherwise.
    """
    from ..features import open_store

    def get_score() -> np.ndarray:
        if score is None:
            raise ValueError(f"build_store: needs the '{cfg.score}' score (see needs_score)")
        return score

    disk = None
    if cfg.store == "disk":  # the SSD tier under a host cache (gnnio.train.setup_disk)
        from .setup_disk import build_disk_base

        base, disk, tiers, info = build_disk_base(ds, cfg, get_score)
    else:
        base = open_store(ds, cfg.store, "cpu", num_threads=cfg.threads, progress=cfg.progress)
        tiers = (getattr(base, "tier", "host"),)
        info = {"store": cfg.store}
    store: Any = base
    gpu_ids: np.ndarray | None = None
    n = ds.num_nodes

    if cfg.gpu_cache_fraction is not None:
        from ..features.tiers.tiered import TieredFeatureStore, hot_rows_for_fraction

        kw = {"device": device if device.type == "cuda" else "cpu", "progress": cfg.progress}
        if cfg.gpu_budget_bytes is not None:
            kw["gpu_budget_bytes"] = int(cfg.gpu_budget_bytes)
        reordered, why = hot_prefix(ds, cfg)
        if reordered or cfg.gpu_cache_fraction >= 1.0:  # every row hot: the id prefix is all
            store = TieredFeatureStore.from_reordered(base, cfg.gpu_cache_fraction, **kw)
        else:
            order_ids = _top_ids(get_score(), hot_rows_for_fraction(cfg.gpu_cache_fraction, n))
            store = TieredFeatureStore(base, hot_ids=order_ids, **kw)
        gpu_ids = np.sort(np.asarray(store._hot_ids, dtype=np.int64))
        tiers = ("gpu", *tiers) if disk is not None else ("gpu", "host")
        info.update(
            tiering={
                "score": cfg.score,
                "fraction": cfg.gpu_cache_fraction,
                "mode": store.mode,
                "hot_rows": int(store.num_hot),
                "gpu_tier_bytes": int(store.gpu_tier_bytes),
                "cold_mode": store.cold_mode_used + (" (simulated)" if store.simulated else ""),
                "simulated": bool(store.simulated),
                "reordered_by_score": bool(reordered),
            }
        )
        if why is not None:  # the reorder's score differs from --score's, or was not recorded
            info["tiering"]["reordered_note"] = why
    elif cfg.placement is not None:
        from ..features.tiers.multidevice import MultiDeviceFeatureStore
        from ..placement import load_placement
        from ..placement.validate import check_for_dataset

        pl = load_placement(cfg.placement)
        check_for_dataset(pl, cfg.placement, ds)  # node count and the dataset's checksums
        if not 0 <= cfg.reader < pl.num_devices:
            raise UsageError(
                f"--reader: must be in [0, {pl.num_devices}) for this placement, got {cfg.reader}"
            )
        devices = None
        if device.type == "cuda":
            if torch.cuda.device_count() >= pl.num_devices:
                devices = [torch.device("cuda", i) for i in range(pl.num_devices)]
            else:  # said plainly, not silently: the summary also lists it under simulated_parts
                warn(
                    f"--placement {cfg.placement}: made for {pl.num_devices} GPUs, this machine "
                    f"has {torch.cuda.device_count()}; its GPUs are simulated in host memory "
                    "(rows counted 'local'/'peer' are host reads)",
                    UserWarning,
                )
        store = MultiDeviceFeatureStore(ds.features, pl, reader=cfg.reader, devices=devices)
        tiers = ("local", "peer", "host")
        lk = pl.lookup(cfg.reader, peers=pl.peer_reads)
        gpu_ids = np.flatnonzero(np.asarray(lk.dev_num) >= 0).astype(np.int64)
        info.update(
            placement={
                "file": str(cfg.placement),
                "strategy": pl.strategy,
                "num_devices": pl.num_devices,
                "reader": cfg.reader,
                "buffer_rows": [int(len(b)) for b in pl.buffers],
                "simulated": devices is None,
            }
        )

    eval_store = store
    if disk is not None:  # --cache-policy named the host cache's policy: no cache above
        if "host_cache" in info and info["host_cache"]["policy"] != "static":
            eval_store = disk if store is base else store
        return StoreSetup(store=store, tiers=tiers, gpu_ids=gpu_ids, info=info,
                          eval_store=eval_store, disk=disk,
                          disk_below_gpu=base if store is not base else None)  # fmt: skip
    if cfg.cache_policy != "none" and cfg.cache_size > 0:
        from ..features.caches.cache import FeatureCache
        from ..features.tiers.tiered import hot_rows_for_fraction

        hot = None
        if cfg.cache_policy == "static":
            hot = _top_ids(get_score(), n)
            if gpu_ids is not None:  # do not cache what the GPU tier already holds
                hot = hot[~np.isin(hot, gpu_ids)]
        cap = hot_rows_for_fraction(min(cfg.cache_size, 1.0), n)
        # on a GPU the cache lives there: its hits do not cross PCIe (issue 15, fault 7)
        cache_dev = device if device.type == "cuda" else None
        cpu_cap = hot_rows_for_fraction(min(getattr(cfg, "cpu_cache_size", 0.0), 1.0), n)
        misses = None
        if cache_dev is not None and store is base and cfg.store == "memory" and cpu_cap == 0:
            # the misses read zero-copy from the pinned host rows, as a tiered store's cold rows:
            # the GPU cache's batch then needs no host sync (caches/nosync.py), where a CPU
            # gather of the misses needs their ids on the host (one sync per batch)
            from ..features.tiers.tiered import TieredFeatureStore

            store = TieredFeatureStore(base, 0, device=device, progress=cfg.progress)
            misses = f"{store.cold_mode_used} ({store.cold_mode_reason})"
        if cpu_cap > 0:  # BGL's two-level cache: GPU level over a host-memory level
            from ..features.caches.cache import two_level_cache

            store = two_level_cache(store, cap, cpu_cap, cfg.cache_policy, cache_dev, hot)
            tiers = ("gpu_cache", "cpu_cache", *tiers)
        else:
            store = FeatureCache(
                store, cap, cfg.cache_policy, hot_ids=hot, tier="cache", device=cache_dev,
                lookahead=getattr(cfg, "lookahead", 8),
            )  # fmt: skip
            tiers = ("cache", *tiers)
        if cfg.cache_policy == "static":
            eval_store = store
        if cfg.cache_policy == "static" and gpu_ids is None:
            assert hot is not None  # a static cache: hot set above
            gpu_ids = np.sort(np.asarray(hot[: store.capacity], dtype=np.int64))
        info.update(
            cache={
                "policy": cfg.cache_policy,
                "size": cfg.cache_size,
                "capacity": store.capacity,
                "device": str(store.device),
                **({"misses": misses} if misses else {}),
                **({"lookahead": store.lookahead} if cfg.cache_policy == "lookahead" else {}),
                **(
                    {
                        "cpu_size": cfg.cpu_cache_size,
                        "cpu_capacity": store.backing.capacity,
                        "simulated": store.device.type != "cuda",
                    }  # fmt: skip
                    if cpu_cap > 0
                    else {}
                ),
            }
        )
    return StoreSetup(store=store, tiers=tiers, gpu_ids=gpu_ids, info=info, eval_store=eval_store)


def build_sampler(ds, cfg, fanouts, setup: StoreSetup):
    """The training sampler and, for ``locality_scale="auto"``, its Algorithm 2 controller.

    * neither option: :class:`~gnnio.sampling.UniformSampler`;
    * ``prune_threshold`` only: :class:`~gnnio.sampling.PrunedUniformSampler`, on the GPU where
      :func:`sampler_placement` puts it (as the uniform one);
    * ``locality_scale``: :class:`~gnnio.sampling.LocalitySampler` with ``B = setup.gpu_ids``
      (and the pruning window when asked), on the GPU where :func:`sampler_placement` puts it,
      Horvitz-Thompson weights (:func:`edge_weights`:
      ``1/q``, or ``1/(deg q)`` for SAGE's ``edge_weight_norm="sum"``; the default SAGE mean
      normalises them per row, see :mod:`gnnio.sampling.locality`);
    * ``sampler="labor"``: :class:`~gnnio.sampling.LaborSampler` (LABOR-0, HT weights), on the
      GPU where :func:`sampler_placement` puts it;
    * ``sampler="ladies"``: :class:`~gnnio.sampling.LadiesSampler` with ``layer_size`` per hop,
      ``len(fanouts)`` hops, or with ``locality_scale``
      :class:`~gnnio.sampling.LocalityLadiesSampler` (Eq. 8 on the layer, ``B = setup.gpu_ids``),
      on the GPU where :func:`sampler_placement` puts it.
    """
    from ..sampling import (
        AdaptiveScale,
        LaborSampler,
        LadiesSampler,
        LocalityLadiesSampler,
        LocalitySampler,
        PrunedUniformSampler,
        UniformSampler,
        prune_thresholds,
    )
    from .graphed import graph_mode

    # (cfg.validate: two values)
    prune = (
        cast(tuple[float, float], tuple(float(v) for v in cfg.prune_threshold))
        if cfg.prune_threshold
        else None
    )
    if prune is not None:  # a window under one neighbour: one line, not the sampler's ValueError
        n = ds.graph.num_nodes
        try:
            prune_thresholds(ds.graph.num_edges / n if n > 0 else 0.0, fanouts, prune)
        except ValueError as e:
            raise UsageError(f"--prune-threshold: {e}") from None
    kind = getattr(cfg, "sampler", "uniform")
    w = edge_weights(cfg)
    if kind == "labor":
        sdev, graph_in = sampler_placement(ds, cfg)  # LABOR-0 on the GPU as the uniform one
        imp = getattr(cfg, "importance_sampling", 0)
        return LaborSampler(ds.graph, fanouts, seed=cfg.seed, num_threads=cfg.threads, weights=w,
                            device=sdev, graph_in=graph_in, cuda_graph=graph_mode(cfg, "sampler"),
                            importance_sampling=imp), None  # fmt: skip
    if kind == "ladies" and cfg.locality_scale is None:
        sizes = [int(cfg.layer_size)] * len(fanouts)
        sdev, graph_in = sampler_placement(ds, cfg)  # on the GPU as the uniform one
        return LadiesSampler(ds.graph, sizes, seed=cfg.seed, weights=w, device=sdev,
                             graph_in=graph_in), None  # fmt: skip
    if cfg.locality_scale is None:
        if prune is None:
            sdev, graph_in = sampler_placement(ds, cfg)
            return (
                UniformSampler(
                    ds.graph, fanouts, seed=cfg.seed, num_threads=cfg.threads, device=sdev,
                    graph_in=graph_in, cuda_graph=graph_mode(cfg, "sampler"),
                ),
                None,
            )  # fmt: skip
        sdev, graph_in = sampler_placement(ds, cfg)
        return (
            PrunedUniformSampler(
                ds.graph, fanouts, prune=prune, seed=cfg.seed, num_threads=cfg.threads,
                device=sdev, graph_in=graph_in, cuda_graph=graph_mode(cfg, "sampler"),
            ),
            None,
        )  # fmt: skip
    if setup.gpu_ids is None:
        raise UsageError(
            "--locality-scale: the store holds no rows on the GPU (use --gpu-cache-fraction, "
            "--placement or --cache-policy static)"
        )
    adaptive = None
    scale = cfg.locality_scale
    if scale == "auto":
        adaptive = AdaptiveScale(maxs=cfg.locality_max_scale)
        scale = adaptive.s
    sampler: LocalityLadiesSampler | LocalitySampler
    sdev, graph_in = sampler_placement(ds, cfg)  # on the GPU as the uniform one (issue 24)
    if kind == "ladies":
        sampler = LocalityLadiesSampler(
            ds.graph,
            [int(cfg.layer_size)] * len(fanouts),
            hot_ids=setup.gpu_ids,
            scale=float(scale),
            seed=cfg.seed,
            weights=w,
            device=sdev,
            graph_in=graph_in,
        )
        return sampler, adaptive
    sampler = LocalitySampler(
        ds.graph,
        fanouts,
        hot_ids=setup.gpu_ids,
        scale=float(scale),
        seed=cfg.seed,
        num_threads=cfg.threads,
        prune=prune,
        weights=w,
        device=sdev,
        graph_in=graph_in,
        cuda_graph=graph_mode(cfg, "sampler"),
    )
    return sampler, adaptive


def edge_weights(cfg) -> str:
    """The samplers' ``weights`` mode for the model: SAGE with ``edge_weight_norm="sum"`` adds
    ``sum_j w_j x_j`` and so needs ``1 / (deg(i) q_j)`` (``"ht_mean"``: the Horvitz-Thompson
    estimate of the neighbour mean, unbiased); every other model and SAGE's default ``"mean"``
    (the Hajek ratio ``sum_j w_j x_j / sum_j w_j``, consistent, not unbiased) take ``1 / q_j``
    (``"ht"``; GIN's sum of it is the unbiased neighbour sum)."""
    sum_form = getattr(cfg, "edge_weight_norm", "mean") == "sum"
    return "ht_mean" if sum_form and getattr(cfg, "model", "sage") == "sage" else "ht"


def sampler_placement(ds, cfg) -> tuple[torch.device | None, str]:
    """Where the uniform (LABOR-0, LADIES, pruned) sampler runs and where its topology lives:
    ``(None, "gpu")`` for the CPU sampler; for ``--sampler-device cuda`` the training GPU and ``--graph-in`` (``auto``: the
    CSR copied to the GPU when it takes at most a quarter of the free device memory, else read
    from pinned host memory, zero-copy: UVA sampling). ``--sampler-device auto`` (the default):
    the GPU sampler with the CSR on the GPU when :func:`_gpu_sampler_applies` and it fits there,
    else the CPU sampler."""
    want = getattr(cfg, "sampler_device", "cpu")
    if want == "cpu" or (want == "auto" and not _gpu_sampler_applies(cfg)):
        return None, "gpu"
    from ..utils.devices import resolve_device

    dev = resolve_device(cfg.device)
    graph_in = cfg.graph_in
    if graph_in == "auto":
        csr_bytes = np.asarray(ds.graph.indptr).nbytes + np.asarray(ds.graph.indices).nbytes
        csr_bytes += member_index_bytes(ds, cfg)
        free, _total = torch.cuda.mem_get_info(dev)
        graph_in = "gpu" if csr_bytes <= free // 4 else "host"
        if want == "auto" and graph_in == "host":  # auto: the GPU sampler when the graph fits
            return None, "gpu"
    return dev, graph_in


def member_index_bytes(ds, cfg) -> int:
    """The locality-aware sampler's member index on the sampling device, an upper bound before
    it is built (0 without ``--locality-scale``; the uniform and LADIES ones build the same,
    :meth:`~gnnio.sampling.LocalitySampler._member_index`): per layer a pointer of ``N + 1``
    int64 and the CSR positions (int32 below 2^31 in-neighbours) whose neighbour is in the
    layer's Q' -- at most ``|B|`` nodes (``Q'_1 = B``, the others ``q_size = |B|``), so at most
    the sum of the ``|B|`` largest out-degrees. Not the hot fraction of the edges: B and the Q'
    are hubs (R-MAT, 20k nodes: the top 10 % are the neighbour at 68 % of the positions)."""
    if getattr(cfg, "locality_scale", None) is None:
        return 0
    from ..features.tiers.tiered import hot_rows_for_fraction

    fo = cfg.fanouts
    layers = len(fo.split(",")) if isinstance(fo, str) else len(fo)
    indptr, indices = np.asarray(ds.graph.indptr), np.asarray(ds.graph.indices)
    n, edges = int(indptr.shape[0]) - 1, int(indices.shape[0])
    frac = min(1.0, float(cfg.gpu_cache_fraction or 0.0)) or 1.0  # (B from a placement: all)
    k = hot_rows_for_fraction(frac, n)
    if k < n:  # (the k nodes met most often as neighbours)
        deg = np.bincount(indices, minlength=n)
        edges = int(np.partition(deg, n - k)[n - k :].sum())
    item = 4 if n == 0 or int(np.diff(indptr).max()) < 2**31 else 8  # (as _member_index)
    return layers * (8 * (n + 1) + item * edges)


def _gpu_sampler_applies(cfg) -> bool:
    """``--sampler-device auto``: training on a GPU with a sampler that has a GPU implementation
    (:func:`has_gpu_sampler`)."""
    return str(cfg.device).startswith("cuda") and has_gpu_sampler(cfg)


def has_gpu_sampler(cfg) -> bool:
    """Whether ``cfg``'s sampler has a GPU implementation: uniform (pruned, locality-aware),
    LABOR-0 and LABOR-i, LADIES (locality-aware too: :mod:`gnnio.sampling.ladies_torch`): today
    every sampler; a sampler with CPU kernels only would return False here."""
    return getattr(cfg, "sampler", "uniform") in ("uniform", "labor", "ladies")


def _top_ids(score: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` highest-scoring ids, hottest first (ties: lower id first)."""
    from ..preprocess.reorder import order_by_score

    return order_by_score(score)[:k]


def build_order(ds, cfg, seeds: np.ndarray, labels, batch_size: int, seed: int):
    """The training seed order: ``random`` (seeded shuffle per epoch) or ``po`` (BGL's
    proximity-aware order; number of BFS sequences from the shuffling-error bound unless
    ``cfg.po_sequences`` fixes it)."""
    seeds_t = torch.from_numpy(np.asarray(seeds, dtype=np.int64))
    if cfg.order == "po":
        from ..ordering.po import ProximityOrder

        return ProximityOrder(
            ds.graph,
            seeds_t,
            np.asarray(labels),
            batch_size,
            seed=seed,
            num_sequences=cfg.po_sequences,
            progress=cfg.progress,
        )
    from ..ordering import RandomOrder

    return RandomOrder(seeds_t, batch_size, seed=seed)
