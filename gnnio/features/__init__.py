"""Feature stores: ``gather(ids) -> rows`` with per-tier row/byte counters.

The contract is :class:`~gnnio.features.base.FeatureStore` (read it first). Implementations:

* :class:`InMemoryFeatureStore` — the whole matrix in RAM (tier "host") or on a GPU (tier "gpu").
* :class:`MmapFeatureStore` — a memory-mapped file; reads only the rows asked for (tier "disk").
* :class:`DiskFeatureStore` — the file read with ``O_DIRECT``, page-aware and in parallel; the page
  cache serves nothing (tier "disk"; the SSD tier under a host cache, issue 25).

Wrappers over another store (composition; each counts rows and bytes per tier):

* :class:`TieredFeatureStore` — hot rows on the GPU, cold rows in pinned host memory (Data Tiering).
* :class:`FeatureCache` — a static / FIFO / LRU / LFU cache (BGL, PaGraph); the compositions
  :func:`static_plus_dynamic` and :func:`two_level_cache` build stacks of them.
* :class:`ShardedFeatureCache` — one cache per GPU, sharded by ``id mod #GPUs`` (BGL).
* :class:`CrossBatchReuse` — rows the previous batch already brought are not fetched again (HyDRA).
* :class:`MultiDeviceFeatureStore` — per-GPU shards read through a placement (Song & Jiang).

The modules sit in three sub-packages that show the hierarchy (issue 25, item 6):

* ``features/stores/`` -- where every row lives: ``memory``, ``mmap``, ``disk`` (+ ``_direct_io``);
* ``features/tiers/`` -- a GPU tier over a host tier: ``tiered`` (+ ``tiered_cold``, ``uva``,
  ``row_source``, ``simdevice``) and ``multidevice``;
* ``features/caches/`` -- caches over any store: ``cache``, ``policy``, ``lookahead``, ``sieve``,
  ``multi``, ``reuse``.

What every layer shares stays here: the contract (``base``), the gather kernels (``_gather``,
``_triton_rows``), ``batch_ops`` and ``accounting``. The public names are exported from
``gnnio.features`` itself; import them from there.

The wrappers are imported on first use (PEP 562 ``__getattr__``), so ``import gnnio.features``
costs no more than the two base stores, and the placement / reorder modules the wrappers import
never form an import cycle with this package.

:func:`open_store` opens a base store over a prepared dataset.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..errors import UsageError
from ..utils.devices import resolve_device
from ..utils.pages import drop_pages
from ..utils.progress import bar
from ._gather import host_empty
from .base import FeatureStore, TierCounters
from .stores.memory import InMemoryFeatureStore
from .stores.mmap import MmapFeatureStore

if TYPE_CHECKING:  # the lazily exported names, for type checkers and IDEs
    from .caches.cache import FeatureCache, static_plus_dynamic, two_level_cache
    from .caches.multi import ShardedFeatureCache
    from .caches.reuse import CrossBatchReuse
    from .stores.disk import DiskFeatureStore
    from .tiers.multidevice import MultiDeviceFeatureStore
    from .tiers.tiered import TieredFeatureStore

__all__ = [
    "CrossBatchReuse",
    "DiskFeatureStore",
    "FeatureCache",
    "FeatureStore",
    "InMemoryFeatureStore",
    "MmapFeatureStore",
    "MultiDeviceFeatureStore",
    "ShardedFeatureCache",
    "TierCounters",
    "TieredFeatureStore",
    "open_store",
    "static_plus_dynamic",
    "two_level_cache",
]

#: exported name -> submodule defining it (imported on first attribute access)
_LAZY = {
    "TieredFeatureStore": "tiers.tiered",
    "FeatureCache": "caches.cache",
    "static_plus_dynamic": "caches.cache",
    "two_level_cache": "caches.cache",
    "ShardedFeatureCache": "caches.multi",
    "DiskFeatureStore": "stores.disk",
    "CrossBatchReuse": "caches.reuse",
    "MultiDeviceFeatureStore": "tiers.multidevice",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


STORE_KINDS = ("memory", "mmap", "disk")


def open_store(
    dataset,
    kind: str = "memory",
    device: str | torch.device = "cpu",
    num_threads: int | None = None,
    progress: bool = True,
    **kwargs,
) -> FeatureStore:
    """Open a feature store over a dataset's features.

    Args:
        dataset: a :class:`gnnio.Dataset` or the path of a dataset directory.
        kind: "memory" reads the features into RAM (or onto ``device`` if it is a GPU), with a
            progress bar; "mmap" keeps them in the memory-mapped file and reads rows on demand;
            "disk" reads rows on demand with ``O_DIRECT`` (:class:`DiskFeatureStore`).
        device: where an in-memory store keeps its rows. A "mmap" store always gathers to host
            memory (the loader moves rows to the GPU), so it only accepts "cpu".
        num_threads: CPU threads of the gather kernel; None = numba's setting.
        progress: show a progress bar while reading features into memory.
        kwargs: passed on to the store's constructor.
    """
    if isinstance(dataset, (str, os.PathLike)):
        from ..graph import load

        dataset = load(dataset)
    if kind not in STORE_KINDS:
        raise UsageError(
            f"unknown feature store kind {kind!r}; choose one of {', '.join(STORE_KINDS)}"
        )
    dev = resolve_device(device)
    if kind in ("mmap", "disk"):
        if dev.type != "cpu":
            raise UsageError(
                f"a '{kind}' feature store gathers to host memory, not {dev}; "
                "give the device to the loader instead"
            )
        if kind == "disk":
            from .stores.disk import DiskFeatureStore

            return DiskFeatureStore(dataset.features, **kwargs)
        return MmapFeatureStore(dataset.features, num_threads=num_threads, **kwargs)
    feats = _read_into_memory(dataset.features, progress)
    return InMemoryFeatureStore(feats, device=dev, num_threads=num_threads, **kwargs)


def _read_into_memory(src: np.ndarray, progress: bool, chunk_bytes: int = 64 << 20) -> np.ndarray:
    """Copy a (memory-mapped) ``[N, F]`` array into RAM in chunks, with a progress bar in MiB.
    Each chunk's pages leave this process's mapping once copied (the page cache keeps them), as
    :func:`gnnio.load` does for the CSR: else the rows count twice in the run's RSS."""
    out = host_empty(src.shape, src.dtype)
    n = src.shape[0]
    rows = max(1, chunk_bytes // max(1, src[:1].nbytes))
    with bar(
        total=int(src.nbytes) >> 20, desc="features -> RAM", unit="MiB", enabled=progress
    ) as pb:
        for s in range(0, n, rows):
            e = min(n, s + rows)
            out[s:e] = src[s:e]
            drop_pages(src, s, e)
            pb.update(int(out[s:e].nbytes) >> 20)
    return out
