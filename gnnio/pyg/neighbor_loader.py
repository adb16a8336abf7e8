""":class:`NeighborLoader`: PyG's ``NeighborLoader`` by name and signature, on gnnio's pipeline, so
a PyG script moves to gnnio by changing one import line::

    from torch_geometric.loader import NeighborLoader   # before
    from gnnio.pyg import NeighborLoader                # after

What each of PyG's arguments does here is :data:`gnnio.pyg.arguments.ARGUMENTS` (implemented,
mapped onto the pipeline's threads with one warning, or refused with one error naming it). The
batches are PyG's (fields, order, ``trim_to_layer`` layout; see :mod:`gnnio.pyg.batch`), sampled
with PyG's semantics by :class:`~gnnio.sampling.frontier.FrontierSampler` (pyg-lib's random
numbers are not reproduced), and:

* **safe to keep**: each batch has its own ``x`` (``reuse_buffers=False``); ``reuse_buffers=True``
  gathers into gnnio's ring of buffers instead, and then a batch's ``x`` on the CPU is valid only
  until the next batch is requested;
* **x as PyG's**: ``batch.x`` is ``data.x[n_id]``, in ``data.x``'s own dtype. float32, float16
  and bfloat16 rows are read from the converted copy (bfloat16 decoded from its stored bits); any
  other dtype (float64, int64 ids for an ``nn.Embedding``, ...) from ``data.x`` itself, held in
  host memory (``store=`` does not apply to it). Over a gnnio dataset, ``x`` is ``loader.data.x``'s
  rows: bfloat16 datasets give bfloat16, int8 ones float32 dequantized (as :class:`PyGLoader`);
  over a store pair, what ``feature_store.get_tensor`` gives;
* **on the device of** ``data.x`` (the user moved it there), unless ``device=`` says otherwise;
* **seeded from torch**: every ``iter(loader)`` draws one number from ``generator`` (default:
  torch's global generator, so ``seed_everything`` / ``torch.manual_seed`` take effect), which
  keys that epoch's shuffle and sampling; the sampler's own seed is the ``torch.distributed`` rank,
  so ranks seeded alike still draw distinct neighbours. ``loader.epoch(e)`` replays a given key.

``loader.data`` is what PyG's is: the ``Data`` passed in (for a gnnio dataset, a ``Data`` view of
it built on first use; for a store pair, the pair). Each epoch reads it again: without an ``x``
attribute (``del loader.data.x``) no feature row is read; a replaced ``x`` is served from the new
tensor; every other node attribute (``y``, masks, an added ``n_id``) is indexed by the batch's
``n_id`` and every edge attribute by its ``e_id``, as PyG's ``filter_data`` does.
``loader.dataset`` holds the input nodes (``len(loader.dataset)`` seeds per epoch).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import numpy as np
import torch
from torch_geometric.data import Data

from ..errors import UsageError
from ..features.stores.memory import InMemoryFeatureStore
from ..ordering.shuffle import RandomOrder
from ..pipeline.loader import LoaderStats, NodeLoader
from ..sampling.frontier import FrontierSampler
from .arguments import check_refused, loader_options, refuse
from .batch import to_pyg_data
from .data_input import resolve_data
from .disjoint import DisjointSampler
from .loader import InOrder, _user_rows, compressed

__all__ = ["NeighborLoader"]

#: the fields the sampler sets on a batch (a user's attribute of the same name is overwritten)
_SAMPLED = {"edge_index", "n_id", "e_id", "num_sampled_nodes", "num_sampled_edges", "input_id",
            "batch_size", "batch"}  # fmt: skip


def _rank() -> int:
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _input_nodes(input_nodes, num_nodes: int) -> tuple[torch.Tensor, bool]:
    """``(seeds, by_id)`` as PyG reads ``input_nodes`` (``by_id``: ``input_id`` is the node id
    itself, as for None or a mask, rather than the position in an id list)."""
    if isinstance(input_nodes, tuple):
        if len(input_nodes) != 2 or input_nodes[0] is not None:
            raise refuse("input_nodes", f"({input_nodes[0]!r}, ...)",
                         "a node type: gnnio samples homogeneous graphs only")  # fmt: skip
        input_nodes = input_nodes[1]
    if isinstance(input_nodes, str):
        raise refuse("input_nodes", input_nodes, "a node type: homogeneous graphs only")
    if input_nodes is None:
        return torch.arange(num_nodes), True
    t = torch.as_tensor(input_nodes).detach().cpu()
    if t.dtype == torch.bool:
        if t.shape != (num_nodes,):
            raise UsageError(
                f"NeighborLoader: input_nodes as a mask needs shape [{num_nodes}], got "
                f"{list(t.shape)}"
            )
        return t.nonzero().view(-1), True
    if t.dim() != 1 or t.is_floating_point():
        raise UsageError("NeighborLoader: input_nodes must be None, a bool mask or 1-D node ids")
    t = t.long()
    if t.numel() and (int(t.min()) < 0 or int(t.max()) >= num_nodes):
        raise UsageError(f"NeighborLoader: input_nodes ids must lie in [0, {num_nodes})")
    if t.unique().numel() != t.numel():
        raise UsageError("NeighborLoader: input_nodes ids must be distinct")
    return t, False


def _device(device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise UsageError(f"NeighborLoader: device={device!r} is not a torch device") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"NeighborLoader: device={device!r}, but CUDA is not available")
    return dev


class NeighborLoader:
    """PyG's ``NeighborLoader`` on gnnio (module docstring; arguments as in PyG, see
    :data:`~gnnio.pyg.arguments.ARGUMENTS`).

    gnnio's own keyword arguments:
        device: where batches are delivered (default: the device of ``data.x``).
        reuse_buffers: gather into a ring of buffers (module docstring); default False.
        store: ``"memory"`` (default) or ``"mmap"``: how the converted features are held.
        cache_dir: where a ``Data`` is converted (default ``$GNNIO_CACHE/pyg``).
        threads: CPU threads of the feature gather kernel.
    """

    def __init__(
        self,
        data,
        num_neighbors,
        input_nodes=None,
        input_time=None,
        replace: bool = False,
        subgraph_type="directional",
        disjoint: bool = False,
        temporal_strategy: str = "uniform",
        time_attr: str | None = None,
        weight_attr: str | None = None,
        transform=None,
        transform_sampler_output=None,
        is_sorted: bool = False,
        filter_per_worker: bool | None = None,
        neighbor_sampler=None,
        directed: bool = True,
        *,
        device=None,
        reuse_buffers: bool = False,
        store: str = "memory",
        cache_dir=None,
        threads: int | None = None,
        **kwargs,
    ) -> None:
        check_refused(input_time=input_time, time_attr=time_attr, weight_attr=weight_attr,
                      temporal_strategy=temporal_strategy, neighbor_sampler=neighbor_sampler,
                      transform_sampler_output=transform_sampler_output)  # fmt: skip
        if isinstance(num_neighbors, dict):
            raise refuse("num_neighbors", "{...}", "per edge type: homogeneous graphs only")
        if not directed:
            raise refuse("directed", False, "it means subgraph_type='induced', not built")
        kind = str(getattr(subgraph_type, "value", subgraph_type))
        if kind != "directional":
            raise refuse("subgraph_type", kind, "only 'directional' is built")
        if transform is not None and not callable(transform):
            raise UsageError("NeighborLoader: transform must be callable")
        opts = loader_options(kwargs)
        self.options = opts
        src = resolve_data(data, store, cache_dir, threads)
        self._src = src
        self._data = src.data
        self.num_nodes = src.graph.num_nodes
        seeds, self._by_id = _input_nodes(input_nodes, self.num_nodes)
        self.dataset = seeds
        if not self._by_id:
            self._seed_pos = np.argsort(seeds.numpy(), kind="stable")
            self._sorted_seeds = seeds.numpy()[self._seed_pos]
        try:
            base = FrontierSampler(src.graph, list(num_neighbors), seed=_rank(), replace=replace)
        except ValueError as e:
            raise UsageError(f"NeighborLoader: num_neighbors: {e}") from None
        self.num_neighbors = base.fanouts
        self.sampler = DisjointSampler(base) if disjoint else base
        self.disjoint, self.replace = bool(disjoint), bool(replace)
        self.order: RandomOrder | InOrder
        if opts.shuffle:
            self.order = RandomOrder(seeds, opts.batch_size, seed=0, drop_last=opts.drop_last)
        else:
            self.order = InOrder(seeds, opts.batch_size, drop_last=opts.drop_last)
        self.batch_size = opts.batch_size
        self.device = src.device if device is None else _device(device)
        self.store = src.store
        #: the codec of compressed rows from ``src.store`` (decoded per batch), else None
        self._codec = src.codec
        if src.dataset is not None:
            self._codec = compressed(src.dataset.feature_codec)
        self.transform = transform
        self.filter_per_worker = filter_per_worker
        self.reuse_buffers = bool(reuse_buffers)
        self.generator = opts.generator
        self.loader: NodeLoader | None = None
        self._x_store: tuple[object, InMemoryFeatureStore] | None = None
        self._empty = InMemoryFeatureStore(torch.empty((self.num_nodes, 0)))

    # ---- PyG's attributes --------------------------------------------------------------------

    @property
    def data(self):
        """PyG's ``loader.data`` (module docstring)."""
        if self._data is None and self._src.dataset is not None:
            from ..importers.pyg import to_pyg

            self._data = to_pyg(self._src.dataset)
            self._src.x_ref = self._data.x
        return self._data

    @data.setter
    def data(self, value) -> None:
        self._data = value

    def __len__(self) -> int:
        return int(self.order.num_batches)

    @property
    def stats(self) -> LoaderStats | None:
        """The :class:`~gnnio.pipeline.loader.LoaderStats` of the last epoch iterated."""
        return None if self.loader is None else self.loader.stats

    # ---- epochs --------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Data]:
        gen = cast(torch.Generator | None, self.generator)
        key = int(torch.randint(0, 2**31 - 1, (1,), generator=gen).item())
        return self.epoch(key)

    def epoch(self, key: int) -> Iterator[Data]:
        """The batches of the epoch keyed ``key`` (what ``iter(loader)`` draws from torch): the
        shuffle and the sampling depend only on it, the rank and the loader's settings."""
        self.close()  # one epoch at a time, as gnnio's NodeLoader
        x_store = self._x_source()
        in_pipeline = x_store is not None and self.filter_per_worker is not False
        self.loader = NodeLoader(
            self.sampler,
            x_store if in_pipeline else self._empty,
            self.order,
            device=self.device,
            prefetch=self.options.prefetch,
            num_workers=self.options.num_workers,
            reuse_buffers=self.reuse_buffers,
            stall_timeout=self.options.stall_timeout,
        )
        late = None if in_pipeline else x_store  # gathered on this thread (filter_per_worker)
        decode = self._codec is not None and x_store is self._src.store
        return self._batches(self.loader.epoch(int(key)), in_pipeline, late, decode)

    def _batches(self, it, in_pipeline: bool, late, decode: bool) -> Iterator[Data]:
        try:
            for mb in it:
                if late is not None:
                    mb.x = late.gather(mb.input_nodes.cpu()).to(self.device)
                elif not in_pipeline:
                    mb.x = None
                if decode and mb.x is not None:  # bfloat16 bits / int8 codes: the user's rows
                    mb.x = _user_rows(mb.x, self._codec, self)
                batch = self.convert(mb)
                yield batch if self.transform is None else self.transform(batch)
        finally:
            it.close()

    def _x_source(self):
        """The store ``x`` is read from this epoch, or None (``loader.data`` has no ``x``)."""
        d = self._data
        if d is None or isinstance(d, tuple):
            return self._src.store
        x = getattr(d, "x", None) if "x" in d else None
        if x is None:
            return None
        if x is self._src.x_ref:
            return self._src.store
        if self._x_store is None or self._x_store[0] is not x:  # a replaced data.x
            self._x_store = (x, InMemoryFeatureStore(torch.as_tensor(x).detach().cpu()))
        return self._x_store[1]

    # ---- one batch -----------------------------------------------------------------------------

    def input_id(self, seeds: torch.Tensor) -> torch.Tensor:
        s = seeds.cpu()
        if self._by_id:
            return s
        return torch.from_numpy(self._seed_pos[np.searchsorted(self._sorted_seeds, s.numpy())])

    def convert(self, mb) -> Data:
        """One gnnio batch as PyG's ``Data`` (fields of :mod:`gnnio.pyg.batch`, plus the
        attributes of ``loader.data``)."""
        dev = self.device
        ds, d = self._src.dataset, self._data
        labels = masks = None
        if d is None and ds is not None and ds.labels is not None:  # (view not built yet)
            labels = self._labels()
            masks = self._masks()
        out = to_pyg_data(mb, labels=labels, masks=masks, edge_ids=self._src.edge_ids,
                          input_id=self.input_id(mb.seeds))  # fmt: skip
        if isinstance(d, Data):
            self._copy_attrs(d, out, mb.input_nodes, out.e_id)
        elif isinstance(d, tuple):
            y = self._pair_attr("y", mb.input_nodes)
            if y is not None:
                out.y = y.to(dev)
        if "batch" in mb.meta:
            out.batch = mb.meta["batch"].to(dev)
        return out

    def _copy_attrs(self, d: Data, out: Data, n_id: torch.Tensor, e_id: torch.Tensor) -> None:
        """PyG's ``filter_data`` for every attribute of ``d`` but ``x`` and the sampled fields."""
        dev = self.device
        for key, value in d.items():
            if key in _SAMPLED or key == "x":
                continue
            if key == "num_nodes":
                out.num_nodes = int(n_id.numel())
            elif isinstance(value, torch.Tensor) and d.is_node_attr(key):
                dim = d.__cat_dim__(key, value)
                out[key] = value.index_select(dim, n_id.to(value.device)).to(dev)
            elif isinstance(value, torch.Tensor) and d.is_edge_attr(key):
                dim = d.__cat_dim__(key, value)
                out[key] = value.index_select(dim, e_id.to(value.device)).to(dev)
            else:
                out[key] = value

    def _pair_attr(self, name: str, n_id: torch.Tensor):
        fs = self._data[0]
        if not any(a.attr_name == name for a in fs.get_all_tensor_attrs()):
            return None
        return fs.get_tensor(None, name, index=n_id.cpu())

    def _labels(self) -> torch.Tensor:
        if not hasattr(self, "_labels_t"):
            lab = np.asarray(self._src.dataset.labels, dtype=np.int64)
            self._labels_t = torch.from_numpy(lab).to(self.device)
        return self._labels_t

    def _masks(self) -> dict[str, torch.Tensor]:
        if not hasattr(self, "_masks_t"):
            from .loader import _SPLITS

            ds, self._masks_t = self._src.dataset, {}
            for key, name in {v[0]: v[1] for v in _SPLITS.values()}.items():
                ids = getattr(ds, key)
                if ids is not None:
                    m = torch.zeros(self.num_nodes, dtype=torch.bool)
                    m[torch.from_numpy(np.asarray(ids, dtype=np.int64))] = True
                    self._masks_t[name] = m.to(self.device)
        return self._masks_t

    def close(self) -> None:
        """Stop the running epoch's stage threads, if any."""
        if self.loader is not None:
            self.loader.close()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(batches={len(self)}, num_neighbors={self.num_neighbors}, "
            f"disjoint={self.disjoint}, device={self.device})"
        )
