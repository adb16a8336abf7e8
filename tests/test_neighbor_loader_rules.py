"""Rules of :class:`gnnio.pyg.NeighborLoader` a mutation pass over ``gnnio/pyg/neighbor_loader.py``
found untested (2026-11-29): node attributes indexed on their own cat dimension, ``data.x``
replaced more than once, input node id ``N`` refused."""

from __future__ import annotations

import copy

import pytest
import torch

from gnnio.errors import UsageError
from gnnio.pyg import NeighborLoader
from tests.test_pyg_neighbor_loader import make_data


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GNNIO_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "pyg"


def test_a_node_attribute_is_indexed_on_its_cat_dimension(cache):
    """PyG's filter_data indexes a node attribute on ``__cat_dim__``: -1 for a key holding
    "index" ([2, N] here), not the first dimension."""
    data = make_data()
    data.pair_index = torch.arange(2 * data.num_nodes).view(2, data.num_nodes)
    assert data.is_node_attr("pair_index") and data.__cat_dim__("pair_index", None) == -1
    for b in NeighborLoader(data, [2], batch_size=16):
        assert torch.equal(b.pair_index, data.pair_index[:, b.n_id])


def test_data_x_replaced_twice_is_read_from_the_latest_tensor(cache):
    data = make_data()
    loader = NeighborLoader(copy.copy(data), [-1], batch_size=10)
    for scale in (2, 3, 2):
        loader.data.x = data.x * scale
        b = next(iter(loader))
        assert torch.equal(b.x, data.x[b.n_id] * scale), scale


def test_input_node_n_is_refused(cache):
    data = make_data()
    n = data.num_nodes
    with pytest.raises(UsageError, match=rf"input_nodes ids must lie in \[0, {n}\)"):
        NeighborLoader(data, [2], input_nodes=torch.tensor([0, n]))
    ld = NeighborLoader(data, [2], input_nodes=torch.tensor([n - 1]))
    assert next(iter(ld)).n_id[0] == n - 1


def test_a_transform_that_is_not_callable_is_refused(cache):
    with pytest.raises(UsageError, match="transform must be callable"):
        NeighborLoader(make_data(), [2], transform="normalize")


def test_a_new_epoch_stops_the_running_ones_threads(cache):
    """One epoch at a time, as gnnio's NodeLoader: ``iter(loader)`` again stops the stage
    threads of an epoch left unfinished."""
    import threading

    def stage_threads() -> set[threading.Thread]:
        return {
            t for t in threading.enumerate() if t.name.startswith(("gnnio-sample", "gnnio-gather"))
        }

    loader = NeighborLoader(make_data(n=200, e=2000), [3, 3], batch_size=4)
    before = stage_threads()
    first = iter(loader)
    next(first)
    running = stage_threads() - before
    assert running
    second = iter(loader)
    next(second)
    assert not any(t.is_alive() for t in running)
    loader.close()
