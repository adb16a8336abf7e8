"""The dataset object returned by :func:`gnnio.load`."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DatasetError
from ..utils.pages import drop_pages
from .csr import CSRGraph
from .feature_dtype import SCALE, ZERO_POINT, FeatureCodec, decode
from .format import load_arrays, read_meta, validate_arrays, verify_checksums
from .integrity import printable, quick_check

__all__ = ["Dataset", "load", "info_stats"]


@dataclass
class Dataset:
    """A prepared gnnio dataset.

    All arrays are NumPy memmaps (copy-on-write) over the files in ``path``: nothing is read into RAM
    until it is touched. Node ids are global ids in ``[0, num_nodes)``.

    Attributes:
        graph: CSR of in-neighbours.
        features: ``[N, F]`` as stored (``feat_dtype``: float32, float16, int16 = bfloat16 bits,
            int8; :attr:`feature_codec` decodes them), memory-mapped.
        labels: ``[N]`` int64, -1 = unlabeled; None if the dataset has no labels.
        train_idx, valid_idx, test_idx: int64 node ids; None when absent.
        extra: any further arrays stored in the dataset (e.g. id maps after reordering).
    """

    path: Path
    meta: dict[str, Any]
    graph: CSRGraph
    features: np.ndarray
    labels: np.ndarray | None = None
    train_idx: np.ndarray | None = None
    valid_idx: np.ndarray | None = None
    test_idx: np.ndarray | None = None
    extra: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The dataset's name, non-printable characters (ANSI escapes) written as escapes."""
        return printable(self.meta.get("name", self.path.name))

    @property
    def num_nodes(self) -> int:
        return self.graph.num_nodes

    @property
    def fingerprint(self) -> str:
        """16 hex digits identifying the dataset's content: a sha256 over the names and sha256
        checksums of its arrays (from the metadata; nothing is re-read). Files derived from a
        dataset (placements) record it, so they are not used with another dataset."""
        import hashlib

        h = hashlib.sha256()
        for name in sorted(self.meta.get("arrays", {})):
            h.update(f"{name}:{self.meta['arrays'][name].get('sha256', '')};".encode())
        return h.hexdigest()[:16]

    @property
    def num_edges(self) -> int:
        return self.graph.num_edges

    @property
    def feat_dim(self) -> int:
        return int(self.features.shape[1])

    @property
    def num_classes(self) -> int:
        return int(self.meta["num_classes"])

    def require_labels(self, why: str = "it can be benchmarked but not trained") -> None:
        """Raise a clear error if the dataset cannot be trained on (no labels or no train split);
        ``why`` ends the line (what needs them)."""
        if self.labels is None or self.train_idx is None or self.train_idx.size == 0:
            raise DatasetError(f"{self.path}: has no labels or no train split; {why}")

    def require_eval_splits(self) -> None:
        """Raise a clear error if the valid or test split is absent or empty (training evaluates
        on both); the line names how to give one with the importer that wrote the dataset."""
        for name in ("valid", "test"):
            idx = getattr(self, f"{name}_idx")
            if idx is None or idx.size == 0:
                raise DatasetError(
                    f"{self.path}: has no {name} split; train needs one ({self._split_hint(name)})"
                )

    def _split_hint(self, name: str) -> str:
        """How to re-prepare this dataset with a ``name`` ("valid"/"test") split."""
        source = self.meta.get("source")
        importer = source.get("importer") if isinstance(source, dict) else None
        if importer == "synthetic":
            return f"prepare synthetic --split TRAIN VALID TEST with a {name} fraction above 0"
        if importer == "facebook":
            if name == "valid":
                return "prepare facebook --split TRAIN,VALID with VALID above 0"
            return "prepare facebook --split TRAIN,VALID summing to less than 1: the rest is test"
        if importer == "pyg":
            attr = "val_mask" if name == "valid" else "test_mask"
            return f"prepare pyg from a Data with a non-empty {attr}"
        if importer == "ogb":
            return f"the OGB folder's split/<scheme>/{name}.csv.gz, non-empty"
        return f"prepare npy --{name}-idx F"

    @property
    def feat_dtype(self) -> str:
        """How the features are stored: float32, float16, bfloat16 (int16 bits) or int8
        (:mod:`gnnio.graph.feature_dtype`)."""
        return str(self.meta["feat_dtype"])

    @property
    def feature_codec(self) -> FeatureCodec:
        """What turns the stored rows into float32 (the int8 scale and zero point)."""
        if self.feat_dtype != "int8":
            return FeatureCodec(self.feat_dtype)
        return FeatureCodec(
            "int8",
            np.array(self.extra[SCALE], dtype=np.float32),
            np.array(self.extra[ZERO_POINT], dtype=np.float32),
        )

    def load_features_in_memory(self) -> np.ndarray:
        """Read the whole feature matrix into RAM (only when asked)."""
        return np.array(self.features)


def load(path: str | os.PathLike, verify: bool = False, quick: bool = True) -> Dataset:
    """Open and validate a dataset directory (see docs/format.md).

    The invariants of the format are always checked; ``verify=True`` also recomputes the sha256 of
    every array file (reads everything), else ``quick`` checks every file's size and a sampled
    hash (:func:`gnnio.graph.integrity.quick_check`: at most 512 KiB read per array). Raises
    :class:`gnnio.errors.DatasetError` with a one-line message.
    """
    path = Path(path)
    meta = read_meta(path)
    if verify:
        verify_checksums(path, meta)
    arrays = load_arrays(path, list(meta["arrays"]), meta)
    validate_arrays(path, meta, arrays, drop=True)  # drop: the CSR's pages as it is read
    if quick and not verify:
        quick_check(path, meta, arrays)
    # validation read the CSR and the labels whole: their pages leave this process's mapping
    # (the page cache keeps them), else they stay in its RSS for the whole run, though a rank
    # of a partitioned run never reads the whole graph again (issue 26)
    for key in ("indptr", "indices", "labels"):
        if key in arrays:
            drop_pages(arrays[key])
    core = {"indptr", "indices", "features", "labels", "train_idx", "valid_idx", "test_idx"}
    return Dataset(
        path=path,
        meta=meta,
        graph=CSRGraph._trusted(arrays["indptr"], arrays["indices"]),  # (validate_arrays)
        features=arrays["features"],
        labels=arrays.get("labels"),
        train_idx=arrays.get("train_idx"),
        valid_idx=arrays.get("valid_idx"),
        test_idx=arrays.get("test_idx"),
        extra={k: v for k, v in arrays.items() if k not in core},
    )


def info_stats(
    ds: Dataset, check_values: bool = False, chunk_rows: int = 1 << 16
) -> dict[str, Any]:
    """The numbers ``gnnio info`` prints (all plain JSON types)."""
    deg = ds.graph.in_degrees()
    n, e = ds.num_nodes, ds.num_edges
    from ..utils.counts import top_count

    top = top_count(0.01, n)
    top_share = float(np.sort(deg)[::-1][:top].sum() / e) if e else 0.0
    out_deg = ds.graph.out_degrees()
    stats: dict[str, Any] = {
        "name": ds.name,
        "path": str(ds.path),
        "format_version": ds.meta["format_version"],
        "num_nodes": n,
        "num_edges": e,
        "feat_dim": ds.feat_dim,
        "feat_dtype": ds.feat_dtype,
        "num_classes": ds.num_classes,
        "feature_bytes": int(ds.features.nbytes),
        "topology_bytes": int(ds.graph.indptr.nbytes + ds.graph.indices.nbytes),
        "in_degree": {
            "min": int(deg.min()) if n else 0,
            "median": float(np.median(deg)) if n else 0.0,
            "mean": float(e / n) if n else 0.0,
            "max": int(deg.max()) if n else 0,
            "top1pct_edge_share": top_share,
        },
        "isolated_nodes": int(np.count_nonzero((deg == 0) & (out_deg == 0))),
        "num_train": int(ds.train_idx.size) if ds.train_idx is not None else 0,
        "num_valid": int(ds.valid_idx.size) if ds.valid_idx is not None else 0,
        "num_test": int(ds.test_idx.size) if ds.test_idx is not None else 0,
        "num_labeled": int(np.count_nonzero(ds.labels >= 0)) if ds.labels is not None else 0,
    }
    if check_values:
        nan = inf = 0
        for s in range(0, n, chunk_rows):
            block = np.asarray(ds.features[s : s + chunk_rows])
            if ds.feat_dtype == "bfloat16":  # the bits as float32 (exact)
                block = decode(block, "bfloat16")
            nan += int(np.isnan(block).sum())
            inf += int(np.isinf(block).sum())
        stats["features_nan"] = nan
        stats["features_inf"] = inf
    return stats
