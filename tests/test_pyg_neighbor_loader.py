"""``from gnnio.pyg import NeighborLoader`` (issue 28): PyG's name and signature, ``Data`` input
converted once (also by concurrent processes), every argument implemented, mapped or refused,
batches safe to keep, ``loader.data`` edits, the device and the seeds.

PyG's own ``NeighborLoader`` runs on the stand-in for pyg-lib in
``benchmarks/pyg_examples/standin.py``; with ``num_neighbors`` of -1 its batches are
deterministic, so gnnio's must equal them field for field.
"""

from __future__ import annotations

import copy
import multiprocessing as mp
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch_geometric.typing
from torch_geometric.data import Data
from torch_geometric.loader import NeighborLoader as PyGNeighborLoader

from gnnio.errors import UsageError
from gnnio.pyg import GnnioFeatureStore, GnnioGraphStore, NeighborLoader, PyGLoader, from_pyg
from gnnio.pyg import neighbor_loader as nl_mod
from gnnio.pyg.arguments import ARGUMENTS
from gnnio.pyg.data_input import cached_dataset

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks" / "pyg_examples"))
import standin  # noqa: E402


@pytest.fixture
def pyg_backend(monkeypatch):
    import torch_geometric.sampler.utils as sampler_utils

    monkeypatch.setattr(torch_geometric.typing, "WITH_PYG_LIB", True)
    monkeypatch.setattr(torch.ops.pyg, "neighbor_sample", standin.neighbor_sample, raising=False)
    monkeypatch.setattr(
        sampler_utils, "index_sort", lambda x, max_value=None: torch.sort(x, stable=True)
    )


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GNNIO_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "pyg"


def make_data(n=60, e=300, f=5, seed=0) -> Data:
    g = torch.Generator().manual_seed(seed)
    data = Data(
        x=torch.randn(n, f, generator=g), edge_index=torch.randint(0, n, (2, e), generator=g)
    )
    data.edge_attr = torch.randn(e, 2, generator=g)
    data.y = torch.randint(0, 4, (n,), generator=g)
    data.train_mask = torch.rand(n, generator=g) < 0.6
    return data


def same(a: Data, b: Data) -> None:
    assert sorted(a.keys()) == sorted(b.keys())
    for key in a.keys():
        va, vb = a[key], b[key]
        if isinstance(va, torch.Tensor):
            assert va.dtype == vb.dtype and torch.equal(va, vb), key
        else:
            assert va == vb, key


@pytest.mark.parametrize("disjoint", [False, True])
@pytest.mark.parametrize("form", ["none", "mask", "ids", "tuple"])
def test_same_batches_as_pyg(cache, pyg_backend, form, disjoint):
    """With num_neighbors=-1 the batches equal PyG's field for field (y, masks, edge_attr read
    from the Data; e_id the edge_index column; batch.batch for disjoint)."""
    data = make_data()
    inp = {"none": None, "mask": data.train_mask, "ids": torch.tensor([9, 3, 41, 0, 27]),
           "tuple": (None, data.train_mask)}[form]  # fmt: skip
    kw = dict(num_neighbors=[-1, -1], batch_size=4, disjoint=disjoint)
    # (PyG 2.8 takes (None, mask) only for a HeteroData; gnnio reads it as the mask)
    pyg_inp = inp[1] if isinstance(inp, tuple) else inp
    theirs = list(PyGNeighborLoader(data, input_nodes=pyg_inp, **kw))
    ours = list(NeighborLoader(data, input_nodes=inp, **kw))
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        same(a, b)


def test_kept_batches_hold_their_rows(cache):
    """``list(loader)`` keeps every batch: each x equals the source rows (the ring, opted into,
    is the case the default avoids)."""
    data = make_data(n=400, e=3000, f=8)
    loader = NeighborLoader(data, [5, 5], batch_size=16, shuffle=True)
    batches = list(loader)
    assert len(batches) == 25
    assert sum(not torch.equal(b.x, data.x[b.n_id]) for b in batches) == 0
    ring = list(NeighborLoader(data, [5, 5], batch_size=16, reuse_buffers=True))
    assert sum(not torch.equal(b.x, data.x[b.n_id]) for b in ring) > 0
    # gnnio's own PyGLoader keeps batches by default too
    ds = from_pyg(data, cache.parent / "ds", progress=False)
    kept = list(PyGLoader(ds, [5, 5], batch_size=16, shuffle=True))
    assert sum(not torch.equal(b.x, data.x[b.n_id]) for b in kept) == 0


def test_loader_data_steers_what_is_read(cache):
    data = make_data()
    loader = NeighborLoader(copy.copy(data), [-1], batch_size=10)
    assert loader.data is not data and torch.equal(loader.data.x, data.x)
    assert len(loader.dataset) == data.num_nodes and len(loader) == 6
    del loader.data.x, loader.data.y
    loader.data.num_nodes = data.num_nodes
    loader.data.n_id = torch.arange(data.num_nodes)
    loader.data.score = torch.arange(data.num_nodes) * 10
    for b in loader:
        assert "x" not in b and "y" not in b
        assert torch.equal(b.score, b.n_id * 10) and b.num_nodes == b.n_id.numel()
    assert loader.store.counters.snapshot()["rows"] == {}  # no feature row was read
    loader.data.x = data.x * 2  # a replaced x is read from the new tensor
    b = next(iter(loader))
    assert torch.equal(b.x, data.x[b.n_id] * 2)
    assert torch.equal(b.edge_attr, data.edge_attr[b.e_id])


def test_seeds_follow_torch(cache, monkeypatch):
    data = make_data(n=200, e=2000)

    def run(**kw):
        ld = NeighborLoader(data, [3, 3], batch_size=8, shuffle=True, **kw)
        return torch.cat([torch.cat([b.n_id, b.edge_index.view(-1)]) for b in ld])

    torch.manual_seed(1)
    a = run()
    torch.manual_seed(1)
    assert torch.equal(run(), a)  # seed_everything / manual_seed take effect
    torch.manual_seed(2)
    assert not torch.equal(run(), a)
    g = torch.Generator().manual_seed(7)
    b = run(generator=g)
    torch.manual_seed(99)  # the global generator no longer matters
    assert torch.equal(run(generator=torch.Generator().manual_seed(7)), b)
    monkeypatch.setattr(nl_mod, "_rank", lambda: 1)  # another torch.distributed rank
    assert not torch.equal(run(generator=torch.Generator().manual_seed(7)), b)


def test_device_follows_data_x(cache):
    data = make_data()
    b = next(iter(NeighborLoader(data, [2], batch_size=4)))
    assert b.x.device == b.edge_index.device == data.x.device
    b = next(iter(NeighborLoader(data, [2], batch_size=4, device="cpu")))
    assert b.x.device.type == "cpu"
    bad = ["nonsense"] + ([] if torch.cuda.is_available() else ["cuda"])
    for dev in bad:
        with pytest.raises(UsageError, match="device="):
            NeighborLoader(data, [2], batch_size=4, device=dev)


X_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64]


@pytest.mark.parametrize("filter_per_worker", [None, False])
@pytest.mark.parametrize("dtype", X_DTYPES, ids=str)
def test_x_is_data_x_of_n_id_in_its_dtype(cache, dtype, filter_per_worker):
    """PyG's ``batch.x``: ``data.x[n_id]``, dtype and bits (bfloat16 decoded, not its int16
    bits; float64 and int64 not cast to float32), with no warning."""
    data = make_data(n=40, e=200, f=3)
    g = torch.Generator().manual_seed(1)
    if dtype == torch.int64:  # ids for an nn.Embedding, beyond float32's 2**24
        data.x = torch.randint(0, 2**40, (40, 3), generator=g)
    else:
        data.x = torch.randn(40, 3, generator=g, dtype=torch.float64).to(dtype)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = NeighborLoader(data, [3, 2], batch_size=8, shuffle=True,
                                filter_per_worker=filter_per_worker)  # fmt: skip
        batches = list(loader)
    noted = [str(w.message) for w in caught if not issubclass(w.category, DeprecationWarning)]
    assert not noted, noted
    assert len(batches) == 5
    for b in batches:
        assert b.x.dtype == dtype and torch.equal(b.x, data.x[b.n_id])


@pytest.mark.parametrize("feat_dtype", ["bfloat16", "int8"])
def test_compressed_dataset_rows_are_decoded(cache, tmp_path, feat_dtype):
    """Over a ``--feature-dtype`` dataset, ``x`` is what ``PyGLoader`` gives and what
    ``loader.data.x[n_id]`` holds: bfloat16 values, int8 rows dequantized (not the codes)."""
    from gnnio.graph.feature_dtype import writing_as

    data = make_data(n=40, e=200, f=6)
    with writing_as(feat_dtype):
        path = from_pyg(data, tmp_path / feat_dtype, progress=False)
    want = list(PyGLoader(path, [-1], batch_size=8))
    assert want[0].x.dtype == (torch.bfloat16 if feat_dtype == "bfloat16" else torch.float32)
    for fpw in (None, False):
        loader = NeighborLoader(str(path), [-1], batch_size=8, filter_per_worker=fpw)
        got = list(loader)
        assert len(got) == len(want) == 5
        for a, b in zip(got, want):
            assert torch.equal(a.n_id, b.n_id)
            assert a.x.dtype == b.x.dtype and torch.equal(a.x, b.x)
            assert torch.equal(a.x, loader.data.x[a.n_id])


@pytest.mark.parametrize("feat_dtype", ["bfloat16", "int8"])
def test_a_replaced_x_over_a_compressed_dataset_is_not_decoded(cache, tmp_path, feat_dtype):
    """The dataset's codec decodes the dataset's own rows only: a ``loader.data.x`` the user
    replaced (float32 here) comes as it is, not viewed as bfloat16 bits or dequantized."""
    from gnnio.graph.feature_dtype import writing_as

    data = make_data(n=40, e=200, f=6)
    with writing_as(feat_dtype):
        path = from_pyg(data, tmp_path / feat_dtype, progress=False)
    for fpw in (None, False):
        loader = NeighborLoader(str(path), [-1], batch_size=8, filter_per_worker=fpw)
        mine = torch.randn(40, 6, generator=torch.Generator().manual_seed(2))
        loader.data.x = mine
        for b in loader:
            assert b.x.dtype == torch.float32 and torch.equal(b.x, mine[b.n_id])


def test_from_pyg_warns_of_float32_only_where_it_stores_float32(tmp_path):
    """A float64 ``x`` is stored as float32 with one warning; asked for another feature dtype
    (``prepare pyg --feature-dtype``) it is stored as that, and no float32 warning is given."""
    from gnnio.graph.feature_dtype import writing_as

    data = make_data(n=40, e=200, f=6)
    data.x = data.x.to(torch.float64)
    with pytest.warns(UserWarning, match="stored as float32"):
        from_pyg(data, tmp_path / "f32", progress=False)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*stored as float32")
        with writing_as("bfloat16"):
            from_pyg(data, tmp_path / "bf16", progress=False)


@pytest.mark.parametrize("feat_dtype", ["bfloat16", "int8"])
def test_feature_store_decodes_a_compressed_datasets_rows(tmp_path, feat_dtype):
    """``GnnioFeatureStore.from_dataset`` over a ``--feature-dtype`` dataset returns the rows'
    values (``PyGLoader``'s), not the stored int16 bits or int8 codes; a store added without a
    codec -- which may hold its own int16 or int8 integers -- returns its rows as they are."""
    import gnnio
    from gnnio.features import open_store
    from gnnio.graph.feature_dtype import writing_as

    data = make_data(n=40, e=200, f=6)
    with writing_as(feat_dtype):
        path = from_pyg(data, tmp_path / feat_dtype, progress=False)
    ds = gnnio.load(path)
    fs = GnnioFeatureStore.from_dataset(ds)
    want = next(iter(PyGLoader(path, [-1], batch_size=40, shuffle=False)))
    ids = torch.tensor([5, 0, 39, 5])
    got = fs[None, "x", ids]
    x = torch.empty_like(want.x)
    x[want.n_id] = want.x  # (PyGLoader's rows by node id)
    assert got.dtype == want.x.dtype and torch.equal(got, x[ids])
    store = open_store(ds, "memory", progress=False)
    raw = GnnioFeatureStore(store)[None, "x", ids]
    assert raw.dtype == (torch.int16 if feat_dtype == "bfloat16" else torch.int8)
    assert torch.equal(raw, store.gather(ids))
    fs = GnnioFeatureStore()
    fs.add_store(store, "x", codec=ds.feature_codec)
    assert torch.equal(fs[None, "x", ids], got)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_batches_on_the_gpu_of_data_x(tmp_path, monkeypatch):
    monkeypatch.setenv("GNNIO_CACHE", str(tmp_path))
    data = make_data().to("cuda", "x", "y")
    for b in NeighborLoader(data, [3, 2], batch_size=8):
        assert b.x.is_cuda and b.y.is_cuda and b.edge_index.is_cuda
        assert torch.equal(b.x, data.x[b.n_id])
    b = next(iter(NeighborLoader(data, [3, 2], batch_size=8, device="cpu")))
    assert b.x.device.type == "cpu"


def test_replace_draws_fanout_per_node(cache):
    data = make_data(n=50, e=400)
    deg = torch.bincount(data.edge_index[1], minlength=50)
    for b in NeighborLoader(data, [30], batch_size=10, replace=True):
        seeds_deg = deg[b.n_id[: b.batch_size]]
        per_seed = torch.bincount(b.edge_index[1], minlength=b.batch_size)
        assert torch.equal(per_seed, torch.where(seeds_deg > 0, 30, 0))  # 30 > every degree
        src, dst = b.n_id[b.edge_index[0]], b.n_id[b.edge_index[1]]
        assert torch.equal(data.edge_index[0, b.e_id], src)
        assert torch.equal(data.edge_index[1, b.e_id], dst)


def test_transform_and_filter_per_worker(cache):
    data = make_data()
    kw = dict(num_neighbors=[3, 2], batch_size=8, generator=torch.Generator().manual_seed(0))
    worker = list(NeighborLoader(data, **kw))
    kw["generator"] = torch.Generator().manual_seed(0)
    main = list(NeighborLoader(data, filter_per_worker=False, **kw,
                               transform=lambda b: setattr(b, "seen", True) or b))  # fmt: skip
    for a, b in zip(worker, main):
        assert b.seen and torch.equal(a.x, b.x) and torch.equal(a.edge_index, b.edge_index)


def test_store_pair_and_dataset_path(cache, tmp_path):
    from gnnio.graph import load

    data = make_data()
    ds = load(from_pyg(data, tmp_path / "d", progress=False))
    pair = (GnnioFeatureStore.from_dataset(ds), GnnioGraphStore(ds))
    for src in (pair, ds, str(tmp_path / "d")):
        ld = NeighborLoader(src, [-1], input_nodes=data.train_mask, batch_size=8)
        for b in ld:
            assert torch.equal(b.x, data.x[b.n_id]) and torch.equal(b.y, data.y[b.n_id])
    ld = NeighborLoader(str(tmp_path / "d"), [-1], batch_size=8)
    del ld.data.x
    assert "x" not in next(iter(ld))


def test_pygloader_names_the_data_it_cannot_take():
    with pytest.raises(UsageError, match="NeighborLoader"):
        PyGLoader(make_data(), [2])


def test_any_pyg_store_pair(cache):
    """PyG's own test stores: the graph from csc() (e_id through its perm), x and y through
    get_tensor."""
    from torch_geometric.testing.feature_store import MyFeatureStore
    from torch_geometric.testing.graph_store import MyGraphStore

    data = make_data()
    fs, gs = MyFeatureStore(), MyGraphStore()
    fs.put_tensor(data.x, group_name=None, attr_name="x", index=None)
    fs.put_tensor(data.y, group_name=None, attr_name="y", index=None)
    gs.put_edge_index(data.edge_index, edge_type=None, layout="coo", size=(60, 60))
    for b in NeighborLoader((fs, gs), [-1, 2], input_nodes=data.train_mask, batch_size=8):
        assert torch.equal(b.x, data.x[b.n_id]) and torch.equal(b.y, data.y[b.n_id])
        assert torch.equal(data.edge_index[0, b.e_id], b.n_id[b.edge_index[0]])
        assert torch.equal(data.edge_index[1, b.e_id], b.n_id[b.edge_index[1]])


def _worker(data, root, barrier, out):
    barrier.wait()
    out.put(cached_dataset(data, root))


def test_concurrent_conversion(tmp_path):
    """Four processes convert the same Data at once: one converts, the others wait and open it."""
    data = make_data(n=3000, e=30000, f=64)
    ctx = mp.get_context("fork")
    barrier, out = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(data, tmp_path, barrier, out)) for _ in range(4)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert len({str(p) for p, _ in results}) == 1
    assert sorted(c for _, c in results) == [False, False, False, True]
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")] == [
        results[0][0].name
    ]
    ld = NeighborLoader(data, [2], batch_size=64, cache_dir=tmp_path)
    assert ld._src.converted is False  # found, not converted again


# ---- every argument has an answer -----------------------------------------------------------

REFUSED_VALUES = {
    "input_time": torch.zeros(3),
    "time_attr": "time",
    "temporal_strategy": "last",
    "weight_attr": "w",
    "transform_sampler_output": lambda o: o,
    "neighbor_sampler": object(),
    "sampler": [0, 1],
    "batch_sampler": [[0]],
    "collate_fn": lambda b: b,
    "directed": False,
    "subgraph_type": "induced",
}
MAPPED_VALUES = {
    "num_workers": 4,
    "prefetch_factor": 3,
    "persistent_workers": True,
    "pin_memory": True,
    "pin_memory_device": "cuda",
    "worker_init_fn": lambda i: None,
    "multiprocessing_context": "spawn",
    "in_order": False,
}


def test_the_table_covers_pygs_signature():
    import inspect

    pyg = set(inspect.signature(PyGNeighborLoader.__init__).parameters) - {"self", "kwargs"}
    assert pyg <= set(ARGUMENTS)
    ours = set(inspect.signature(NeighborLoader.__init__).parameters)
    assert pyg <= ours  # the same names, in the same order
    names = list(inspect.signature(PyGNeighborLoader.__init__).parameters)[1:-1]
    assert list(inspect.signature(NeighborLoader.__init__).parameters)[1 : len(names) + 1] == names
    kinds = {n: k for n, (k, _) in ARGUMENTS.items()}
    assert {n for n, k in kinds.items() if k == "mapped"} == set(MAPPED_VALUES)
    assert {n for n, k in kinds.items() if k == "refused"} <= set(REFUSED_VALUES)


@pytest.mark.parametrize("name", sorted(REFUSED_VALUES))
def test_refused_in_one_line(cache, name):
    data = make_data()
    with pytest.raises(UsageError, match=f"NeighborLoader: {name}=") as e:
        NeighborLoader(data, [2], **{name: REFUSED_VALUES[name]})
    assert "\n" not in str(e.value)


def test_heterogeneous_refused(cache):
    from torch_geometric.data import HeteroData

    data = make_data()
    for kw in ({"num_neighbors": {("a", "to", "a"): [2]}}, {"input_nodes": ("paper", None)}):
        with pytest.raises(UsageError, match="num_neighbors|input_nodes"):
            NeighborLoader(data, **{"num_neighbors": [2], **kw})
    with pytest.raises(UsageError, match="HeteroData"):
        NeighborLoader(HeteroData(), [2])
    with pytest.raises(UsageError, match="unexpected argument 'bogus'"):
        NeighborLoader(data, [2], bogus=1)


def test_mapped_knobs_warn_once(cache):
    data = make_data()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        ld = NeighborLoader(data, [2], batch_size=8, **MAPPED_VALUES)
        batches = list(ld)
    mine = [x for x in w if "gnnio.pyg.NeighborLoader" in str(x.message)]
    assert len(mine) == 1
    for name in MAPPED_VALUES:
        assert name in str(mine[0].message)
    assert ld.loader.num_workers == min(4, __import__("os").cpu_count())
    assert ld.loader.prefetch == 3 and len(batches) == len(ld)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # PyG's defaults: no warning
        NeighborLoader(data, [2], batch_size=8, num_workers=0, persistent_workers=False)


def test_timeout_is_the_stall_timeout(cache):
    ld = NeighborLoader(make_data(), [2], batch_size=8, timeout=5)
    next(iter(ld))
    assert ld.loader.stall_timeout == 5.0


def test_input_nodes_checked(cache):
    data = make_data()
    for bad in (torch.zeros(3, dtype=torch.bool), torch.tensor([0, 99]), torch.tensor([1.5])):
        with pytest.raises(UsageError, match="input_nodes"):
            NeighborLoader(data, [2], input_nodes=bad)
    ld = NeighborLoader(data, [2], input_nodes=torch.tensor([5, 2, 8]), batch_size=2)
    ids = torch.cat([b.n_id[b.input_id * 0 + torch.arange(b.batch_size)] for b in ld])
    assert torch.equal(ids, torch.tensor([5, 2, 8]))
    assert torch.equal(torch.cat([b.input_id for b in ld]), torch.tensor([0, 1, 2]))


# ---- PyG-style scripts, import line changed ----------------------------------------------------

CORA_RAW = Path("/work/shared/datasets/cora")


@pytest.mark.slow
@pytest.mark.skipif(not CORA_RAW.is_dir(), reason="/work/shared/datasets/cora not present")
@pytest.mark.parametrize(
    "script, args",
    [
        ("reddit_sage.py", ["--epochs", "2"]),
        ("hierarchical_sage.py", ["--epochs", "2"]),
        ("ogbn_models.py", ["--epochs", "2", "--model", "sgformer"]),
        ("distributed_sage.py", ["--epochs", "2", "--world_size", "2"]),
    ],
)
def test_pyg_example_runs_with_one_changed_line(tmp_path, script, args):
    """The scripts of examples/pyg/ are PyG code; with only the import line changed they run on
    gnnio (compare.py records their accuracy against PyG's loader)."""
    sys.path.insert(0, str(ROOT / "benchmarks" / "pyg_examples"))
    import compare as runner

    root = runner.planetoid_root(CORA_RAW, "Cora", tmp_path)
    r = runner.run_one(ROOT / "examples" / "pyg" / script, args, "gnnio", tmp_path, root)
    assert r["rc"] == 0, r.get("error")
    assert r["edits_beyond_import"] == 0 and 0.0 < r["test_acc"] <= 1.0
    assert "from gnnio.pyg import NeighborLoader" in (tmp_path / f"gnnio_{script}").read_text()
