"""A partition on disk: the node -> part map, the replicated set and one CSR shard per part.

Layout of a partition directory (written to a temporary directory next to it, then renamed into
place, so a crash never leaves a half-written partition that loads)::

    PDIR/meta.json            format, dataset name + fingerprint, num_nodes, num_parts, method,
                              params, quality, sha256 of every array
    PDIR/parts.npy            int16 [N]   home part of every node
    PDIR/replicated.npy       int64 [R]   nodes whose neighbour lists every part stores (sorted)
    PDIR/part<k>/nodes.npy    int64 [n_k] global ids of the rows of shard k: its own nodes, then
                              the replicated nodes it does not own (local id = position)
    PDIR/part<k>/indptr.npy   int64 [n_k + 1]  CSR of in-neighbour lists of those nodes,
    PDIR/part<k>/indices.npy  global neighbour ids

:func:`load_partition` validates it (format, shapes, ranges, checksums of the small arrays, and
the dataset fingerprint when a dataset is given, and every shard's structure: :func:`_check_shard`),
so a partition made for another dataset or a corrupt one is refused with one line.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import DatasetError, UsageError
from ...graph import output_dir
from ...graph.csr import CSRGraph

__all__ = ["PARTITION_FORMAT", "Partition", "load_partition", "save_partition", "shard_of"]

PARTITION_FORMAT = "gnnio-partition-v1"


@dataclass
class Partition:
    """Parts of a graph's nodes, with the replicated set.

    Attributes:
        parts: int16 ``[N]`` home part of every node.
        replicated: sorted int64 ids whose neighbour lists every part stores.
        num_parts: ``M``.
        method: the partitioner (``random``, ``range``, ``metis``, ``bfs-block``, ``hdr``).
        params: its parameters (JSON-serializable).
        prep_s: seconds the partitioner took.
        quality: the report of :func:`~gnnio.preprocess.partition.quality.partition_quality`.
        dataset, fingerprint: the dataset it was made for.
    """

    parts: np.ndarray
    replicated: np.ndarray
    num_parts: int
    method: str
    params: dict[str, Any] = field(default_factory=dict)
    prep_s: float = 0.0
    quality: dict[str, Any] = field(default_factory=dict)
    dataset: str = ""
    fingerprint: str = ""

    @property
    def num_nodes(self) -> int:
        return int(self.parts.shape[0])

    def stores(self, part: int) -> np.ndarray:
        """bool ``[N]``: whose neighbour lists part ``part`` stores (own + replicated)."""
        s = self.parts == part
        s[self.replicated] = True
        return s


def _shard_rows(graph: CSRGraph, part: Partition, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``(nodes, indptr)`` of part ``k``'s shard (module docstring)."""
    own = np.flatnonzero(part.parts == k)
    extra = part.replicated[part.parts[part.replicated] != k]
    nodes = np.concatenate([own, extra]).astype(np.int64)
    ip = np.asarray(graph.indptr, dtype=np.int64)
    indptr = np.zeros(nodes.size + 1, dtype=np.int64)
    np.cumsum(ip[nodes + 1] - ip[nodes], out=indptr[1:])
    return nodes, indptr


def shard_of(graph: CSRGraph, part: Partition, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(nodes, indptr, indices)`` of part ``k``'s shard (module docstring)."""
    nodes, indptr = _shard_rows(graph, part, k)
    ip = np.asarray(graph.indptr, dtype=np.int64)
    starts, counts = ip[nodes], np.diff(indptr)
    offs = np.arange(int(indptr[-1]), dtype=np.int64) - np.repeat(indptr[:-1], counts)
    indices = np.asarray(graph.indices)[np.repeat(starts, counts) + offs]
    return nodes, indptr, indices


def _is_partition(d: Path) -> bool:
    try:
        return json.loads((d / "meta.json").read_text()).get("format") == PARTITION_FORMAT
    except (OSError, ValueError, AttributeError, RecursionError):
        return False


def _check_shard(pdir: Path, k: int, parts: np.ndarray, rep: np.ndarray, n: int) -> None:
    """One line unless shard ``k`` is what :func:`shard_of` writes: ``nodes`` the part's own
    nodes then its replicated ones (derived from the checksummed ``parts``/``replicated``),
    ``indptr`` from 0, non-decreasing, ending at ``len(indices)``, every index in ``[0, n)``
    (a crafted shard would make the sampler's kernels read out of bounds)."""
    d = pdir / f"part{k}"
    try:
        nodes, indptr, indices = (
            np.load(d / f"{a}.npy", mmap_mode="r", allow_pickle=False)
            for a in ("nodes", "indptr", "indices")
        )
    except (OSError, ValueError) as e:
        raise UsageError(f"{d}: cannot read shard: {' '.join(str(e).split())}") from None
    want = np.concatenate([np.flatnonzero(parts == k), rep[parts[rep] != k]])
    if nodes.shape != want.shape or not np.array_equal(nodes, want):
        raise UsageError(f"{d}/nodes.npy: not the nodes parts.npy gives part {k}")
    if indptr.dtype.kind not in "iu" or indices.dtype.kind not in "iu" or indices.ndim != 1:
        raise UsageError(f"{d}: indptr.npy and indices.npy must be 1-D integer arrays")
    ip = np.asarray(indptr, dtype=np.int64)
    if ip.shape != (nodes.shape[0] + 1,) or ip[0] != 0 or (np.diff(ip) < 0).any():
        raise UsageError(f"{d}/indptr.npy: not a CSR row pointer of {nodes.shape[0]} rows")
    if int(ip[-1]) != indices.shape[0]:
        raise UsageError(f"{d}/indptr.npy: ends at {int(ip[-1])}, indices has {indices.shape[0]}")
    if indices.size and (int(indices.min()) < 0 or int(indices.max()) >= n):
        raise UsageError(f"{d}/indices.npy: node ids outside [0, {n})")


def _sha(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).view(np.uint8).data).hexdigest()


def save_partition(
    part: Partition,
    graph: CSRGraph,
    out: str | os.PathLike,
    overwrite=False,
    chunk_bytes: int | None = None,
) -> Path:
    """Write ``part`` (with its shards of ``graph``) to ``out`` atomically. ``chunk_bytes``:
    write each shard's neighbour lists in chunks of rows whose pages are dropped
    (:mod:`gnnio.preprocess.partition.bounded`; the same files)."""
    out = Path(out)
    from ...utils.outputs import dataset_dir_of

    for where in (out / "x", Path(os.path.realpath(out)) / "x"):  # out itself, or inside one
        ds = dataset_dir_of(where)
        if ds is not None:
            raise UsageError(f"{out}: is or lies in the dataset directory {ds}; write it elsewhere")
    if out.exists() and not overwrite:
        raise UsageError(
            f"{out}: exists (pass --overwrite, or overwrite=True in Python, to replace it)"
        )
    if out.exists() and not _is_partition(out):
        raise UsageError(f"{out}: exists and is not a gnnio partition; refusing to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    with output_dir.claim(out):  # one writer; temporaries of killed writers (pid gone) removed
        output_dir.remove_stale(out)
        tmp = output_dir.make_temp_dir(out, "tmp")  # .NAME.tmp-<pid>-<random>
        try:
            _write_partition(part, graph, out, tmp, chunk_bytes)
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            err: DatasetError | UsageError | None = output_dir.write_error(out, e)
            if err is None and e.errno is None:  # np.save's short write: no room, ulimit -f
                err = UsageError(
                    f"{out}: no room to write it ({e}); the partial output was removed"
                )
            if err is None:
                raise
            raise err from None
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return out


def _write_partition(
    part: Partition, graph: CSRGraph, out: Path, tmp: Path, chunk: int | None = None
) -> None:
    """Write the partition into ``tmp`` and rename it to ``out`` (replacing an old one)."""
    sums = {}
    for name, arr in (("parts", part.parts.astype(np.int16)), ("replicated", part.replicated)):
        np.save(tmp / f"{name}.npy", arr, allow_pickle=False)
        sums[name] = _sha(arr)
    shards = []
    for k in range(part.num_parts):
        d = tmp / f"part{k}"
        d.mkdir()
        if chunk is None:
            nodes, indptr, indices = shard_of(graph, part, k)
            np.save(d / "indices.npy", indices, allow_pickle=False)
        else:
            from .bounded import write_lists

            nodes, indptr = _shard_rows(graph, part, k)
            write_lists(d / "indices.npy", graph, nodes, indptr, chunk)
        for name, arr in (("nodes", nodes), ("indptr", indptr)):
            np.save(d / f"{name}.npy", arr, allow_pickle=False)
        shards.append({"rows": int(nodes.size), "entries": int(indptr[-1])})
    meta = {
        "format": PARTITION_FORMAT,
        "dataset": part.dataset,
        "dataset_fingerprint": part.fingerprint,
        "num_nodes": part.num_nodes,
        "num_parts": part.num_parts,
        "method": part.method,
        "params": part.params,
        "prep_s": part.prep_s,
        "quality": part.quality,
        "shards": shards,
        "sha256": sums,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    if out.exists():
        old = output_dir.make_temp_dir(out, "old")
        os.replace(out, old / "p")
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out)


def load_partition(
    pdir: str | os.PathLike, dataset=None, num_parts: int | None = None, shards=None
) -> Partition:
    """Read and validate a partition directory; with ``dataset``, refuse one made for another
    dataset; with ``num_parts``, one with another number of parts (one-line UsageError).
    ``shards``: the parts whose shard files are checked (None: all); a rank checks only the
    shard it reads from its files, so it never maps the whole graph's shards (issue 26)."""
    pdir = Path(pdir)
    mf = pdir / "meta.json"
    if not mf.is_file():
        raise UsageError(f"{pdir}: not a gnnio partition (no meta.json)")
    try:
        meta = json.loads(mf.read_text())
    except (OSError, ValueError, RecursionError) as e:
        raise UsageError(f"{pdir}: unreadable meta.json: {type(e).__name__} {e}") from None
    if not isinstance(meta, dict) or meta.get("format") != PARTITION_FORMAT:
        raise UsageError(f"{pdir}: not a {PARTITION_FORMAT} directory")
    try:
        parts = np.load(pdir / "parts.npy", allow_pickle=False)
        rep = np.load(pdir / "replicated.npy", allow_pickle=False)
        n, m = int(meta["num_nodes"]), int(meta["num_parts"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UsageError(f"{pdir}: cannot read partition: {e}".replace("\n", " ")) from None
    for name, arr in (("parts", parts), ("replicated", rep)):
        if _sha(arr) != meta.get("sha256", {}).get(name):
            raise UsageError(f"{pdir}: {name}.npy does not match its checksum (corrupt or edited)")
    if parts.shape != (n,) or parts.dtype != np.int16 or m < 1:
        raise UsageError(f"{pdir}: parts.npy must be int16 [{n}] with {m} >= 1 parts")
    if n and (int(parts.min()) < 0 or int(parts.max()) >= m):
        raise UsageError(f"{pdir}: parts.npy has parts outside [0, {m})")
    if rep.ndim != 1 or (rep.size and (int(rep.min()) < 0 or int(rep.max()) >= n)):
        raise UsageError(f"{pdir}: replicated.npy has ids outside [0, {n})")
    for k in range(m) if shards is None else [k for k in shards if k < m]:
        _check_shard(pdir, k, parts, rep, n)  # the kernels index with these: checked first
    if dataset is not None:
        fp = meta.get("dataset_fingerprint")
        if fp != dataset.fingerprint or n != dataset.num_nodes:
            raise UsageError(
                f"{pdir}: made for dataset '{meta.get('dataset')}' ({fp}), not "
                f"{dataset.name} ({dataset.fingerprint})"
            )
    if num_parts is not None and m != num_parts:
        raise UsageError(f"{pdir}: has {m} parts, the run has {num_parts} ranks")
    return Partition(
        parts=parts,
        replicated=rep.astype(np.int64),
        num_parts=m,
        method=str(meta.get("method", "")),
        params=dict(meta.get("params", {})),
        prep_s=float(meta.get("prep_s", 0.0)),
        quality=dict(meta.get("quality", {})),
        dataset=str(meta.get("dataset", "")),
        fingerprint=str(meta.get("dataset_fingerprint", "")),
    )
