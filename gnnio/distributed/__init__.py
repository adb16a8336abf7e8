"""Several processes and machines on torch.distributed (NCCL on GPUs, gloo on CPU): launch,
rank context, feature rows sharded across ranks and fetched with collectives, sampling over a
partitioned topology, data-parallel training.

(Named ``gnnio.dist`` until issue 26: ``dist/`` is the conventional name of a build-output folder,
and tools that skip build output skipped it.) The public names are importable from here; the
modules load on first use, so importing the package costs nothing.
"""

from __future__ import annotations

import importlib

__all__ = [
    "GROUPS",
    "DistContext",
    "DistRun",
    "ShardedFeatureStore",
    "ShardedSampler",
    "init",
    "shutdown",
]

_WHERE = {
    "GROUPS": "context",
    "DistContext": "context",
    "init": "context",
    "shutdown": "context",
    "DistRun": "train",
    "ShardedFeatureStore": "store",
    "ShardedSampler": "sampling",
}


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
