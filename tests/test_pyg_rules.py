"""``gnnio.pyg``'s smaller rules (mutation pass): the checks of ``input_nodes`` and of the
``DataLoader`` arguments, ``drop_last``, which thread reads ``x`` (``filter_per_worker``), the
attributes a batch carries, the conversion cache's key and repair, store pairs read into the ring,
and the disjoint layout against a per-seed reference."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from torch_geometric.data import Data

from gnnio.errors import UsageError
from gnnio.graph import CSRGraph
from gnnio.pyg import NeighborLoader, from_pyg
from gnnio.pyg.data_input import cached_dataset, content_hash
from gnnio.pyg.disjoint import DisjointSampler
from gnnio.sampling.frontier import FrontierSampler
from gnnio.sampling.threaded import hop_key

from .test_pyg_neighbor_loader import cache, make_data  # noqa: F401 - cache is a fixture


def test_input_nodes_refused_in_one_line(cache):  # noqa: F811
    data = make_data()
    for bad, match in [
        (torch.tensor([3, 5, 3]), "distinct"),
        (torch.tensor([-1, 4]), r"lie in \[0, 60\)"),
        (torch.tensor([[1, 2]]), "1-D node ids"),
        ((None, torch.tensor([1]), 3), "node type"),
        ("paper", "node type"),
    ]:
        with pytest.raises(UsageError, match=match) as e:
            NeighborLoader(data, [2], input_nodes=bad)
        assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "kw, match",
    [({"batch_size": 0}, "batch_size must be >= 1"), ({"timeout": -1}, "timeout must be >= 0"),
     ({"num_workers": -1}, "num_workers must be >= 0"),
     ({"prefetch_factor": 0}, "prefetch_factor must be >= 1")],
)  # fmt: skip
def test_dataloader_arguments_checked(cache, kw, match):  # noqa: F811
    with pytest.raises(UsageError, match=match):
        NeighborLoader(make_data(), [2], **kw)


def test_defaults_and_drop_last(cache):  # noqa: F811
    data = make_data()  # 60 nodes
    ld = NeighborLoader(data, [2], batch_size=8, temporal_strategy="uniform")
    assert ld.options.prefetch == 2 and ld.options.num_workers == 1
    assert ld.options.stall_timeout is None
    seeds = torch.cat([b.n_id[: b.batch_size] for b in ld])
    assert len(ld) == 8 and torch.equal(seeds, torch.arange(60))  # in order, last batch of 4
    dropped = NeighborLoader(data, [2], batch_size=8, drop_last=True)
    sizes = [b.batch_size for b in dropped]
    assert len(dropped) == 7 and sizes == [8] * 7
    shuffled = NeighborLoader(data, [2], batch_size=8, drop_last=True, shuffle=True)
    seen = torch.cat([b.n_id[: b.batch_size] for b in shuffled])
    assert len(shuffled) == 7 and seen.numel() == 56 and seen.unique().numel() == 56
    assert not torch.equal(seen, torch.arange(56))


@pytest.mark.parametrize("fpw, thread", [(None, "gnnio-gather"), (True, "gnnio-gather"),
                                         (False, "MainThread")])  # fmt: skip
def test_filter_per_worker_chooses_the_thread_that_reads_x(cache, fpw, thread):  # noqa: F811
    data = make_data()
    ld = NeighborLoader(data, [2], batch_size=16, filter_per_worker=fpw)
    store, seen = ld._src.store, []
    inner = store.gather

    def gather(ids, out=None):
        seen.append(threading.current_thread().name)
        return inner(ids, out=out)

    store.gather = gather
    for b in ld:
        assert torch.equal(b.x, data.x[b.n_id])
    assert seen == [thread] * 4


def test_other_attributes_are_carried_as_pyg_does(cache, tmp_path):  # noqa: F811
    data = make_data()
    data.name = "toy"
    b = next(iter(NeighborLoader(data, [2], batch_size=8)))
    assert b.name == "toy" and torch.equal(b.train_mask, data.train_mask[b.n_id])
    # a gnnio dataset: y and the split masks by n_id, before loader.data is ever built
    path = from_pyg(data, tmp_path / "d", progress=False)
    ld = NeighborLoader(str(path), [2], batch_size=8)
    b = next(iter(ld))
    assert ld._data is None and torch.equal(b.y, data.y[b.n_id])
    assert torch.equal(b.train_mask, data.train_mask[b.n_id])
    assert {k for k in b.keys() if k.endswith("_mask")} == {"train_mask"}


def test_a_data_without_x_gives_batches_without_x(cache):  # noqa: F811
    data = Data(edge_index=make_data().edge_index, num_nodes=60)
    ld = NeighborLoader(data, [3], batch_size=25)
    batches = list(ld)
    assert len(batches) == 3 and all("x" not in b for b in batches)
    assert torch.equal(torch.cat([b.n_id[: b.batch_size] for b in batches]), torch.arange(60))


def test_the_cache_key_and_a_damaged_entry(tmp_path):
    x, ei = torch.arange(12.0).view(6, 2), torch.tensor([[0, 1], [1, 2]])
    keys = {content_hash(x, ei), content_hash(x.view(3, 4), ei), content_hash(x.int(), ei),
            content_hash(x, ei.flip(0)), content_hash(x + 1, ei)}  # fmt: skip
    assert len(keys) == 5 and content_hash(x.clone(), ei.clone()) == content_hash(x, ei)
    data = make_data()
    path, converted = cached_dataset(data, tmp_path)
    assert converted and cached_dataset(data, tmp_path) == (path, False)
    feats = path / "features.npy"
    feats.write_bytes(feats.read_bytes()[:-8])  # a truncated file
    assert cached_dataset(data, tmp_path) == (path, True)  # converted again
    (path / "meta.json").write_text("{broken")  # (was refused: "not a gnnio dataset")
    assert cached_dataset(data, tmp_path) == (path, True)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == [path.name]
    ld = NeighborLoader(data, [2], batch_size=8, cache_dir=tmp_path)
    assert all(torch.equal(b.x, data.x[b.n_id]) for b in ld)


def test_a_pyg_store_pair_read_into_the_ring_and_counted(cache):  # noqa: F811
    from torch_geometric.testing.feature_store import MyFeatureStore
    from torch_geometric.testing.graph_store import MyGraphStore

    data = make_data()
    fs, gs = MyFeatureStore(), MyGraphStore()
    fs.put_tensor(data.x, group_name=None, attr_name="x", index=None)
    gs.put_edge_index(data.edge_index, edge_type=None, layout="coo", size=(60, 60))
    ld = NeighborLoader((fs, gs), [3], batch_size=8, reuse_buffers=True)
    rows = 0
    for b in ld:
        assert torch.equal(b.x, data.x[b.n_id])  # checked while held
        rows += b.n_id.numel()
    assert ld.store.counters.snapshot()["rows"] == {"pyg": rows}
    gs.put_edge_index(data.edge_index, edge_type=("a", "to", "b"), layout="coo", size=(60, 60))
    with pytest.raises(UsageError, match="several edge types"):
        NeighborLoader((fs, gs), [3])
    with pytest.raises(UsageError, match="expected a PyG Data"):
        NeighborLoader([data], [3])


def test_disjoint_batches_are_the_per_seed_samples_laid_out_hop_by_hop():
    rng = np.random.default_rng(3)
    graph = CSRGraph.from_edges(rng.integers(0, 40, 400), rng.integers(0, 40, 400), 40)
    base = FrontierSampler(graph, [3, 2], seed=5)
    seeds = torch.tensor([7, 1, 30])
    mb = DisjointSampler(base).sample(seeds, epoch_seed=11)
    parts = [base.sample(seeds[j : j + 1], epoch_seed=hop_key(11, j)) for j in range(3)]
    nodes, owner, edges, pos = [], [], [], []
    for h in range(3):  # hop 0 (the seeds), hop 1, hop 2: subgraph by subgraph
        for j, p in enumerate(parts):
            hn = [0, *p.meta["hop_nodes"]]
            nodes.append(p.input_nodes[hn[h] : hn[h + 1]])
            owner += [j] * (hn[h + 1] - hn[h])
    for h in range(2):
        for p in parts:
            he = [0, *np.cumsum(p.meta["hop_edges"]).tolist()]
            ei = p.blocks[0].edge_index[:, he[h] : he[h + 1]]
            edges.append(p.input_nodes[ei])
            pos.append(p.meta["edge_pos"][he[h] : he[h + 1]])
    assert torch.equal(mb.input_nodes, torch.cat(nodes))
    assert mb.meta["batch"].tolist() == owner
    assert torch.equal(mb.input_nodes[mb.blocks[0].edge_index], torch.cat(edges, dim=1))
    assert torch.equal(mb.meta["edge_pos"], torch.cat(pos))
    hop_nodes = np.cumsum([sum(int(p.meta["hop_nodes"][0]) for p in parts)] + [
        sum(int(np.diff(p.meta["hop_nodes"])[h]) for p in parts) for h in range(2)])  # fmt: skip
    assert mb.meta["hop_nodes"] == hop_nodes.tolist()
    # without a key, call k is keyed k
    fresh = DisjointSampler(base)
    for k in range(2):
        got = fresh.sample(seeds)
        assert torch.equal(got.input_nodes, DisjointSampler(base).sample(seeds, k).input_nodes)


def test_feature_store_edges_of_its_contract():
    from gnnio.features import InMemoryFeatureStore
    from gnnio.pyg import GnnioFeatureStore

    store = InMemoryFeatureStore(np.arange(8, dtype=np.float32).reshape(4, 2))
    fs = GnnioFeatureStore(store, y=torch.arange(4))
    assert fs.gnnio_stores() == {(None, "x"): store}
    t = torch.tensor([[1.0], [2.0], [3.0]])
    with pytest.raises(ValueError, match="3 rows but 2 index ids"):
        fs.put_tensor(t, group_name=None, attr_name="z", index=torch.tensor([0, 1]))
    fs.put_tensor(t, group_name=None, attr_name="z", index=torch.tensor([7, 2, 5]))
    for missing in ([9], [0], [6]):  # past the last id, before the first, between two
        with pytest.raises(KeyError, match="no row"):
            fs[None, "z", torch.tensor(missing)]
    assert fs.remove_tensor(None, "z", None) is True
    assert fs.remove_tensor(None, "z", None) is False
    assert fs.get_tensor_size(None, "z") is None


@pytest.mark.parametrize("feat_dtype", ["bfloat16", "int8"])
def test_a_gnnio_store_pair_of_a_compressed_dataset_gives_get_tensors_rows(
    cache,  # noqa: F811
    tmp_path,
    feat_dtype,
):
    """The pair's own gnnio store is read directly (its tiers count the rows), and its rows come
    decoded as ``feature_store.get_tensor`` gives them (were the int16 bits / int8 codes)."""
    import gnnio
    from gnnio.graph.feature_dtype import writing_as
    from gnnio.pyg import GnnioFeatureStore, GnnioGraphStore

    with writing_as(feat_dtype):
        ds = gnnio.load(from_pyg(make_data(n=40, e=200, f=6), tmp_path / "d", progress=False))
    fs = GnnioFeatureStore.from_dataset(ds)
    ld = NeighborLoader((fs, GnnioGraphStore(ds)), [-1], batch_size=8)
    assert ld.store is fs.gnnio_stores()[(None, "x")]
    for b in ld:
        want = fs[None, "x", b.n_id]
        assert b.x.dtype == want.dtype and torch.equal(b.x, want)


def test_csr_positions_of_present_repeated_and_absent_edges():
    from gnnio.pyg.batch import csr_positions

    # in-neighbour rows: 0 <- [1, 2, 1], 1 <- [], 2 <- [0]
    graph = CSRGraph(np.array([0, 3, 3, 4]), np.array([1, 2, 1, 0]))
    got = csr_positions(graph, np.array([2, 1, 0, 0, 2]), np.array([0, 0, 2, 1, 2]))
    assert got.tolist() == [1, 0, 3, -1, -1]  # a repeated edge: its first position
