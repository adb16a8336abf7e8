""":class:`PyGLoader`: gnnio's pipelined loader, yielding PyG ``Data`` batches in
``NeighborLoader``'s format (see :mod:`gnnio.pyg.batch` for the fields).

It wraps a :class:`~gnnio.pipeline.loader.NodeLoader` (sampling, gather and transfer run as
overlapped background stages) and converts each batch on the consumer's thread; the conversion
only indexes ``y``, the masks and ``input_id`` by the batch's ids. Everything of gnnio's data I/O
stays available behind it: pass any gnnio feature store (tiered, cached, multi-GPU placement, the
rank-sharded store of :mod:`gnnio.distributed`), any sampler (locality-aware, pruned) and any seed order
(BGL's proximity-aware order), or build all three from a :class:`~gnnio.train.TrainConfig` with
:meth:`PyGLoader.from_config`.

Differences from ``NeighborLoader`` a user may notice:

* epochs: each ``iter(loader)`` starts the next epoch (a new shuffle), like a ``DataLoader``;
  :meth:`PyGLoader.epoch` runs a given one. The shuffle is gnnio's seeded order (``seed``,
  ``epoch``), not torch's global generator, so runs repeat exactly;
* each batch has its own ``x`` and may be kept (``reuse_buffers=False``, the default);
  ``reuse_buffers=True`` gathers into the loader's ring of buffers instead: ``batch.x`` on the CPU
  is then a slot of the ring, valid only until the next batch is requested;
* batches arrive on ``device`` already (``batch.to(device)`` is then a no-op);
* the random draws differ from pyg-lib's (layout and semantics are the same with the default
  ``expand="new"``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch_geometric.data import Data

from ..errors import UsageError
from ..features.base import FeatureStore
from ..ordering.shuffle import RandomOrder, SeedOrder
from ..pipeline.loader import LoaderStats, NodeLoader
from ..sampling.frontier import FrontierSampler
from .batch import to_pyg_data

__all__ = ["PyGLoader", "InOrder", "EXPANDS"]

#: ``"new"``: PyG's semantics (only new nodes are expanded); ``"all"``: gnnio's blocks
EXPANDS = ("new", "all")
#: split name -> (dataset attribute, PyG mask name)
_SPLITS = {
    "train": ("train_idx", "train_mask"),
    "valid": ("valid_idx", "val_mask"),
    "val": ("valid_idx", "val_mask"),
    "test": ("test_idx", "test_mask"),
}


class InOrder(SeedOrder):
    """The seeds in the order given, every epoch (``NeighborLoader(shuffle=False)``)."""

    def epoch_order(self, epoch: int) -> np.ndarray:
        return self.seeds


def _open_dataset(data):
    import os

    from ..graph.dataset import Dataset, load

    if isinstance(data, Dataset):
        return data
    if not isinstance(data, (str, os.PathLike)):
        raise UsageError(
            f"data: PyGLoader takes a gnnio dataset or its path, got {type(data).__name__}; for a "
            "PyG Data use gnnio.pyg.NeighborLoader (or gnnio.from_pyg first)"
        )
    return load(data)


def resolve_input_nodes(ds, input_nodes) -> tuple[np.ndarray, bool]:
    """``(seeds, by_id)``: the loader's input nodes as int64 global ids, and whether
    ``input_id`` is the node id itself (PyG: no ``input_nodes``, or a bool mask; a split name
    counts as its mask) rather than the position in ``seeds`` (an index list)."""
    n = ds.num_nodes
    if input_nodes is None:
        return np.arange(n, dtype=np.int64), True
    if isinstance(input_nodes, str):
        if input_nodes not in _SPLITS:
            raise UsageError(
                f"input_nodes: unknown split {input_nodes!r}; use one of {', '.join(_SPLITS)}"
            )
        ids = getattr(ds, _SPLITS[input_nodes][0])
        if ids is None:
            raise UsageError(f"input_nodes: the dataset has no '{input_nodes}' split")
        return np.sort(np.asarray(ids, dtype=np.int64)), True
    if isinstance(input_nodes, torch.Tensor):
        input_nodes = input_nodes.detach().cpu().numpy()
    arr = np.asarray(input_nodes)
    if arr.dtype == np.bool_:
        if arr.shape != (n,):
            raise UsageError(f"input_nodes: a bool mask needs shape [{n}], got {list(arr.shape)}")
        return np.flatnonzero(arr).astype(np.int64), True
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise UsageError("input_nodes: need None, a split name, a bool mask or 1-D node ids")
    arr = arr.astype(np.int64)
    if arr.size and (arr.min() < 0 or arr.max() >= n):
        raise UsageError(f"input_nodes: node ids must lie in [0, {n})")
    if np.unique(arr).shape[0] != arr.shape[0]:
        raise UsageError("input_nodes: node ids must be distinct")
    return arr, False


class PyGLoader:
    """Mini-batches of a gnnio dataset as PyG ``Data``, laid out as ``NeighborLoader``'s.

    Args:
        data: a :class:`gnnio.Dataset` or the path of a prepared dataset.
        num_neighbors: neighbours per node for hop 1, 2, ... (``-1`` = all), as in PyG.
        input_nodes: seeds: None (all nodes), a split name (``"train"``, ``"valid"``/``"val"``,
            ``"test"``; like passing PyG's ``data.train_mask``), a bool mask ``[N]`` or node ids.
        batch_size, shuffle, drop_last: as for ``NeighborLoader``.
        expand: ``"new"`` (default) samples with PyG's semantics
            (:class:`~gnnio.sampling.frontier.FrontierSampler`: only nodes new at the previous
            hop are expanded); ``"all"`` with gnnio's (:class:`~gnnio.sampling.UniformSampler`:
            every node reached so far is expanded again at each hop). Ignored when ``sampler``
            is given.
        store: a gnnio feature store, or ``"memory"`` / ``"mmap"`` to open a plain one.
        sampler: a gnnio sampler (then ``num_neighbors`` and ``expand`` are not used).
        order: a gnnio seed order (e.g. :class:`~gnnio.ordering.po.ProximityOrder`); its seeds
            are the input nodes (``input_id`` = their positions) and ``input_nodes``,
            ``shuffle`` and ``drop_last`` must be left at their defaults.
        device: where batches are delivered.
        prefetch, num_workers: of the :class:`NodeLoader` (``num_workers`` are sampling threads).
        reuse_buffers: gather into a ring of buffers (faster on the CPU, but ``batch.x`` is then
            overwritten once the next batch is requested); default False: batches may be kept.
        seed: seeds the sampler and the shuffle.
        masks: add ``train_mask`` / ``val_mask`` / ``test_mask`` of ``n_id`` for the splits the
            dataset has (Planetoid-style ``Data`` carries them).
        threads: CPU threads of ``expand="all"``'s sampler and of the store's gather kernel.
    """

    def __init__(
        self,
        data,
        num_neighbors: Sequence[int] | None = None,
        input_nodes=None,
        batch_size: int = 1,
        shuffle: bool = False,
        drop_last: bool = False,
        expand: str = "new",
        store: FeatureStore | str = "memory",
        sampler=None,
        order: SeedOrder | None = None,
        device: str | torch.device = "cpu",
        prefetch: int = 2,
        num_workers: int = 1,
        reuse_buffers: bool = False,
        seed: int = 0,
        masks: bool = True,
        threads: int | None = None,
    ) -> None:
        ds = _open_dataset(data)
        self.dataset = ds
        if sampler is None:
            if expand not in EXPANDS:
                raise UsageError(f"expand: must be one of {', '.join(EXPANDS)}, got {expand!r}")
            if num_neighbors is None:
                raise UsageError("num_neighbors: required unless a sampler is given")
            if expand == "new":
                sampler = FrontierSampler(ds.graph, num_neighbors, seed=seed)
            else:
                from ..sampling.uniform import UniformSampler

                sampler = UniformSampler(ds.graph, num_neighbors, seed=seed, num_threads=threads)
        self.sampler = sampler
        self.expand = "new" if isinstance(sampler, FrontierSampler) else "all"
        if isinstance(store, str):
            from ..features import open_store

            store = open_store(ds, store, num_threads=threads, progress=False)
        self.store = store
        if order is None:
            seeds, self._by_id = resolve_input_nodes(ds, input_nodes)
            cls = RandomOrder if shuffle else InOrder
            kw: dict[str, Any] = {"seed": seed} if shuffle else {}
            order = cls(seeds, batch_size, drop_last=drop_last, **kw)
        else:
            if input_nodes is not None or shuffle or drop_last:
                raise UsageError("order: leave input_nodes, shuffle and drop_last unset with it")
            self._by_id = False
        self.order = order
        if not self._by_id:  # seed -> position lookups for input_id
            self._seed_pos = np.argsort(order.seeds, kind="stable")
            self._sorted_seeds = order.seeds[self._seed_pos]
        dev = torch.device(device)
        self.device = dev
        self.labels = None
        if ds.labels is not None:
            self.labels = torch.from_numpy(np.asarray(ds.labels, dtype=np.int64)).to(dev)
        self.masks: dict[str, torch.Tensor] = {}
        if masks:
            for key, name in {v[0]: v[1] for v in _SPLITS.values()}.items():
                ids = getattr(ds, key)
                if ids is not None:
                    m = torch.zeros(ds.num_nodes, dtype=torch.bool)
                    m[torch.from_numpy(np.asarray(ids, dtype=np.int64))] = True
                    self.masks[name] = m.to(dev)
        ex = ds.extra
        self.edge_ids = (
            torch.from_numpy(np.asarray(ex["pyg_edge_id"])) if "pyg_edge_id" in ex else None
        )
        self.edge_attr = torch.from_numpy(ex["edge_attr"]) if "edge_attr" in ex else None
        self.loader = NodeLoader(
            sampler,
            store,
            order,
            labels=None,
            device=dev,
            prefetch=prefetch,
            num_workers=num_workers,
            reuse_buffers=reuse_buffers,
        )
        self._next_epoch = 0

    @classmethod
    def from_config(
        cls, data, cfg, input_nodes="train", shuffle: bool = True, expand: str = "new", **kw
    ) -> PyGLoader:
        """A loader with the feature store, sampler and seed order that ``gnnio train`` would
        build from ``cfg`` (a :class:`~gnnio.train.TrainConfig`: tiering, caches, placement,
        ``po`` order, locality-aware sampling and pruning), over ``input_nodes``.

        ``expand="new"`` (PyG's semantics) samples with a
        :class:`~gnnio.sampling.frontier.FrontierSampler` and so refuses ``locality_scale``,
        ``prune_threshold`` and a ``sampler`` other than uniform, which only gnnio's samplers
        (``expand="all"``) implement. The ``po``
        order applies when ``shuffle``; ``locality_scale="auto"`` starts at its initial scale
        and stays there (Algorithm 2 runs in ``gnnio train``'s loop). ``kw`` goes to the
        constructor (``masks``, ``num_workers``, ``reuse_buffers``).
        """
        from ..train.setup import build_order, build_sampler, build_store, hot_score, needs_score

        if expand not in EXPANDS:
            raise UsageError(f"expand: must be one of {', '.join(EXPANDS)}, got {expand!r}")
        other = getattr(cfg, "sampler", "uniform") != "uniform"
        if expand == "new" and (cfg.locality_scale is not None or cfg.prune_threshold or other):
            raise UsageError(
                "expand='new' (PyG's sampling) has no locality-aware, pruned, LABOR or LADIES "
                "variant; use expand='all' for --locality-scale / --prune-threshold / --sampler"
            )
        ds = _open_dataset(data)
        device = torch.device(cfg.device)
        score = hot_score(ds, cfg, cfg.progress) if needs_score(ds, cfg) else None
        setup = build_store(ds, cfg, device, score)
        if expand == "new":
            sampler = FrontierSampler(ds.graph, cfg.fanouts, seed=cfg.seed)
        else:
            sampler, _ = build_sampler(ds, cfg, list(cfg.fanouts), setup)
        if shuffle:
            seeds, _ = resolve_input_nodes(ds, input_nodes)
            order = build_order(ds, cfg, seeds, ds.labels, cfg.batch_size, cfg.seed)
            return cls(ds, store=setup.store, sampler=sampler, order=order, device=device,
                       prefetch=cfg.prefetch, **kw)  # fmt: skip
        return cls(ds, input_nodes=input_nodes, batch_size=cfg.batch_size, store=setup.store,
                   sampler=sampler, device=device, prefetch=cfg.prefetch, **kw)  # fmt: skip

    def __len__(self) -> int:
        return len(self.loader)

    @property
    def stats(self) -> LoaderStats | None:
        """The :class:`~gnnio.pipeline.loader.LoaderStats` of the last epoch iterated."""
        return self.loader.stats

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next ``iter(loader)`` runs (later ones follow it)."""
        self._next_epoch = int(epoch)

    def __iter__(self) -> Iterator[Data]:
        epoch, self._next_epoch = self._next_epoch, self._next_epoch + 1
        return self.epoch(epoch)

    def epoch(self, epoch: int) -> Iterator[Data]:
        """The batches of ``epoch`` (seed order and random draws depend only on it and ``seed``)."""
        it = self.loader.epoch(epoch)
        try:
            for mb in it:
                yield self.convert(mb)
        finally:
            it.close()

    def input_id(self, seeds: torch.Tensor) -> torch.Tensor:
        """``input_id`` of a batch's seeds (see :func:`resolve_input_nodes`)."""
        s = seeds.cpu()
        if self._by_id:
            return s
        at = np.searchsorted(self._sorted_seeds, s.numpy())
        return torch.from_numpy(self._seed_pos[at])

    def convert(self, mb) -> Data:
        """One gathered :class:`~gnnio.sampling.base.MiniBatch` as a PyG ``Data`` batch."""
        codec = compressed(self.dataset.feature_codec)
        if mb.x is not None and codec is not None:
            mb.x = _user_rows(mb.x, codec, self)
        return to_pyg_data(
            mb,
            graph=self.dataset.graph,
            labels=self.labels,
            masks=self.masks,
            edge_ids=self.edge_ids,
            edge_attr=self.edge_attr,
            input_id=self.input_id(mb.seeds),
        )

    def close(self) -> None:
        """Stop the running epoch's stage threads, if any."""
        self.loader.close()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(batches={len(self)}, expand={self.expand!r}, "
            f"sampler={type(self.sampler).__name__}, store={type(self.store).__name__})"
        )


def compressed(codec):
    """``codec`` where its rows are stored compressed (bfloat16 bits as int16, int8 codes), so a
    PyG user reads them through :func:`_user_rows`; None otherwise (also for None)."""
    return codec if codec is not None and codec.feat_dtype in ("bfloat16", "int8") else None


def _user_rows(x: torch.Tensor, codec, loader) -> torch.Tensor:
    """Rows as a PyG user reads them: bfloat16 bits (int16) as a bfloat16 view, int8 rows
    dequantized to float32 on their device (:class:`~gnnio.train.decode.FeatureDecoder`, built
    once per loader); float32 and float16 rows are not touched."""
    if codec.feat_dtype == "bfloat16":
        return x.view(torch.bfloat16)
    dec = getattr(loader, "_decoder", None)
    if dec is None or dec.scale.device != x.device:
        from ..train.decode import FeatureDecoder

        dec = loader._decoder = FeatureDecoder(codec).to(x.device)
    return dec(x)
