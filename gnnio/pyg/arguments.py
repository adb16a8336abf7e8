"""Every argument of PyG's ``NeighborLoader`` (and of the ``DataLoader`` it passes ``**kwargs``
to), and what :class:`gnnio.pyg.NeighborLoader` does with it: implemented, mapped onto gnnio's
pipeline threads (named in one warning per loader), or refused with one :class:`UsageError`
naming the argument. :data:`ARGUMENTS` is the table docs/pyg.md shows; the tests walk it.
"""

from __future__ import annotations

import os

from ..errors import UsageError
from ..utils.warnings_at import warn

__all__ = ["ARGUMENTS", "LoaderOptions", "check_refused", "loader_options"]

#: argument -> (what gnnio does: "implemented" | "mapped" | "refused", how)
ARGUMENTS: dict[str, tuple[str, str]] = {
    "data": ("implemented", "a `Data` (converted once to a cache directory keyed by its content "
             "hash; other attributes read from it per batch), a `(FeatureStore, GraphStore)` "
             "pair, a gnnio `Dataset` or a dataset path"),
    "num_neighbors": ("implemented", "a list per hop, `-1` = all; a dict (heterogeneous) is refused"),
    "input_nodes": ("implemented", "`None`, a bool mask, node ids, `(None, mask or ids)`; a "
                    "node type (heterogeneous) is refused"),
    "replace": ("implemented", "`fanout` draws with replacement per node with a neighbour"),
    "subgraph_type": ("implemented", "`'directional'`; `'bidirectional'` and `'induced'` are refused"),
    "directed": ("implemented", "`True`; `False` (PyG: `subgraph_type='induced'`) is refused"),
    "disjoint": ("implemented", "one subgraph per seed, `batch.batch` maps nodes to seeds"),
    "transform": ("implemented", "called on every batch"),
    "filter_per_worker": ("implemented", "`True` / `None`: rows gathered on gnnio's gather "
                          "thread; `False`: on the consumer's thread, batch by batch"),
    "is_sorted": ("implemented", "accepted; gnnio builds its CSR with a stable sort either way"),
    "batch_size": ("implemented", "as PyG"),
    "shuffle": ("implemented", "a permutation per epoch from torch's generator (or `generator`)"),
    "drop_last": ("implemented", "as PyG"),
    "generator": ("implemented", "each epoch draws its shuffle and sampling seed from it"),
    "timeout": ("implemented", "seconds to wait for a batch before the loader names the stuck "
                "stage (`LoaderStall`); `0` = wait forever"),
    "num_workers": ("mapped", "sampling threads of gnnio's pipeline (at least 1, at most the "
                    "CPU count); no processes are started"),
    "prefetch_factor": ("mapped", "batches gnnio's pipeline prepares ahead (default 2)"),
    "persistent_workers": ("mapped", "no effect: gnnio's stage threads start with each epoch "
                           "(threads, not processes: milliseconds)"),
    "pin_memory": ("mapped", "no effect: batches for a GPU are always staged in pinned host "
                   "memory; CPU batches are not pinned"),
    "pin_memory_device": ("mapped", "no effect (see `pin_memory`)"),
    "worker_init_fn": ("mapped", "not called: gnnio's workers are threads of this process, which "
                       "already holds its state"),
    "multiprocessing_context": ("mapped", "no effect: no worker processes"),
    "in_order": ("mapped", "batches always arrive in order"),
    "input_time": ("refused", "temporal sampling"),
    "time_attr": ("refused", "temporal sampling"),
    "temporal_strategy": ("refused", "temporal sampling (only the default is accepted)"),
    "weight_attr": ("refused", "weighted sampling"),
    "transform_sampler_output": ("refused", "gnnio's sampler output is not PyG's `SamplerOutput`"),
    "neighbor_sampler": ("refused", "pass gnnio options (`store=`, `device=`) instead"),
    "sampler": ("refused", "the seed order is gnnio's (`shuffle`, `drop_last`)"),
    "batch_sampler": ("refused", "the seed order is gnnio's (`batch_size`, `shuffle`, `drop_last`)"),
    "collate_fn": ("refused", "batches are built by gnnio (use `transform`)"),
}  # fmt: skip

_DATALOADER_DEFAULTS = {
    "batch_size": 1,
    "shuffle": False,
    "drop_last": False,
    "generator": None,
    "timeout": 0,
    "num_workers": 0,
    "prefetch_factor": None,
    "persistent_workers": False,
    "pin_memory": False,
    "pin_memory_device": "",
    "worker_init_fn": None,
    "multiprocessing_context": None,
    "in_order": True,
    "sampler": None,
    "batch_sampler": None,
    "collate_fn": None,
}


def refuse(name: str, value, why: str) -> UsageError:
    return UsageError(f"NeighborLoader: {name}={value!r} is not supported by gnnio ({why})")


def check_refused(**given) -> None:
    """Raise for the first refused argument set to something other than its PyG default."""
    defaults = {"temporal_strategy": "uniform"}
    for name, value in given.items():
        if value is not None and value != defaults.get(name):
            raise refuse(name, value, ARGUMENTS[name][1])


class LoaderOptions:
    """The ``DataLoader`` keyword arguments as gnnio's settings."""

    batch_size: int
    shuffle: bool
    drop_last: bool
    generator: object
    stall_timeout: float | None
    num_workers: int
    prefetch: int


def loader_options(kwargs: dict) -> LoaderOptions:
    """Check ``kwargs`` (unknown names are a UsageError naming them), warn once about the mapped
    knobs set to non-defaults, and return the settings gnnio uses."""
    unknown = sorted(set(kwargs) - set(_DATALOADER_DEFAULTS))
    if unknown:
        raise UsageError(f"NeighborLoader: unexpected argument {unknown[0]!r}")
    kw = {**_DATALOADER_DEFAULTS, **kwargs}
    for name in ("sampler", "batch_sampler", "collate_fn"):
        if kw[name] is not None:
            raise refuse(name, type(kw[name]).__name__, ARGUMENTS[name][1])
    o = LoaderOptions()
    o.batch_size = int(kw["batch_size"])
    if o.batch_size < 1:
        raise UsageError(f"NeighborLoader: batch_size must be >= 1, got {kw['batch_size']}")
    o.shuffle, o.drop_last, o.generator = (
        bool(kw["shuffle"]),
        bool(kw["drop_last"]),
        kw["generator"],
    )
    if kw["timeout"] < 0:
        raise UsageError(f"NeighborLoader: timeout must be >= 0, got {kw['timeout']}")
    o.stall_timeout = float(kw["timeout"]) if kw["timeout"] else None
    nw = int(kw["num_workers"])
    if nw < 0:
        raise UsageError(f"NeighborLoader: num_workers must be >= 0, got {nw}")
    o.num_workers = max(1, min(nw, os.cpu_count() or 1))
    pf = kw["prefetch_factor"]
    if pf is not None and int(pf) < 1:
        raise UsageError(f"NeighborLoader: prefetch_factor must be >= 1, got {pf}")
    o.prefetch = 2 if pf is None else int(pf)
    notes = []
    if nw != 0:
        notes.append(f"num_workers={nw} -> {o.num_workers} sampling thread(s)")
    if pf is not None:
        notes.append(f"prefetch_factor={pf} -> {o.prefetch} batches prepared ahead")
    for name in ("persistent_workers", "pin_memory", "pin_memory_device", "worker_init_fn",
                 "multiprocessing_context", "in_order"):  # fmt: skip
        if kw[name] != _DATALOADER_DEFAULTS[name]:
            notes.append(f"{name}: {ARGUMENTS[name][1]}")
    if notes:
        warn(
            "gnnio.pyg.NeighborLoader runs its workers as threads of gnnio's pipeline: "
            + "; ".join(notes)
        )
    return o
