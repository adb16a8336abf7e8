"""Small builders shared by tests (plain functions, no fixtures)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gnnio.graph import DatasetWriter, edges_to_csr


def write_tiny_dataset(
    out: Path,
    num_nodes: int = 12,
    num_edges: int = 40,
    feat_dim: int = 4,
    num_classes: int = 3,
    seed: int = 0,
    feat_dtype=np.float32,
) -> Path:
    """A small random valid dataset with labels and disjoint splits."""
    rng = np.random.default_rng(seed)
    src = rng.integers(0, num_nodes, num_edges)
    dst = rng.integers(0, num_nodes, num_edges)
    indptr, indices = edges_to_csr(src, dst, num_nodes)
    perm = rng.permutation(num_nodes)
    n_tr, n_va = max(1, num_nodes // 4), max(1, num_nodes // 6)
    with DatasetWriter(out, name="tiny") as w:
        w.save_array("indptr", indptr)
        w.save_array("indices", indices)
        w.save_array("features", rng.standard_normal((num_nodes, feat_dim)).astype(feat_dtype))
        labels = rng.integers(0, num_classes, num_nodes).astype(np.int64)
        labels[perm[-1]] = -1
        w.save_array("labels", labels)
        w.save_array("train_idx", np.sort(perm[:n_tr]).astype(np.int64))
        w.save_array("valid_idx", np.sort(perm[n_tr : n_tr + n_va]).astype(np.int64))
        w.save_array("test_idx", np.sort(perm[n_tr + n_va : -1]).astype(np.int64))
        w.meta["num_classes"] = num_classes
    return out
