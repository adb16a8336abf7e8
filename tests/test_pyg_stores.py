"""gnnio for PyG users (issue 17): PyG's FeatureStore / GraphStore interfaces over gnnio
(``GnnioFeatureStore``, ``GnnioGraphStore``): PyG's own contract tests, reads through gnnio's
stores, and PyG's ``NeighborLoader`` reading through them (on the stand-in sampler of
:func:`tests.pyg_common.use_standin_backend`, and on the real pyg-lib when it imports). The
loader's batches, from_pyg and the example: tests/test_pyg.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch_geometric.data import TensorAttr
from torch_geometric.data.feature_store import AttrView
from torch_geometric.data.graph_store import EdgeLayout
from torch_geometric.loader import NeighborLoader

from gnnio.features import FeatureCache, InMemoryFeatureStore, TieredFeatureStore
from gnnio.pyg import GnnioFeatureStore, GnnioGraphStore
from tests.pyg_common import SLOW, check_batch, small_dataset, use_standin_backend


@pytest.fixture
def pyg_backend(monkeypatch):
    use_standin_backend(monkeypatch)


@pytest.fixture(scope="module")
def small_ds(tmp_path_factory):
    return small_dataset(tmp_path_factory)


# ---- FeatureStore / GraphStore ----------------------------------------------------------------


def test_feature_store_contract():
    """PyG's test_feature_store, on GnnioFeatureStore (in-memory tensors)."""
    store = GnnioFeatureStore()
    tensor = torch.tensor([[0, 0, 0], [1, 1, 1], [2, 2, 2]], dtype=torch.float)
    group_name, attr_name, index = "A", "feat", torch.tensor([0, 1, 2])
    attr = TensorAttr(group_name, attr_name, index)
    store.put_tensor(tensor, attr)
    assert torch.equal(store.get_tensor(attr), tensor)
    assert torch.equal(store.get_tensor(group_name, attr_name, index=torch.tensor([0, 2])),
                       tensor[torch.tensor([0, 2])])  # fmt: skip
    assert store.update_tensor(tensor + 1, group_name, attr_name, None)
    assert torch.equal(store.get_tensor(group_name, attr_name, None), tensor + 1)
    store.remove_tensor(group_name, attr_name, None)
    with pytest.raises(KeyError):
        store.get_tensor(attr)
    view = store.view(group_name=group_name)
    view.attr_name = attr_name
    view["index"] = index
    assert view == AttrView(store, TensorAttr(group_name, attr_name, index))
    store[group_name, attr_name, index] = tensor
    assert torch.equal(store[group_name, attr_name, index], tensor)
    assert torch.equal(store[group_name, attr_name, None], tensor)
    assert torch.equal(store[group_name, attr_name, :], tensor)
    assert torch.equal(store[group_name][attr_name][:], tensor)
    assert torch.equal(store[group_name].feat[:], tensor)
    assert torch.equal(store.view().A.feat[:], tensor)
    assert store[group_name] == store.view(TensorAttr(group_name=group_name))
    # a called view fills its unset fields with None
    store.put_tensor(tensor, group_name="B", attr_name=None, index=None)
    assert isinstance(store["B"], AttrView)
    assert torch.equal(store["B"](), tensor)
    assert store.get_tensor_size(group_name, attr_name) == (3, 3)
    del store[group_name, attr_name, index]
    with pytest.raises(KeyError):
        _ = store[group_name, attr_name, index]
    # rows put under node ids are found by id, not by position
    store.put_tensor(tensor, group_name=None, attr_name="z", index=torch.tensor([7, 2, 5]))
    assert torch.equal(store[None, "z", torch.tensor([5, 7])], tensor[[2, 0]])
    with pytest.raises(KeyError):
        store[None, "z", torch.tensor([3])]


def _stores(feats: np.ndarray):
    base = InMemoryFeatureStore(feats.copy())
    tiered = TieredFeatureStore(InMemoryFeatureStore(feats.copy()), hot_ids=np.arange(0, 50, 3),
                                device="cpu", progress=False)  # fmt: skip
    cached = FeatureCache(InMemoryFeatureStore(feats.copy()), 10, "lru")
    return {"memory": base, "tiered": tiered, "cache": cached}


@SLOW
@given(
    kind=st.sampled_from(["memory", "tiered", "cache"]),
    index=st.one_of(
        st.lists(st.integers(0, 49), max_size=30).map(lambda v: torch.tensor(v, dtype=torch.long)),
        st.tuples(
            st.integers(-60, 60) | st.none(),
            st.integers(-60, 60) | st.none(),
            st.integers(1, 4) | st.none(),
        ).map(lambda t: slice(*t)),  # fmt: skip
        st.lists(st.booleans(), min_size=50, max_size=50).map(torch.tensor),
        st.none(),
    ),
)
def test_feature_store_reads_through_gnnio(kind, index):
    feats = np.random.default_rng(0).standard_normal((50, 4)).astype(np.float32)
    gstore = _stores(feats)[kind]
    fs = GnnioFeatureStore(gstore, y=torch.arange(50))
    before = sum(gstore.counters.snapshot()["bytes"].values())
    ids = _index_ids(index, 50)
    got = fs[None, "x", index]
    want = torch.from_numpy(feats)[ids]
    assert torch.equal(got, want)
    assert fs.get_tensor_size(None, "x", index) == tuple(want.shape)
    if ids.numel():
        assert sum(gstore.counters.snapshot()["bytes"].values()) > before
    assert torch.equal(fs[None, "y", index], ids)


def _index_ids(index, n: int) -> torch.Tensor:
    """The node ids a TensorAttr index names (None, slice, bool mask or ids)."""
    if index is None:
        return torch.arange(n)
    if isinstance(index, slice):
        return torch.arange(n)[index]
    return index.nonzero().view(-1) if index.dtype == torch.bool else index


def test_graph_store_contract(small_ds):
    """PyG's test_graph_store (put and get every layout) and the conversions on gnnio's CSR."""
    gs = GnnioGraphStore(small_ds)
    n = small_ds.num_nodes
    (attr,) = gs.get_all_edge_attrs()
    assert attr.edge_type is None and attr.layout == EdgeLayout.CSC and attr.size == (n, n)
    row, colptr, perm = gs.csc()
    assert perm is None
    assert torch.equal(colptr, torch.from_numpy(np.asarray(small_ds.graph.indptr)))
    assert torch.equal(row, torch.from_numpy(np.asarray(small_ds.graph.indices, dtype=np.int64)))
    src, dst, _ = gs.coo()
    want_src, want_dst = small_ds.graph.edges()
    assert torch.equal(src, torch.from_numpy(np.asarray(want_src, dtype=np.int64)))
    assert torch.equal(dst, torch.from_numpy(np.asarray(want_dst, dtype=np.int64)))
    rowptr, col, perm = gs.csr()
    assert rowptr.numel() == n + 1 and torch.equal(col, dst[perm])
    # put / get / remove every layout, as PyG's test does
    coo, csr = (src, dst), (rowptr, col)
    gs["edge", "coo"] = coo
    gs["edge", EdgeLayout.CSR] = csr
    for got, want in ((gs["edge", "coo"], coo), (gs["edge", "csr"], csr)):
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert gs.remove_edge_index("edge", "coo") and not gs.remove_edge_index("edge", "coo")
    with pytest.raises(KeyError):
        gs["edge", "coo"]


def test_neighborloader_over_the_stores(small_ds, pyg_backend):
    """PyG's NeighborLoader reads through GnnioFeatureStore / GnnioGraphStore."""
    gstore = _stores(np.asarray(small_ds.features))["tiered"]
    fs, gs = GnnioFeatureStore.from_dataset(small_ds, gstore), GnnioGraphStore(small_ds)
    seeds = torch.from_numpy(np.asarray(small_ds.train_idx))
    loader = NeighborLoader((fs, gs), num_neighbors=[3, 2], input_nodes=seeds, batch_size=8)
    for b in loader:
        check_batch(b, small_ds, [3, 2], "new", e_id_is_pos=True)
        assert torch.equal(b.n_id[: b.batch_size], seeds[b.input_id])
    assert set(gstore.counters.snapshot()["rows"]) == {"gpu", "host"}


def test_neighborloader_with_real_backend(small_ds):
    pytest.importorskip("pyg_lib", reason="pyg-lib (PyG's sampling backend) is not installed")
    fs, gs = GnnioFeatureStore.from_dataset(small_ds), GnnioGraphStore(small_ds)
    for b in NeighborLoader((fs, gs), num_neighbors=[3, 2], input_nodes=torch.arange(20),
                            batch_size=8):  # fmt: skip
        check_batch(b, small_ds, [3, 2], "new", e_id_is_pos=True)
