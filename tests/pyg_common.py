"""Shared by the PyG tests (tests/test_pyg.py, tests/test_pyg_stores.py): a random PyG ``Data``,
``use_standin_backend`` (PyG's NeighborLoader on a stand-in for pyg-lib's ``neighbor_sample``),
NeighborLoader's batch invariants (:func:`check_batch`) and a small dataset imported from PyG.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch_geometric.typing
from hypothesis import HealthCheck, settings
from torch_geometric.data import Data

from gnnio.graph import load
from gnnio.pyg import from_pyg

ROOT = Path(__file__).resolve().parent.parent
CORA_RAW = Path("/work/shared/datasets/cora")
SLOW = settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def random_data(n=40, e=160, f=5, seed=0, sort_by_target=False, edge_attr=True, masks=True):
    """A PyG Data with random directed edges (repeats and self-loops possible), labels, splits."""
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, e), generator=g)
    if sort_by_target:
        ei = ei[:, torch.sort(ei[1], stable=True).indices]
    data = Data(x=torch.randn(n, f, generator=g), edge_index=ei)
    if edge_attr:
        data.edge_attr = torch.randn(e, 3, generator=g)
    data.y = torch.randint(0, 4, (n,), generator=g)
    perm = torch.randperm(n, generator=g)
    split = {"train": perm[: n // 2], "val": perm[n // 2 : 3 * n // 4], "test": perm[3 * n // 4 :]}
    for k, ids in split.items():
        if masks:
            m = torch.zeros(n, dtype=torch.bool)
            m[ids] = True
            data[f"{k}_mask"] = m
        else:
            data[f"{k}_idx"] = ids
    return data


# ---- a stand-in for pyg-lib's neighbor_sample ------------------------------------------------


def _fake_neighbor_sample(*args):
    """pyg-lib's homogeneous algorithm (benchmarks/pyg_examples/standin.py), drawing from a
    generator seeded 0 on every call, so a batch is a function of its seeds."""
    from benchmarks.pyg_examples.standin import neighbor_sample

    return neighbor_sample(*args, generator=torch.Generator().manual_seed(0))


def use_standin_backend(monkeypatch) -> None:
    """(The ``pyg_backend`` fixture of the PyG tests.) PyG's NeighborLoader runs on :func:`_fake_neighbor_sample` (and a stable index sort, as
    pyg-lib's radix sort is)."""
    import torch_geometric.sampler.utils as sampler_utils

    monkeypatch.setattr(torch_geometric.typing, "WITH_PYG_LIB", True)
    monkeypatch.setattr(torch.ops.pyg, "neighbor_sample", _fake_neighbor_sample, raising=False)
    monkeypatch.setattr(
        sampler_utils, "index_sort", lambda x, max_value=None: torch.sort(x, stable=True)
    )


def check_batch(b: Data, ds, fanouts, expand: str, e_id_is_pos: bool = False) -> None:
    """NeighborLoader's invariants on one batch, for either sampling semantics (``e_id_is_pos``:
    e_id holds CSR positions even for a dataset with ``pyg_edge_id``, as PyG's loader over the
    GraphStore reports them)."""
    n_id, ei, bs = b.n_id, b.edge_index, b.batch_size
    feats = torch.from_numpy(np.asarray(ds.features))
    indptr = torch.from_numpy(np.asarray(ds.graph.indptr))
    indices = torch.from_numpy(np.asarray(ds.graph.indices, dtype=np.int64))
    assert torch.equal(b.x, feats[n_id])
    assert torch.equal(b.y, torch.from_numpy(np.asarray(ds.labels))[n_id])
    assert n_id.unique().numel() == n_id.numel()
    assert sum(b.num_sampled_nodes) == n_id.numel() and b.num_sampled_nodes[0] == bs
    assert sum(b.num_sampled_edges) == ei.shape[1] == b.e_id.numel()
    # every edge exists: e_id is its CSR position (mapped to the user's edge id for a dataset
    # from from_pyg whose edges were not grouped by target), in the target's row, holding the
    # source
    src, dst, pos = n_id[ei[0]], n_id[ei[1]], b.e_id
    if "pyg_edge_id" in ds.extra and not e_id_is_pos:
        pos = torch.from_numpy(np.argsort(np.asarray(ds.extra["pyg_edge_id"])))[pos]
    assert torch.equal(indices[pos], src)
    assert bool(((indptr[dst] <= pos) & (pos < indptr[dst + 1])).all())
    # hop h: targets reached before hop h (only the new ones with PyG's semantics), sources
    # reached by hop h, at most fanout edges per target
    cn = np.cumsum(b.num_sampled_nodes)
    ce = np.cumsum([0, *b.num_sampled_edges])
    for h, k in enumerate(fanouts):
        s, d = ei[0, ce[h] : ce[h + 1]], ei[1, ce[h] : ce[h + 1]]
        lo = cn[h - 1] if (h > 0 and expand == "new") else 0
        assert bool(((d >= lo) & (d < cn[h])).all()) and bool((s < cn[h + 1]).all())
        if k >= 0 and d.numel():
            assert int(torch.bincount(d).max()) <= k
        if expand == "new":  # each expanded node's edges: distinct CSR positions
            key = d * (ds.num_edges + 1) + pos[ce[h] : ce[h + 1]]
            assert key.unique().numel() == key.numel()


def small_dataset(tmp_path_factory):
    """(The module-scoped ``small_ds`` fixture of the PyG tests.) A 60-node dataset from PyG."""
    data = random_data(n=60, e=400, f=6, seed=11)
    return load(from_pyg(data, tmp_path_factory.mktemp("pyg") / "d", progress=False))
