"""TieredFeatureStore: routing, counters, budget, pin failures, simulated devices, zero-copy helpers.

Everything except the ``gpu``-marked tests runs on the CPU with a simulated GPU tier.
"""

from __future__ import annotations

import atexit
import gc
import itertools
import os
import shutil
import tempfile
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gnnio.errors import GnnioError, UsageError
from gnnio.features import InMemoryFeatureStore, MmapFeatureStore
from gnnio.features.tiers import uva
from gnnio.features.tiers.simdevice import (
    SimulatedDevice,
    SimulatedOutOfMemory,
    pin_limit,
    simulated_pin,
)
from gnnio.features.tiers.tiered import TieredFeatureStore, TieringWarning, hot_rows_for_fraction

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")

_SCRATCH = tempfile.mkdtemp(prefix="gnnio-tiered-tests-")
atexit.register(shutil.rmtree, _SCRATCH, True)
_names = itertools.count()


def _memmap(feats: np.ndarray) -> np.memmap:
    path = os.path.join(_SCRATCH, f"m{next(_names)}.npy")
    np.save(path, feats)
    return np.load(path, mmap_mode="r")


def _bits(t: torch.Tensor) -> bytes:
    return t.detach().cpu().contiguous().numpy().tobytes()


class RecordingPin:
    """A pin function that records the byte counts it was asked for (and pins nothing)."""

    def __init__(self):
        self.calls: list[int] = []

    def __call__(self, t: torch.Tensor):
        self.calls.append(t.numel() * t.element_size())
        return simulated_pin(t)


def _expected_hot(requested: int, rb: int, table_bytes: int, budget: int | None) -> int:
    """Largest h <= requested whose GPU tier (h rows + table if h > 0) fits the budget."""
    if budget is None:
        return requested
    for h in range(requested, -1, -1):
        if h * rb + (table_bytes if h > 0 else 0) <= budget:
            return h
    return 0


# ---- the property: exactly the rows of the plain store, for any ids ----------------------------


@st.composite
def configs(draw):
    n = draw(st.integers(1, 50))
    dim = draw(st.integers(0, 6))
    dtype = draw(st.sampled_from([np.float32, np.float16, np.int64]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    feats = (rng.standard_normal((n, dim)) * 100).astype(dtype)
    mode = draw(st.sampled_from(["prefix", "lookup", "scores"]))
    if mode == "prefix":
        hot = {"hot": draw(st.integers(0, n + 3))}
    elif mode == "lookup":
        hot = {"hot_ids": np.array(draw(st.lists(st.integers(0, n - 1), max_size=2 * n)), np.int64)}
    else:
        hot = {"fraction": draw(st.sampled_from([0.0, 0.1, 0.5, 1.0, 1.7]))}
    backing = draw(st.sampled_from(["array", "tensor", "memory-store", "memmap", "mmap-store"]))
    if dim == 0 and backing == "mmap-store":  # MmapFeatureStore refuses zero-width rows
        backing = "array"
    cold_mode = draw(st.sampled_from(["auto", "zero_copy", "cpu_gather"]))
    budget = draw(st.one_of(st.none(), st.integers(0, n * (dim * 8 + 4) + 8)))
    ids = draw(st.lists(st.integers(0, n - 1), max_size=80))
    id_kind = draw(st.sampled_from(["list", "int32", "int64", "tensor"]))
    extra = draw(st.one_of(st.none(), st.integers(0, 3)))
    return feats, mode, hot, backing, cold_mode, budget, ids, id_kind, extra


def _make_backing(feats: np.ndarray, kind: str):
    if kind == "array":
        return feats
    if kind == "tensor":
        return torch.from_numpy(feats.copy())
    if kind == "memory-store":
        return InMemoryFeatureStore(feats)
    if kind == "memmap":
        return _memmap(feats)
    return MmapFeatureStore(_memmap(feats))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs())
def test_tiered_returns_exactly_the_plain_rows(cfg):
    feats, mode, hot, backing_kind, cold_mode, budget, ids, id_kind, extra = cfg
    n, dim = feats.shape
    backing = _make_backing(feats, backing_kind)
    sim = SimulatedDevice()
    kw = dict(cold_mode=cold_mode, gpu_budget_bytes=budget, simulate=sim)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TieringWarning)
        if mode == "scores":
            score = np.random.default_rng(n).random(n)
            store = TieredFeatureStore.from_scores(backing, score, hot["fraction"], **kw)
            hot_list = np.argsort(-score, kind="stable")[
                : hot_rows_for_fraction(hot["fraction"], n)
            ]
        else:
            store = TieredFeatureStore(backing, **hot, **kw)
            if mode == "prefix":
                hot_list = np.arange(min(hot["hot"], n))
            else:
                _, first = np.unique(hot["hot_ids"], return_index=True)
                hot_list = hot["hot_ids"][np.sort(first)]
    rb = feats.dtype.itemsize * dim
    assert store.row_bytes == rb
    table = 4 * n if mode != "prefix" else 0
    h = _expected_hot(len(hot_list), rb, table, budget)
    assert store.num_hot == h and store.requested_hot == len(hot_list)
    assert store.clamped_by_budget == (h < len(hot_list))
    if budget is not None:
        assert store.gpu_tier_bytes <= budget
        assert sim.peak_bytes <= budget  # what was really allocated on the simulated GPU
    hot_set = set(hot_list[:h].tolist())

    np_ids = np.array(ids, dtype=np.int64)
    arg = {
        "list": ids,
        "int32": np_ids.astype(np.int32),
        "int64": np_ids,
        "tensor": torch.from_numpy(np_ids),
    }[id_kind]
    out = None
    if extra is not None:
        out = torch.full((len(ids) + extra, dim), 3, dtype=store.dtype)
    got = store.gather(arg, out=out)
    assert got.shape == (len(ids), dim) and got.dtype == store.dtype
    assert _bits(got) == feats[np_ids].tobytes()
    if out is not None and len(ids):
        assert got.data_ptr() == out.data_ptr()
    n_gpu = sum(i in hot_set for i in ids)
    snap = store.counters.snapshot()
    assert snap["rows"].get("gpu", 0) == n_gpu
    assert snap["rows"].get("host", 0) == len(ids) - n_gpu
    assert snap["bytes"].get("gpu", 0) == n_gpu * rb
    assert snap["bytes"].get("host", 0) == (len(ids) - n_gpu) * rb
    assert set(snap["rows"]) <= {"gpu", "host"}
    assert store.is_hot(np_ids).tolist() == [i in hot_set for i in ids]
    # account() routes and counts exactly like gather()
    store.counters.reset()
    assert store.account(np_ids) == (n_gpu, len(ids) - n_gpu)
    assert store.counters.snapshot() == snap


# ---- routing modes and constructors ---------------------------------------------------------------


def test_prefix_mode_routes_by_boundary():
    feats = np.arange(40, dtype=np.float32).reshape(10, 4)
    store = TieredFeatureStore(feats, hot=3)
    assert store.mode == "prefix" and store.num_hot == 3 and store.device.type == "cpu"
    assert store.simulated and store.gpu_name == "sim:cuda:0"
    got = store.gather([9, 0, 2, 3, 0])
    assert torch.equal(got, torch.from_numpy(feats[[9, 0, 2, 3, 0]]))
    assert store.counters.snapshot() == {
        "rows": {"gpu": 3, "host": 2},
        "bytes": {"gpu": 48, "host": 32},
    }
    assert store.gpu_tier_bytes == 3 * 16 and store.load_bytes == 3 * 16


def test_lookup_mode_uses_an_int32_table_counted_in_the_tier():
    feats = np.arange(20, dtype=np.float32).reshape(10, 2)
    sim = SimulatedDevice()
    store = TieredFeatureStore(feats, hot_ids=[7, 2, 7, 5], simulate=sim)
    assert store.mode == "lookup" and store.hot_ids.tolist() == [7, 2, 5]
    assert store._table.dtype == torch.int32
    assert store.gpu_tier_bytes == 3 * 8 + 10 * 4 == sim.allocated_bytes
    store.gather([5, 0, 7])
    assert store.counters.rows == {"gpu": 2, "host": 1}


def test_from_scores_takes_the_top_fraction_ties_by_id():
    feats = np.zeros((10, 1), dtype=np.float32)
    score = np.array([1, 5, 5, 0, 9, 2, 5, 0, 0, 0])
    store = TieredFeatureStore.from_scores(feats, score, 0.3)
    assert store.hot_ids.tolist() == [4, 1, 2]  # 9 first, then the 5s by id
    assert TieredFeatureStore.from_scores(feats, torch.from_numpy(score), 0.3).hot_ids.tolist() == [
        4,
        1,
        2,
    ]
    with pytest.raises(ValueError, match="shape"):
        TieredFeatureStore.from_scores(feats, score[:5], 0.3)


def test_from_reordered_is_a_prefix():
    feats = np.zeros((20, 1), dtype=np.float32)
    assert TieredFeatureStore.from_reordered(feats, 0.25).num_hot == 5
    assert TieredFeatureStore.from_reordered(feats, 0).num_hot == 0
    assert TieredFeatureStore.from_reordered(feats, 1.0).num_hot == 20
    assert TieredFeatureStore.from_reordered(feats, 3.0).num_hot == 20
    assert hot_rows_for_fraction(0.29, 100) == 29
    with pytest.raises(ValueError):
        hot_rows_for_fraction(-0.1, 10)
    with pytest.raises(ValueError):
        hot_rows_for_fraction(float("nan"), 10)


def test_wraps_any_feature_store_and_leaves_its_counters_to_it():
    feats = np.random.default_rng(0).standard_normal((30, 3)).astype(np.float32)
    mmap_store = MmapFeatureStore(_memmap(feats))
    store = TieredFeatureStore.from_reordered(mmap_store, 0.2)
    assert store.cold_mode_used == "cpu_gather" and "MmapFeatureStore" in store.cold_mode_reason
    mmap_store.counters.reset()
    got = store.gather([0, 29, 10, 1])
    assert torch.equal(got, torch.from_numpy(feats[[0, 29, 10, 1]]))
    assert store.counters.rows == {"gpu": 2, "host": 2}
    assert mmap_store.counters.rows == {"disk": 2}  # the cold reads went through the backing


def test_bfloat16_tensor_backing():
    t = torch.randn(12, 5).to(torch.bfloat16)
    store = TieredFeatureStore(t, hot_ids=[3, 11])
    assert store.cold_mode_used == "zero_copy"
    ids = [11, 0, 3, 7]
    assert torch.equal(store.gather(ids), t[ids])
    store = TieredFeatureStore(t, hot_ids=[3, 11], cold_mode="cpu_gather")
    assert torch.equal(store.gather(ids), t[ids])


# ---- hot fraction 0 and 1: never a zero-byte pin ------------------------------------------------


@pytest.mark.parametrize("fraction", [0.0, 0.1, 1.0, 2.0])
@pytest.mark.parametrize("make", ["reordered", "scores"])
def test_no_zero_byte_pin_at_any_hot_fraction(fraction, make):
    feats = np.arange(40, dtype=np.float32).reshape(20, 2)
    pin = RecordingPin()
    if make == "reordered":
        store = TieredFeatureStore.from_reordered(feats, fraction, pin_fn=pin)
    else:
        store = TieredFeatureStore.from_scores(feats, np.arange(20.0), fraction, pin_fn=pin)
    assert all(b > 0 for b in pin.calls)
    if fraction >= 1:
        assert pin.calls == [] and store.cold_mode_used == "none"
        assert store.counters.rows == {}
        store.gather([0, 19])
        assert store.counters.rows == {"gpu": 2}
    else:
        assert pin.calls == [feats.nbytes] and store.cold_mode_used == "zero_copy"
    ids = np.arange(20)[::-1].copy()
    assert torch.equal(store.gather(ids), torch.from_numpy(feats[ids]))


def test_no_zero_byte_pin_for_empty_or_zero_width_tables():
    pin = RecordingPin()
    empty = TieredFeatureStore(np.zeros((0, 4), np.float32), hot=0, pin_fn=pin)
    assert empty.gather([]).shape == (0, 4) and empty.cold_mode_used == "none"
    narrow = TieredFeatureStore(np.zeros((5, 0), np.float32), hot=2, pin_fn=pin)
    assert narrow.gather([4, 0]).shape == (2, 0)
    assert narrow.cold_mode_used == "cpu_gather"
    assert pin.calls == []
    with pytest.raises(ValueError, match="zero-byte"):
        simulated_pin(torch.empty(0))


# ---- pin failures: fall back and say so, or raise one clear line ---------------------------------


def _failing_pin(t):
    raise RuntimeError("CUDA error: invalid argument\nmore detail on a second line")


def test_pin_failure_in_auto_mode_falls_back_and_says_so():
    feats = np.arange(60, dtype=np.float32).reshape(20, 3)
    with pytest.warns(
        TieringWarning, match=r"cannot pin 240 B .*falling back to cold_mode='cpu_gather'"
    ):
        store = TieredFeatureStore.from_reordered(feats, 0.1, pin_fn=_failing_pin)
    assert store.cold_mode_used == "cpu_gather"
    assert "pin failed" in store.cold_mode_reason and "host RAM" in store.cold_mode_reason
    assert store.describe()["cold_mode_used"] == "cpu_gather"
    ids = [19, 0, 5, 1]
    assert torch.equal(store.gather(ids), torch.from_numpy(feats[ids]))
    assert store.counters.rows == {"gpu": 2, "host": 2}


def test_pin_failure_in_zero_copy_mode_raises_one_line_with_size_and_limit():
    feats = np.zeros((1000, 64), dtype=np.float32)  # 250 KiB
    with pytest.raises(uva.PinError) as ei:
        TieredFeatureStore.from_reordered(feats, 0.1, cold_mode="zero_copy", pin_fn=pin_limit(4096))
    msg = str(ei.value)
    assert "\n" not in msg
    assert "250.00 KiB" in msg and "4.00 KiB pinnable" in msg and "host RAM available" in msg
    assert "cold_mode='auto'" in msg
    assert isinstance(ei.value, GnnioError)  # the CLI prints it as one line
    # generic exceptions from the pin call are turned into the same kind of line
    with pytest.raises(
        uva.PinError,
        match=r"cannot pin 250.00 KiB .*RuntimeError: CUDA error: invalid argument\); limit",
    ):
        TieredFeatureStore.from_reordered(feats, 0.1, cold_mode="zero_copy", pin_fn=_failing_pin)


def test_pin_limit_lets_small_tables_through():
    feats = np.zeros((10, 4), dtype=np.float32)
    store = TieredFeatureStore.from_reordered(
        feats, 0.5, cold_mode="zero_copy", pin_fn=pin_limit(1 << 20)
    )
    assert store.cold_mode_used == "zero_copy"


def test_pin_failure_message_names_shared_memory():
    t = torch.zeros(100, 4).share_memory_()
    msg = uva.host_memory_limits(t)
    assert "shared memory" in msg


def test_zero_copy_over_a_backing_without_a_ram_tensor_materializes_it():
    feats = np.arange(30, dtype=np.float32).reshape(10, 3)
    pin = RecordingPin()
    store = TieredFeatureStore.from_reordered(
        _memmap(feats), 0.2, cold_mode="zero_copy", pin_fn=pin
    )
    assert store.cold_mode_used == "zero_copy" and pin.calls == [feats.nbytes]
    assert torch.equal(store.gather([9, 0, 4]), torch.from_numpy(feats[[9, 0, 4]]))


# ---- the GPU memory budget -----------------------------------------------------------------------


def test_budget_clamps_hot_rows_and_reports_it():
    feats = np.zeros((100, 8), dtype=np.float32)  # 32 B rows
    sim = SimulatedDevice(capacity_bytes=10_000)
    with pytest.warns(TieringWarning, match="holds 3 of the 10 requested hot rows"):
        store = TieredFeatureStore(feats, hot=10, gpu_budget_bytes=100, simulate=sim)
    assert store.num_hot == 3 and store.clamped_by_budget and store.gpu_tier_bytes == 96
    assert sim.peak_bytes <= 100
    d = store.describe()
    assert d["requested_hot"] == 10 and d["num_hot"] == 3 and d["gpu_budget_bytes"] == 100


def test_budget_counts_the_lookup_table():
    feats = np.zeros((100, 8), dtype=np.float32)
    ids = np.arange(50)
    with pytest.warns(TieringWarning, match=r"holds 2 of the 50 .* lookup table"):
        store = TieredFeatureStore(feats, hot_ids=ids, gpu_budget_bytes=400 + 64 + 31)
    assert store.num_hot == 2 and store.gpu_tier_bytes == 464
    with pytest.warns(TieringWarning, match="holds 0 of the 50"):
        store = TieredFeatureStore(feats, hot_ids=ids, gpu_budget_bytes=399)
    assert store.num_hot == 0 and store.gpu_tier_bytes == 0 and store._table is None
    assert store.gather([0, 99]).shape == (2, 8)
    assert store.counters.rows == {"host": 2}


def test_budget_that_fits_does_not_warn():
    feats = np.zeros((10, 2), dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        store = TieredFeatureStore(feats, hot=10, gpu_budget_bytes=80)
    assert store.num_hot == 10 and not store.clamped_by_budget


def test_simulated_device_capacity_is_enforced():
    sim = SimulatedDevice("sim:cuda:1", capacity_bytes=100)
    with pytest.raises(SimulatedOutOfMemory, match=r"sim:cuda:1: cannot allocate 160 B"):
        TieredFeatureStore(np.zeros((10, 4), np.float32), hot=10, simulate=sim)
    a = sim.empty((10,), torch.float32)
    assert sim.allocated_bytes == 40
    del a
    gc.collect()
    assert sim.allocated_bytes == 0 and sim.peak_bytes == 40


# ---- devices and argument errors -----------------------------------------------------------------


def test_bad_arguments_are_refused():
    feats = np.zeros((10, 2), dtype=np.float32)
    with pytest.raises(ValueError, match="exactly one"):
        TieredFeatureStore(feats)
    with pytest.raises(ValueError, match="exactly one"):
        TieredFeatureStore(feats, hot=2, hot_ids=[1])
    with pytest.raises(ValueError, match="cold_mode"):
        TieredFeatureStore(feats, hot=2, cold_mode="dma")
    with pytest.raises(ValueError, match="hot must"):
        TieredFeatureStore(feats, hot=-1)
    with pytest.raises(IndexError, match="out of range"):
        TieredFeatureStore(feats, hot_ids=[3, 10])
    with pytest.raises(ValueError, match="gpu_budget_bytes"):
        TieredFeatureStore(feats, hot=1, gpu_budget_bytes=-5)
    with pytest.raises(TypeError, match="backing"):
        TieredFeatureStore([[1.0]], hot=0)
    with pytest.raises(UsageError, match="simulate=False"):
        TieredFeatureStore(feats, hot=1, simulate=False)
    with pytest.raises(UsageError, match="supports"):
        TieredFeatureStore(feats, hot=1, device="meta")
    store = TieredFeatureStore(feats, hot=3)
    with pytest.raises(IndexError, match="out of range"):
        store.gather([0, 10])
    with pytest.raises(TypeError):
        store.gather(np.array([0.5]))
    with pytest.raises(ValueError):
        store.gather([1, 2], out=torch.empty((1, 2)))
    assert store.counters.rows == {}


@pytest.mark.skipif(CUDA, reason="checks the message shown when CUDA is missing")
def test_cuda_device_without_cuda_is_a_usage_error_unless_simulated():
    feats = np.zeros((10, 2), dtype=np.float32)
    with pytest.raises(UsageError, match="CUDA is not available.*device='cpu'"):
        TieredFeatureStore(feats, hot=1, device="cuda")
    store = TieredFeatureStore(feats, hot=1, device="cuda:1", simulate=True)
    assert store.simulated and store.gpu_name == "sim:cuda:1" and store.device.type == "cpu"
    with pytest.raises(uva.PinError, match="CUDA is not available"):
        uva.pin_host_tensor(torch.ones(4))


def test_close_releases_the_tiers():
    feats = np.zeros((10, 2), dtype=np.float32)
    sim = SimulatedDevice()

    class Handle:
        released = False

        def release(self):
            Handle.released = True

    with TieredFeatureStore(feats, hot_ids=[1, 2], simulate=sim, pin_fn=lambda t: Handle()) as st_:
        assert st_.cold_mode_used == "zero_copy"
    assert Handle.released
    gc.collect()
    assert sim.allocated_bytes == 0


def test_format_bytes():
    assert uva.format_bytes(5) == "5 B"
    assert uva.format_bytes(1536) == "1.50 KiB"
    assert uva.format_bytes(3 << 30) == "3.00 GiB"


# ---- the traffic experiment on a tiny graph ------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_dataset(tmp_path_factory):
    import gnnio
    from tests.helpers import write_tiny_dataset

    path = write_tiny_dataset(tmp_path_factory.mktemp("tier") / "tiny", num_nodes=300,
                              num_edges=2400, feat_dim=6)  # fmt: skip
    return gnnio.load(path)


def test_host_traffic_experiment_counts_match_the_access_counts(tiny_dataset):
    from gnnio.bench.tiers import host_traffic_experiment
    from gnnio.preprocess.hotness import out_degree, presample_counts

    ds = tiny_dataset
    fanouts, bs, epochs, seed = (4, 3), 16, 2, 5
    counts = presample_counts(ds.graph, ds.train_idx, fanouts, bs, epochs=epochs, seed=seed,
                              progress=False)  # fmt: skip
    scores = {
        "degree": out_degree(ds.graph, progress=False),
        "random": np.random.default_rng(1).random(ds.num_nodes),
        "oracle": counts,
    }
    fracs = (0.0, 0.05, 0.1, 0.25, 1.0)
    res = host_traffic_experiment(ds, scores, fracs, fanouts, bs, epochs, seed, progress=False)
    rb = 6 * 4
    assert res["row_bytes"] == rb and res["simulated"]
    total = counts.sum()
    assert res["requested_rows_per_epoch"] == total / epochs
    assert res["requested_bytes_per_epoch"] == total * rb / epochs
    by = {(r["score"], r["fraction"]): r for r in res["rows"]}
    assert len(by) == len(scores) * len(fracs)
    for name, s in scores.items():
        prev = None
        for f in fracs:
            r = by[(name, f)]
            h = hot_rows_for_fraction(f, ds.num_nodes)
            hot = np.argsort(-np.asarray(s, dtype=np.float64), kind="stable")[:h]
            want_host = (total - counts[hot].sum()) / epochs  # independent of the store
            assert r["hot_rows"] == h
            assert r["host_rows_per_epoch"] == want_host
            assert r["host_bytes_per_epoch"] == want_host * rb
            assert r["gpu_rows_per_epoch"] + r["host_rows_per_epoch"] == total / epochs
            assert by[("oracle", f)]["host_bytes_per_epoch"] <= r["host_bytes_per_epoch"]
            if prev is not None:
                assert r["host_bytes_per_epoch"] <= prev
            prev = r["host_bytes_per_epoch"]
        assert by[(name, 0.0)]["traffic_reduction"] == 0.0
        assert by[(name, 1.0)]["host_bytes_per_epoch"] == 0 and by[(name, 1.0)]["hit_ratio"] == 1.0
    # routing-only counting gives the same numbers
    fast = host_traffic_experiment(ds, scores, fracs, fanouts, bs, epochs, seed, count_only=True,
                                   progress=False)  # fmt: skip
    assert fast["rows"] == res["rows"]


def test_host_traffic_experiment_errors(tiny_dataset):
    from gnnio.bench.tiers import host_traffic_experiment

    with pytest.raises(UsageError, match="scores"):
        host_traffic_experiment(tiny_dataset, {}, progress=False)
    with pytest.raises(ValueError, match="fraction"):
        host_traffic_experiment(tiny_dataset, {"d": np.ones(300)}, fractions=(-1,), progress=False)


def test_gpu_gather_bandwidth_needs_cuda():
    from gnnio.bench.tiers import gpu_gather_bandwidth

    if CUDA:
        pytest.skip("checks the message shown when CUDA is missing")
    with pytest.raises(UsageError, match="CUDA"):
        gpu_gather_bandwidth()


# ---- on a real GPU ------------------------------------------------------------------------------


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("cold_mode", ["zero_copy", "cpu_gather"])
@pytest.mark.parametrize("mode", ["prefix", "lookup"])
def test_cuda_tiered_gather_equals_plain_gather(cold_mode, mode):
    rng = np.random.default_rng(0)
    feats = rng.standard_normal((5000, 33)).astype(np.float32)
    if mode == "prefix":
        store = TieredFeatureStore.from_reordered(feats, 0.1, device="cuda", cold_mode=cold_mode)
    else:
        store = TieredFeatureStore.from_scores(
            feats, rng.random(5000), 0.1, device="cuda", cold_mode=cold_mode
        )
    assert not store.simulated and store.device.type == "cuda"
    assert store.cold_mode_used == cold_mode
    ids = rng.integers(0, 5000, 20000)
    for arg in (ids, torch.from_numpy(ids).cuda()):
        got = store.gather(arg)
        assert got.device.type == "cuda"
        assert _bits(got) == feats[ids].tobytes()
    out = torch.empty((20000, 33), device="cuda")
    for _ in range(3):  # reused output and staging buffers
        assert _bits(store.gather(ids, out=out)) == feats[ids].tobytes()
    hot = store.is_hot(ids).cpu().numpy()
    assert store.counters.rows["gpu"] == 5 * hot.sum()
    store.close()


@pytest.mark.gpu
@needs_cuda
def test_cuda_view_aliases_pinned_host_memory():
    host = torch.arange(4000, dtype=torch.float32).reshape(1000, 4)
    handle = uva.pin_host_tensor(host, "cuda")
    assert host.is_pinned() and handle.registered
    again = uva.pin_host_tensor(host, "cuda")  # a second user shares the registration
    view = uva.device_view(host, "cuda")
    assert view.device.type == "cuda" and view.data_ptr() == host.data_ptr()
    idx = torch.tensor([999, 0, 5], device="cuda")
    assert torch.equal(view.index_select(0, idx).cpu(), host[[999, 0, 5]])
    host[5, 0] = -1.0  # the GPU sees host writes: it reads the same memory
    assert view[5, 0].item() == -1.0
    handle.release()
    assert host.is_pinned()  # still held by ``again``
    del view
    again.release()
    assert not host.is_pinned()


@pytest.mark.gpu
@needs_cuda
def test_stale_cuda_error_from_a_failed_register_is_cleared():
    host = torch.ones(1024, 4)
    cudart = torch.cuda.cudart()
    assert int(cudart.cudaHostRegister(host.data_ptr(), 16384, 0)) == 0
    assert int(cudart.cudaHostRegister(host.data_ptr(), 16384, 0)) != 0  # already registered
    uva.clear_last_cuda_error("cuda")
    assert torch.ones(3, device="cuda").add_(1).sum().item() == 6.0  # no stale error surfaces
    cudart.cudaHostUnregister(host.data_ptr())


@pytest.mark.gpu
@needs_cuda
def test_cuda_pin_failure_falls_back_and_cuda_keeps_working():
    feats = np.random.default_rng(0).standard_normal((100, 8)).astype(np.float32)
    with pytest.warns(TieringWarning, match="falling back"):
        store = TieredFeatureStore.from_reordered(feats, 0.1, device="cuda", pin_fn=_failing_pin)
    assert store.cold_mode_used == "cpu_gather"
    assert _bits(store.gather([99, 0, 50])) == feats[[99, 0, 50]].tobytes()


@pytest.mark.gpu
@needs_cuda
def test_cuda_budget_bounds_device_memory():
    feats = np.zeros((10_000, 32), dtype=np.float32)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    with pytest.warns(TieringWarning):
        store = TieredFeatureStore(
            feats, hot_ids=np.arange(5000), device="cuda", gpu_budget_bytes=200_000
        )
    grown = torch.cuda.memory_allocated() - before
    assert store.gpu_tier_bytes <= 200_000
    assert grown <= 200_000 + 2 * 512  # the caching allocator rounds each block up to 512 B


@pytest.mark.gpu
@needs_cuda
def test_gpu_gather_bandwidth_returns_positive_numbers():
    from gnnio.bench.tiers import gpu_gather_bandwidth

    res = gpu_gather_bandwidth(num_rows=50_000, dim=32, batch_rows=10_000, warmup=1, passes=3,
                               hot_fractions=(0.0, 1.0))  # fmt: skip
    for k in ("gpu_resident", "d2d_copy", "zero_copy", "h2d_copy", "cpu_gather_copy"):
        assert res[k] > 0
    assert res["tiered"]["0.0"]["cold_mode_used"] == "zero_copy"
