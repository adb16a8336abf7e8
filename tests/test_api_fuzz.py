"""The public Python API under odd but plausible arguments (ids as floats, bools, scalars, 2-D;
empty inputs): a result equal to a plain reference (torch / NumPy indexing, the edge list), or one
exception naming the argument -- never a silently rounded id or an error from deep inside torch.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gnnio import CSRGraph, DatasetWriter
from gnnio.features import (
    FeatureCache,
    InMemoryFeatureStore,
    MultiDeviceFeatureStore,
    ShardedFeatureCache,
    TieredFeatureStore,
)
from gnnio.ordering import ProximityOrder, RandomOrder
from gnnio.placement import Placement, hottest_order
from gnnio.pyg import GnnioFeatureStore
from gnnio.sampling import (
    FrontierSampler,
    LaborSampler,
    LadiesSampler,
    UniformSampler,
    layer_probabilities,
)

N, F = 9, 3
X = torch.arange(N * F, dtype=torch.float32).view(N, F)


def _stores() -> dict[str, GnnioFeatureStore]:
    over_store = GnnioFeatureStore(InMemoryFeatureStore(X))
    over_tensor = GnnioFeatureStore()
    over_tensor.put_tensor(X.clone(), group_name=None, attr_name="x", index=None)
    return {"gnnio store": over_store, "tensor": over_tensor}


def _index(kind: str, ids: list[int]):
    return {
        "list": ids,
        "int64": torch.tensor(ids, dtype=torch.int64),
        "int32": torch.tensor(ids, dtype=torch.int32),
        "float": torch.tensor(ids, dtype=torch.float32) + 0.5,
        "mask": torch.tensor([i in ids for i in range(N)]),
        "short mask": torch.ones(N - 2, dtype=torch.bool),
        "long mask": torch.ones(N + 1, dtype=torch.bool),
        "int": ids[0],
        "0-d": torch.tensor(ids[0]),
        "2-D": torch.tensor(ids[:2] * 2).view(2, 2),
        "slice": slice(ids[0], None, 2),
    }[kind]


KINDS = ["list", "int64", "int32", "float", "mask", "short mask", "long mask", "int", "0-d", "2-D"]


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(
    kind=st.sampled_from([*KINDS, "slice"]),
    ids=st.lists(st.integers(0, N - 1), min_size=2, max_size=6),
    which=st.sampled_from(["gnnio store", "tensor"]),
)
def test_feature_store_index_as_torch_indexes(kind, ids, which):
    """``get_tensor(index=...)`` gives ``x[index]`` where torch's indexing is defined on the
    feature rows; a float index (torch refuses it: never rounded to a row), a bool mask of
    another length than N (torch refuses it: never a mask of the first rows) and a 2-D index are
    one error naming ``index``."""
    index = _index(kind, ids)
    fs = _stores()[which]
    if kind in ("float", "short mask", "long mask", "2-D"):
        with pytest.raises((TypeError, IndexError, ValueError), match="index"):
            fs.get_tensor(group_name=None, attr_name="x", index=index)
        return
    got = fs.get_tensor(group_name=None, attr_name="x", index=index)
    want = X[index]
    assert got.shape == want.shape and torch.equal(got, want)
    size = fs.get_tensor_size(group_name=None, attr_name="x", index=index)
    assert tuple(size) == tuple(want.shape)


def test_a_tensor_put_with_a_node_mask_is_read_by_node():
    """A tensor put with ``index`` = a mask over the graph's nodes holds those nodes' rows, read
    back by node id or by such a mask (its length is the node count, not the tensor's rows)."""
    fs = GnnioFeatureStore()
    nodes = torch.tensor([False, True, False, True, True])
    fs.put_tensor(X[:3].clone(), group_name=None, attr_name="z", index=nodes)
    assert torch.equal(fs.get_tensor(group_name=None, attr_name="z", index=[3]), X[1:2])
    some = torch.tensor([False, False, False, True, True])
    assert torch.equal(fs.get_tensor(group_name=None, attr_name="z", index=some), X[1:3])
    assert tuple(fs.get_tensor_size(group_name=None, attr_name="z", index=some)) == (2, F)


@pytest.mark.parametrize("world_size", [1, 3])
def test_equal_batches_over_no_seeds_is_no_batch(world_size):
    """No seeds (an empty split) with ``equal_batches`` yields no batch, as without it; it raised
    torch's ``tensor_split`` RuntimeError."""
    for rank in range(world_size):
        order = RandomOrder(np.zeros(0, np.int64), 4, rank=rank, world_size=world_size,
                            equal_batches=True)  # fmt: skip
        assert order.num_batches == 0 and list(order.batches(0)) == []


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(
    src=st.lists(st.integers(0, 5), min_size=1, max_size=8),
    data=st.data(),
    form=st.sampled_from(["list", "int32", "tensor", "float", "bool"]),
)
def test_from_edges_keeps_every_edge_or_names_the_ids(src, data, form):
    """``CSRGraph.from_edges`` holds exactly the distinct edges given, or refuses ids that are not
    integers: float ids were truncated (0.5 -> 0) and bool masks read as ids 0/1."""
    dst = data.draw(st.lists(st.integers(0, 5), min_size=len(src), max_size=len(src)))
    s, d = np.array(src), np.array(dst)
    conv = {"list": lambda a: a.tolist(), "int32": lambda a: a.astype(np.int32),
            "tensor": torch.from_numpy, "float": lambda a: a + 0.5,
            "bool": lambda a: a > 2}[form]  # fmt: skip
    if form in ("float", "bool"):
        with pytest.raises(TypeError, match="src: need integer node ids"):
            CSRGraph.from_edges(conv(s), conv(d), 6)
        return
    g = CSRGraph.from_edges(conv(s), conv(d), 6)
    got_src, got_dst = g.edges()
    assert sorted(zip(got_src.tolist(), got_dst.tolist())) == sorted(set(zip(src, dst)))


@pytest.mark.parametrize(("num_nodes", "error"), [(-1, ValueError), (2.5, TypeError)])
def test_from_edges_names_a_bad_node_count(num_nodes, error):
    """A negative or fractional ``num_nodes`` is one error naming it (it was NumPy's
    "'minlength' must not be negative" / a casting rule)."""
    with pytest.raises(error, match="num_nodes"):
        CSRGraph.from_edges([], [], num_nodes)


@pytest.mark.parametrize("size", [float("nan"), float("inf")])
def test_cache_sizes_that_are_no_count_are_named(size):
    """A NaN or infinite cache size or hot-row count is one ValueError naming it (it was
    ``int()``'s "cannot convert float NaN" / an OverflowError)."""
    store = InMemoryFeatureStore(X)
    with pytest.raises(ValueError, match="cache size must be >= 0 and finite"):
        FeatureCache(store, size)
    with pytest.raises(ValueError, match="hot must be a non-negative integer"):
        TieredFeatureStore(store, hot=size, simulate=True)


@pytest.mark.parametrize("policy", ["static", "lookahead"])
@pytest.mark.parametrize(
    ("hot_ids", "error"),
    [
        ([0.5, 2.0], TypeError),
        (np.ones(N, dtype=bool), TypeError),
        (np.array([[1, 2]]), ValueError),
    ],
)
def test_cache_hot_ids_are_ids_or_named(policy, hot_ids, error):
    """A cache's ``hot_ids`` are integer ids: float ids were truncated (0.5 cached row 0), a bool
    mask read as ids 0/1 ("keys contain duplicates"), a 2-D array flattened."""
    with pytest.raises(error, match="hot_ids"):
        FeatureCache(InMemoryFeatureStore(X), 4, policy=policy, hot_ids=hot_ids)
    with pytest.raises(error, match="hot_ids"):
        ShardedFeatureCache(InMemoryFeatureStore(X), 2, 4, policy="static", hot_ids=hot_ids)


@pytest.mark.parametrize("fanouts", [[1.5], ["3"], "2,3", 5, None])
@pytest.mark.parametrize("sampler", [UniformSampler, FrontierSampler, LaborSampler, LadiesSampler])
def test_fanouts_are_integers_or_named(sampler, fanouts):
    """Fanouts (layer sizes) are a list of integers: 1.5 was truncated to 1, "3" read as 3, and a
    string or a bare int ended in Python's "invalid literal" / "not iterable"."""
    g = CSRGraph.from_edges(np.arange(N), (np.arange(N) + 1) % N, N)
    with pytest.raises(TypeError, match="fanouts|layer_sizes"):
        sampler(g, fanouts)


@pytest.mark.parametrize("device", ["bogus", "cuda:x", object()])
def test_an_unknown_device_is_named(device):
    """A device torch cannot parse is one ValueError naming ``device`` (torch's RuntimeError
    listing its device types before)."""
    with pytest.raises(ValueError, match="device: unknown device"):
        InMemoryFeatureStore(X, device=device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:1", 0])
def test_a_cuda_store_without_cuda_is_named(device):
    """A store asked to live on a GPU where torch has none is one ValueError naming the device
    (torch's "Torch not compiled with CUDA enabled" AssertionError before)."""
    with pytest.raises(ValueError, match="CUDA is not available"):
        InMemoryFeatureStore(X, device=device)


def test_layer_probabilities_refuses_a_negative_budget_and_bad_q_ids():
    """``layer_probabilities`` with a negative ``layer_size`` returned negative inclusion
    probabilities (or divided by zero); ``q_ids`` out of range wrapped (-1 marked the last node)
    or failed in NumPy, and float ids were truncated. Each is now a ValueError naming it."""
    g = CSRGraph.from_edges(np.arange(N), (np.arange(N) + 1) % N, N)
    cand, pi = layer_probabilities(g, [0, 3], 1)
    assert pi.sum() == pytest.approx(1.0) and (pi >= 0).all() and len(cand) == 2
    with pytest.raises(ValueError, match="layer_size"):
        layer_probabilities(g, [0, 3], -1)
    for q_ids in ([-1], [N], [0.5], [[1]]):
        with pytest.raises(ValueError, match="q_ids"):
            layer_probabilities(g, [0, 3], 1, scale=2.0, q_ids=q_ids)


@pytest.mark.parametrize("key", ["../escaped", "sub/dir", ".hidden", ""])
def test_dataset_writer_writes_only_inside_its_directory(tmp_path, key):
    """An array name with a path in it is one ValueError, and no file is left anywhere: "../x"
    wrote ``x.npy`` beside the dataset (then a "symlink outside the dataset" error), an absolute
    name wrote wherever it pointed, "sub/dir" ended in FileNotFoundError."""
    with pytest.raises(ValueError, match="array name"):
        with DatasetWriter(tmp_path / "out", name="x") as w:
            w.save_array(key, np.zeros(3))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("batch_size", [2.5, "3"])
def test_a_seed_order_batch_size_is_an_integer(batch_size):
    """A seed order's batch size is an integer: 2.5 made batches of 2 and "3" batches of 3;
    now one TypeError naming batch_size (for every order: the check is the base class's)."""
    g = CSRGraph.from_edges(np.arange(N), (np.arange(N) + 1) % N, N)
    with pytest.raises(TypeError, match="batch_size"):
        RandomOrder(np.arange(N), batch_size)
    with pytest.raises(TypeError, match="batch_size"):
        ProximityOrder(g, np.arange(N), np.zeros(N, np.int64), batch_size)


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(
    probs=st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0]), min_size=1, max_size=12),
    data=st.data(),
)
def test_hottest_order_among_is_ranked_or_refused(probs, data):
    """``hottest_order(probs, among=...)`` ranks exactly the ids given (hottest first, ties by
    id), or refuses what is not distinct ids in range: -1 came back as a ranked "node", a bool
    mask was ranked as ids 0/1, float ids were truncated."""
    n = len(probs)
    p = np.array(probs)
    among = data.draw(st.lists(st.integers(-1, n), max_size=n + 1))
    form = data.draw(st.sampled_from(["ids", "mask", "float"]))
    arg = {"ids": np.array(among, np.int64), "mask": np.arange(n) % 2 == 0,
           "float": np.array(among, np.float64) + 0.5}[form]  # fmt: skip
    ok = form == "ids" and len(set(among)) == len(among) and all(0 <= i < n for i in among)
    if not ok and arg.size:
        with pytest.raises(ValueError, match="among"):
            hottest_order(p, among=arg)
        return
    got = hottest_order(p, among=arg)
    want = sorted(among, key=lambda i: (-p[i], i))
    assert got.tolist() == want


@pytest.mark.parametrize(
    "buffer", [[-1, 2], [N], [1, 1], [0.5], [[1, 2]], np.array([True, False])]
)  # fmt: skip
def test_a_hand_made_placement_is_checked(buffer):
    """A placement made by hand is checked before its shards are filled: an id out of range was
    torch's "index out of range in self", a float id was truncated and a bool mask read as ids
    0/1 (a wrong shard, though every row still came from the host copy)."""
    with pytest.raises(ValueError, match="placement 'hand': buffer 0"):
        MultiDeviceFeatureStore(X, Placement("hand", N, ((0,),), [buffer]))
