"""What a rank holds that is sized by the whole graph, for tests (issue 26): ``GNNIO_MEM_CHECK=DIR``.

With the variable set, every rank of a training run writes ``DIR/rank<k>-<when>.json`` after its
first training epoch (``epoch``: its loaders, samplers and stores alive) and when it finishes
(``finish``):

* ``arrays``: every live NumPy array and torch tensor with a dimension of ``N``, ``N + 1`` (nodes)
  or ``E`` (edges) of the whole graph: its shape, dtype, bytes, whether its memory is a file's
  mapping (``file``: then ``mapped`` counts what of it is resident) and whether it is one of the
  arrays the rank keeps on purpose (``allowed``: the store's lookup and trace, the partition book;
  docs/design.md lists them and why). Arrays are found through the garbage collector (every
  tracked object's referents), so one held by any Python object is seen; memory only C++ holds
  (a torch op's workspace) is not.
* ``mapped``: the resident bytes of every mapping of a file in the dataset or partition
  directory (``/proc/self/smaps``), by file name: a rank that maps the whole feature file or CSR
  again shows here.

:mod:`tests.test_dist_memory` runs a partitioned training with it and fails on any array sized by
the whole graph that is not allowed, and on mapped pages of the feature file or the whole CSR.
"""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path

import numpy as np
import torch

__all__ = ["ENV", "census", "node_arrays_of", "write_census"]

ENV = "GNNIO_MEM_CHECK"


def _file_ranges() -> list[tuple[int, int, str]]:
    """``(start, end, path)`` of every file mapping of this process."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].startswith("/"):
                a, b = (int(x, 16) for x in parts[0].split("-"))
                out.append((a, b, parts[5].strip()))
    return out


def _mapped_by_file(dirs: list[Path]) -> dict[str, int]:
    """Resident bytes of the mappings of files under ``dirs``, by path from the dir's parent
    (``dataset/features.npy``, ``partition/part0/indices.npy``)."""
    roots = [str(Path(d).resolve()) for d in dirs]
    out: dict[str, int] = {}
    cur = None
    with open("/proc/self/smaps") as f:
        for line in f:
            first = line.split(maxsplit=1)[0] if line.strip() else ""
            if "-" in first and not first.endswith(":"):  # a mapping's header line
                parts = line.split(maxsplit=5)
                path = parts[5].strip() if len(parts) == 6 else ""
                root = next((r for r in roots if path.startswith(r + os.sep)), None)
                cur = None if root is None else os.path.relpath(path, os.path.dirname(root))
            elif cur is not None and first == "Rss:":
                out[cur] = out.get(cur, 0) + int(line.split()[1]) * 1024
    return out


def _live_arrays():
    """Every NumPy array and torch tensor some tracked object refers to (once each)."""
    seen: dict[int, object] = {}
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor):
            seen.setdefault(id(obj), obj)
            continue
        for ref in gc.get_referents(obj):
            if isinstance(ref, (np.ndarray, torch.Tensor)):
                seen.setdefault(id(ref), ref)
    return list(seen.values())


def _address(a) -> tuple[int, int]:
    if isinstance(a, torch.Tensor):
        return int(a.data_ptr()), int(a.numel() * a.element_size())
    return int(a.__array_interface__["data"][0]), int(a.nbytes)


def node_arrays_of(obj, num_nodes: int, depth: int = 3) -> list:
    """The arrays/tensors of ``obj`` (a rank's per-rank cache, its policy and maps, up to
    ``depth`` attributes deep) with a first dimension of ``num_nodes``, in memory (not a file's
    mapping), not looking into the stores behind it (``backing``: counted by their own owner).
    A cache of ``F * N`` rows keeps the slot of every node (and a dynamic one the first
    occurrence of every id in a batch): :class:`~gnnio.features.caches.cache.FeatureCache`'s
    maps, which answer "is row ``i`` cached?" for any ``i`` in O(1); DistRun counts them.
    A store's mapped feature file is not one of them (its pages: the census's ``mapped``)."""
    from ..features.base import FeatureStore

    out: dict[int, object] = {}
    files = _file_ranges()

    def walk(o, d: int) -> None:
        for v in vars(o).values():
            if isinstance(v, (np.ndarray, torch.Tensor)):
                ptr = _address(v)[0]
                mapped = any(a <= ptr < b for a, b, _ in files)  # a file's pages: not held
                if v.ndim and int(v.shape[0]) == int(num_nodes) and not mapped:
                    out.setdefault(id(v), v)
            elif isinstance(v, FeatureStore) or isinstance(v, type):
                continue
            elif d > 0 and hasattr(v, "__dict__"):
                walk(v, d - 1)

    if obj is not None and hasattr(obj, "__dict__"):
        walk(obj, depth)
    return list(out.values())


def census(num_nodes: int, num_edges: int, allowed, dirs) -> dict:
    """The record of the module docstring. ``allowed``: the arrays/tensors kept on purpose."""
    sizes = {int(num_nodes), int(num_nodes) + 1, int(num_edges)}
    ok = {_address(a)[0] for a in allowed if a is not None}
    files = _file_ranges()
    rows = []
    for a in _live_arrays():
        if a.ndim == 0 or not sizes.intersection(int(d) for d in a.shape):
            continue
        if isinstance(a, torch.Tensor) and a.device.type != "cpu":
            continue  # device memory: not this process's RSS (a GPU tier is counted elsewhere)
        ptr, nbytes = _address(a)
        where = next((p for s, e, p in files if s <= ptr < e), None)
        rows.append({
            "shape": [int(d) for d in a.shape],
            "dtype": str(a.dtype),
            "bytes": nbytes,
            "file": where,
            "allowed": ptr in ok,
            "kind": type(a).__name__,
        })  # fmt: skip
    return {"arrays": rows, "mapped": _mapped_by_file(list(dirs))}


def write_census(when: str, rank: int, num_nodes: int, num_edges: int, allowed, dirs) -> None:
    """Write ``$GNNIO_MEM_CHECK/rank<rank>-<when>.json`` when the variable is set."""
    d = os.environ.get(ENV)
    if not d:
        return
    rec = census(num_nodes, num_edges, allowed, dirs)
    out = Path(d)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".rank{rank}-{when}.json.tmp"
    tmp.write_text(json.dumps(rec, indent=1) + "\n")
    os.replace(tmp, out / f"rank{rank}-{when}.json")
