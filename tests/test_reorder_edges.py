"""Reordering a ``from_pyg`` dataset keeps its per-edge arrays with their edges: every edge of
``to_pyg`` of the reordered copy, mapped back through ``new2old``, carries the ``edge_attr`` row
it had (``pyg_edge_id`` / ``edge_attr``; gnnio.preprocess.reorder._save_edge_arrays)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from gnnio.graph import load
from gnnio.preprocess.reorder import reorder_dataset, reorder_path

pytest.importorskip("torch_geometric")
from torch_geometric.data import Data  # noqa: E402

from gnnio.importers.pyg import from_pyg, to_pyg  # noqa: E402


def _edges(data, new2old=None):
    s, t = data.edge_index.numpy()
    if new2old is not None:
        s, t = new2old[s], new2old[t]
    return sorted(zip(s.tolist(), t.tolist(), data.edge_attr[:, 0].tolist()))


@pytest.mark.parametrize(
    "n,extra,grouped",
    [(6, 0, False), (6, 3, False), (6, 3, True)],
    ids=["E=N", "E>N", "already-by-target"],
)
def test_edge_attr_follows_its_edge(tmp_path, n, extra, grouped):
    src = np.r_[np.arange(n), np.arange(extra)]
    dst = np.r_[(np.arange(n) * 5 + 1) % n, (np.arange(extra) + 3) % n]
    if grouped:  # no pyg_edge_id: the CSR position is the column
        o = np.argsort(dst, kind="stable")
        src, dst = src[o], dst[o]
    ei = torch.tensor(np.stack([src, dst]), dtype=torch.long)
    ea = torch.arange(ei.shape[1], dtype=torch.float32).view(-1, 1) * 10
    data = Data(x=torch.randn(n, 4), edge_index=ei, edge_attr=ea)
    ds = load(from_pyg(data, tmp_path / "a", progress=False))
    assert ("pyg_edge_id" in ds.extra) is not grouped
    new2old = np.array([3, 5, 0, 1, 4, 2], dtype=np.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing dropped
        out = reorder_dataset(ds, new2old, tmp_path / "b", progress=False)
    back = to_pyg(load(out))
    assert _edges(back, new2old) == _edges(data)


def test_edge_attr_survives_a_scored_reorder_in_bounded_memory(tmp_path):
    rng = np.random.default_rng(0)
    ei = torch.from_numpy(rng.integers(0, 50, (2, 300)))
    data = Data(x=torch.randn(50, 3), edge_index=ei, edge_attr=torch.randn(300, 2))
    from_pyg(data, tmp_path / "a", progress=False)
    r = reorder_path(tmp_path / "a", "degree", out=tmp_path / "b", progress=False,
                     memory_budget=4 << 20)  # fmt: skip
    ds = load(r["out"])
    back = to_pyg(ds)
    assert ds.meta["pyg"]["edge_order"] == "pyg_edge_id"
    assert _edges(back, np.asarray(ds.extra["new2old"])) == _edges(data)
