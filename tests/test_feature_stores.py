"""The shared contract every FeatureStore must pass.

To put a new store under the contract (tiered, caches, multi-device, ...), append one entry
``(name, factory)`` to ``STORE_FACTORIES``: ``factory(features_np) -> FeatureStore`` builds a store
serving exactly the rows of the ``[N, F]`` NumPy array it is given. Every test below runs over every
factory. Store-specific behaviour (tier names, no full read of a mapped file) is tested at the end.
"""

from __future__ import annotations

import atexit
import itertools
import os
import resource
import shutil
import tempfile

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gnnio.errors import DatasetError, UsageError
from gnnio.features import (
    CrossBatchReuse,
    DiskFeatureStore,
    FeatureCache,
    FeatureStore,
    InMemoryFeatureStore,
    MmapFeatureStore,
    MultiDeviceFeatureStore,
    ShardedFeatureCache,
    TieredFeatureStore,
    open_store,
    static_plus_dynamic,
    two_level_cache,
)
from gnnio.features._gather import HAVE_NUMBA
from tests.helpers import write_tiny_dataset

# ---- factories -------------------------------------------------------------------------------

_SCRATCH = tempfile.mkdtemp(prefix="gnnio-store-tests-")
atexit.register(shutil.rmtree, _SCRATCH, True)
_names = itertools.count()


def _npy_file(features: np.ndarray) -> str:
    """Write ``features`` to a fresh .npy file in the scratch directory and return its path."""
    path = os.path.join(_SCRATCH, f"f{next(_names)}.npy")
    np.save(path, features)
    return path


def _raw_memmap(features: np.ndarray) -> np.memmap:
    """``features`` as a writable-mode memmap of a raw file (the layout DatasetWriter streams)."""
    path = os.path.join(_SCRATCH, f"r{next(_names)}.bin")
    mm = np.memmap(path, dtype=features.dtype, mode="w+", shape=features.shape)
    mm[:] = features
    mm.flush()
    return np.memmap(path, dtype=features.dtype, mode="c", shape=features.shape)


STORE_FACTORIES = [
    ("memory", lambda f: InMemoryFeatureStore(f)),
    ("memory-torch-input", lambda f: InMemoryFeatureStore(torch.from_numpy(f.copy()))),
    ("memory-torch-kernel", lambda f: InMemoryFeatureStore(f, kernel="torch")),
    ("memory-1-thread", lambda f: InMemoryFeatureStore(f, num_threads=1)),
    ("mmap-npy-path", lambda f: MmapFeatureStore(_npy_file(f))),
    ("mmap-memmap", lambda f: MmapFeatureStore(_raw_memmap(f))),
    ("mmap-torch-kernel", lambda f: MmapFeatureStore(_npy_file(f), kernel="torch")),
]
if torch.cuda.is_available():  # the same contract on a GPU-resident store
    STORE_FACTORIES.append(("memory-cuda", lambda f: InMemoryFeatureStore(f, device="cuda")))


# ---- wrapper stores (tiered, caches, reuse, multi-device) over the same contract -------------
# Capacities are fractions of N or tiny row counts, so the caches are smaller than most batches
# drawn above (evictions, and more misses than capacity, happen in every test).


def _scores(features: np.ndarray) -> np.ndarray:
    """A fixed pseudo-random hotness score per row (ties broken by id, as in gnnio.preprocess.reorder)."""
    return np.random.default_rng(features.shape[0]).random(features.shape[0])


def _hot_order(features: np.ndarray) -> np.ndarray:
    """Global ids hottest first by :func:`_scores`."""
    return np.argsort(-_scores(features), kind="stable")


def _tiered_prefix(fraction: float, **kw):
    return lambda f: TieredFeatureStore.from_reordered(f, fraction, **kw)


def _tiered_lookup(fraction: float, **kw):
    return lambda f: TieredFeatureStore.from_scores(f, _scores(f), fraction, **kw)


def _cache(policy: str, size: float | int = 0.3):
    def make(f):
        hot = _hot_order(f) if policy == "static" else None
        return FeatureCache(InMemoryFeatureStore(f), size, policy, hot_ids=hot)

    return make


STORE_FACTORIES += [
    ("tiered-prefix-0.3", _tiered_prefix(0.3)),
    ("tiered-lookup-0.3", _tiered_lookup(0.3)),
    ("tiered-prefix-0", _tiered_prefix(0.0)),
    ("tiered-prefix-1.0", _tiered_prefix(1.0)),
    ("tiered-lookup-0", _tiered_lookup(0.0)),
    ("tiered-lookup-1.0", _tiered_lookup(1.0)),
    (
        "tiered-lookup-0.3-mmap-cpu-gather",
        lambda f: TieredFeatureStore.from_scores(
            MmapFeatureStore(_npy_file(f)), _scores(f), 0.3, cold_mode="cpu_gather"
        ),
    ),
    ("cache-fifo", _cache("fifo")),
    ("cache-lru", _cache("lru")),
    ("cache-lfu", _cache("lfu")),
    ("cache-static", _cache("static")),
    (
        "cache-static-plus-lru",
        lambda f: static_plus_dynamic(InMemoryFeatureStore(f), 0.2, 0.2, _hot_order(f), "lru"),
    ),
    (  # 2 + 3 rows: smaller than most batches
        "cache-two-level-fifo",
        lambda f: two_level_cache(InMemoryFeatureStore(f), 2, 3, "fifo"),
    ),
    (
        "cache-sharded-lru-reader1",
        lambda f: ShardedFeatureCache(InMemoryFeatureStore(f), 2, 0.2, "lru", reader=1),
    ),
    ("reuse", lambda f: CrossBatchReuse(InMemoryFeatureStore(f))),
    (
        "reuse-copy-over-fifo",
        lambda f: CrossBatchReuse(FeatureCache(InMemoryFeatureStore(f), 3, "fifo"), keep="copy"),
    ),
    ("multidevice-alg1-2+2", lambda f: MultiDeviceFeatureStore.simulated(f, "2+2", "alg1")),
    ("disk-o_direct", lambda f: DiskFeatureStore(_npy_file(f))),
    ("cache-sieve-over-disk", lambda f: FeatureCache(DiskFeatureStore(_npy_file(f)), 3, "sieve")),
    ("cache-s3fifo", _cache("s3fifo")),
    ("disk-raw-qd1", lambda f: DiskFeatureStore(_raw_memmap(f), queue_depth=1)),
]
if torch.cuda.is_available():  # the wrappers moving real bytes: zero-copy cold rows, a GPU cache
    STORE_FACTORIES += [
        ("tiered-cuda-lookup-0.3", _tiered_lookup(0.3, device="cuda")),
        (
            "cache-cuda-lru",
            lambda f: FeatureCache(InMemoryFeatureStore(f), 0.3, "lru", device="cuda"),
        ),
    ]

FACTORY_IDS = [name for name, _ in STORE_FACTORIES]
FACTORIES = [fac for _, fac in STORE_FACTORIES]
stores = pytest.mark.parametrize("factory", FACTORIES, ids=FACTORY_IDS)
HYP = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def features_and_ids(draw, max_rows=40, max_dim=9, max_ids=60):
    """A random ``[N, F]`` matrix of every stored feature encoding (float32, float16, int16 =
    bfloat16 bits, int8: rows of any byte width, odd ones included) and ids into it (repeats
    allowed)."""
    n = draw(st.integers(1, max_rows))
    f = draw(st.integers(1, max_dim))
    dtype = draw(st.sampled_from([np.float32, np.float16, np.int16, np.int8]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    if np.dtype(dtype).kind == "i":  # every bit pattern, as the compressed rows hold them
        info = np.iinfo(dtype)
        feats = rng.integers(info.min, info.max, (n, f), endpoint=True).astype(dtype)
    else:
        feats = rng.standard_normal((n, f)).astype(dtype)
    ids = draw(st.lists(st.integers(0, n - 1), max_size=max_ids))
    id_dtype = draw(st.sampled_from([np.int32, np.int64]))
    as_tensor = draw(st.booleans())
    ids = np.array(ids, dtype=id_dtype)
    return feats, (torch.from_numpy(ids) if as_tensor else ids)


def _np_ids(ids) -> np.ndarray:
    return ids.numpy() if isinstance(ids, torch.Tensor) else np.asarray(ids)


def _same_bits(a: torch.Tensor, b: np.ndarray) -> bool:
    """Exact equality, bit for bit (a gather copies, it never computes)."""
    a = a.detach().cpu().numpy()
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


# ---- the contract ----------------------------------------------------------------------------


@stores
@HYP
@given(data=features_and_ids())
def test_gather_equals_fancy_indexing(factory, data):
    feats, ids = data
    store = factory(feats)
    assert isinstance(store, FeatureStore)
    got = store.gather(ids)
    want = feats[_np_ids(ids)]
    assert got.shape == (len(ids), feats.shape[1])
    assert got.device == store.device
    assert _same_bits(got, want)


@stores
@HYP
@given(data=features_and_ids(), extra=st.integers(0, 5))
def test_out_buffer_is_written_in_place(factory, data, extra):
    feats, ids = data
    store = factory(feats)
    n = len(ids)
    out = torch.full((n + extra, feats.shape[1]), 7.0, dtype=store.dtype, device=store.device)
    got = store.gather(ids, out=out)
    assert got.untyped_storage().data_ptr() == out.untyped_storage().data_ptr()
    assert got.shape[0] == n and (n == 0 or got.data_ptr() == out.data_ptr())
    assert _same_bits(got, feats[_np_ids(ids)])
    assert bool((out[n:] == 7.0).all())  # rows past len(ids) untouched
    # the same buffer again (as the loader reuses it), with other ids
    ids2 = _np_ids(ids)[::-1].copy()
    assert _same_bits(store.gather(ids2, out=out), feats[ids2])


@stores
@HYP
@given(data=st.data())
def test_a_sequence_of_batches_stays_correct(factory, data):
    """Stateful stores (caches, reuse) stay exact over many batches, some into one reused buffer."""
    feats, _ = data.draw(features_and_ids(max_ids=0))
    n = feats.shape[0]
    store = factory(feats)
    out = torch.empty((30, feats.shape[1]), dtype=store.dtype, device=store.device)
    for _ in range(data.draw(st.integers(2, 6))):
        ids = np.array(data.draw(st.lists(st.integers(0, n - 1), max_size=30)), dtype=np.int64)
        got = store.gather(ids, out=out) if data.draw(st.booleans()) else store.gather(ids)
        assert _same_bits(got, feats[ids])


@stores
@HYP
@given(data=features_and_ids(), repeat=st.integers(1, 3))
def test_counters_add_up(factory, data, repeat):
    feats, ids = data
    store = factory(feats)
    store.counters.reset()
    for _ in range(repeat):
        store.gather(ids)
    snap = store.counters.snapshot()
    rows = sum(snap["rows"].values())
    assert rows == repeat * len(ids)  # repeats counted: rows served, not distinct rows
    for tier, r in snap["rows"].items():
        assert snap["bytes"][tier] == r * store.row_bytes
    assert store.row_bytes == feats.shape[1] * feats.dtype.itemsize


@stores
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int16, np.int8])
def test_attributes(factory, dtype):
    feats = np.arange(30, dtype=dtype).reshape(10, 3)
    store = factory(feats)
    assert (store.num_rows, store.dim) == (10, 3)
    assert store.dtype == torch.from_numpy(feats).dtype
    assert isinstance(store.device, torch.device)
    assert store.row_bytes == 3 * feats.itemsize


@stores
def test_empty_ids_give_zero_rows(factory):
    feats = np.ones((5, 4), dtype=np.float16)
    store = factory(feats)
    for empty in ([], np.array([], dtype=np.int32), torch.empty(0, dtype=torch.long)):
        got = store.gather(empty)
        assert tuple(got.shape) == (0, 4) and got.dtype == torch.float16
    assert sum(store.counters.snapshot()["rows"].values()) == 0


@stores
@pytest.mark.parametrize("bad", [[-1], [10], [0, 3, 11], [2**40]])
def test_out_of_range_ids_raise_index_error(factory, bad):
    store = factory(np.zeros((10, 2), dtype=np.float32))
    with pytest.raises(IndexError, match="out of range"):
        store.gather(np.array(bad, dtype=np.int64))
    assert sum(store.counters.snapshot()["rows"].values()) == 0  # nothing counted


@stores
def test_bad_ids_and_buffers_are_refused(factory):
    store = factory(np.zeros((10, 2), dtype=np.float32))
    with pytest.raises(TypeError):
        store.gather(np.array([0.0, 1.0]))
    with pytest.raises(TypeError):
        store.gather(torch.tensor([True, False]))
    with pytest.raises(ValueError):
        store.gather(np.zeros((2, 2), dtype=np.int64))
    with pytest.raises(ValueError):  # too few rows
        store.gather([1, 2, 3], out=torch.empty((2, 2), device=store.device))
    with pytest.raises(ValueError):  # wrong width
        store.gather([1], out=torch.empty((4, 3), device=store.device))
    with pytest.raises(ValueError):  # wrong dtype
        store.gather([1], out=torch.empty((4, 2), dtype=torch.float16, device=store.device))


@stores
def test_large_gather_matches(factory):
    """A batch large enough to run the parallel kernel over many rows and threads."""
    rng = np.random.default_rng(1)
    feats = rng.standard_normal((5000, 33)).astype(np.float32)
    ids = rng.integers(0, 5000, 20000)
    out = torch.empty((20000, 33), dtype=torch.float32, device=factory(feats[:1]).device)
    assert _same_bits(factory(feats).gather(ids, out=out), feats[ids])


# ---- store-specific --------------------------------------------------------------------------


def test_wrappers_are_exported_from_the_package():
    import gnnio.features as features
    from gnnio.features.caches import cache, reuse
    from gnnio.features.caches import multi as cache_multi
    from gnnio.features.tiers import multidevice, tiered

    assert features.TieredFeatureStore is tiered.TieredFeatureStore
    assert features.FeatureCache is cache.FeatureCache
    assert features.static_plus_dynamic is cache.static_plus_dynamic
    assert features.two_level_cache is cache.two_level_cache
    assert features.ShardedFeatureCache is cache_multi.ShardedFeatureCache
    assert features.CrossBatchReuse is reuse.CrossBatchReuse
    assert features.MultiDeviceFeatureStore is multidevice.MultiDeviceFeatureStore
    assert all(hasattr(features, name) for name in features.__all__)
    with pytest.raises(AttributeError, match="no attribute"):
        features.NoSuchStore  # noqa: B018


def test_tiers():
    feats = np.ones((4, 2), dtype=np.float32)
    mem, disk = InMemoryFeatureStore(feats), MmapFeatureStore(_npy_file(feats))
    mem.gather([0, 1]), disk.gather([2, 2, 3])
    assert mem.counters.snapshot() == {"rows": {"host": 2}, "bytes": {"host": 16}}
    assert disk.counters.snapshot() == {"rows": {"disk": 3}, "bytes": {"disk": 24}}


def test_memory_store_reads_a_memmap_into_ram():
    mm = _raw_memmap(np.arange(12, dtype=np.float32).reshape(4, 3))
    store = InMemoryFeatureStore(mm)
    mm[0, 0] = 99.0  # a copy-on-write change of the mapping is not seen by the store
    assert store.gather([0])[0, 0].item() == 0.0


def test_mmap_store_does_not_read_the_whole_file(tmp_path):
    """A 1 GiB sparse .npy file: opening it and gathering a few rows reads only those pages."""
    path = tmp_path / "big.npy"
    big = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(1 << 21, 128))
    big[123456] = 1.5
    big.flush()
    del big
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    store = MmapFeatureStore(path, advice="random")
    got = store.gather(np.array([123456, 7, (1 << 21) - 1]))
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert got[0].eq(1.5).all() and got[1:].eq(0).all()
    assert grown_mib < 256, f"resident memory grew by {grown_mib:.0f} MiB for 3 rows"


def test_mmap_store_raw_file_and_errors(tmp_path):
    feats = np.arange(20, dtype=np.float16).reshape(5, 4)
    raw = tmp_path / "f.bin"
    feats.tofile(raw)
    store = MmapFeatureStore(raw, dtype=np.float16, shape=(5, 4))
    assert _same_bits(store.gather([4, 0]), feats[[4, 0]])
    with pytest.raises(DatasetError, match="dtype= and shape="):
        MmapFeatureStore(raw)
    with pytest.raises(DatasetError, match="needs"):
        MmapFeatureStore(raw, dtype=np.float32, shape=(50, 4))
    with pytest.raises(DatasetError, match="no such"):
        MmapFeatureStore(tmp_path / "missing.npy")
    with pytest.raises(TypeError, match="InMemoryFeatureStore"):
        MmapFeatureStore(feats)
    with pytest.raises(ValueError, match="advice"):
        MmapFeatureStore(raw, dtype=np.float16, shape=(5, 4), advice="sometimes")


def test_unknown_kernel_is_refused():
    with pytest.raises(ValueError, match="kernel"):
        InMemoryFeatureStore(np.ones((2, 2), np.float32), kernel="cuda-magic")


@pytest.mark.skipif(not HAVE_NUMBA, reason="numba not installed")
def test_numba_and_torch_kernels_agree():
    rng = np.random.default_rng(3)
    feats = rng.standard_normal((300, 17)).astype(np.float16)
    ids = rng.integers(0, 300, 1000).astype(np.int32)
    a = InMemoryFeatureStore(feats, kernel="numba").gather(ids)
    b = InMemoryFeatureStore(feats, kernel="torch").gather(ids)
    assert torch.equal(a, b)


@pytest.mark.skipif(not HAVE_NUMBA, reason="numba not installed")
@pytest.mark.parametrize("n,chunks", [(0, 4), (5, 64), (1000, 1), (1000, 8), (999, 7)])
def test_both_numba_kernels_match_numpy(n, chunks):
    """The plain kernel (fallback when the prefetch intrinsic cannot compile) and the prefetching
    one, including chunks with fewer rows than the prefetch distance, and empty chunks."""
    from gnnio.features import _gather

    rng = np.random.default_rng(n)
    src = rng.integers(0, 255, (300, 24), dtype=np.uint8)
    ids = rng.integers(0, 300, n)
    want = src[ids]
    a, b = np.zeros_like(want), np.zeros_like(want)
    _gather._gather_bytes(src, ids, a)
    _gather._gather_bytes_prefetch(src, ids, b, chunks)
    assert np.array_equal(a, want) and np.array_equal(b, want)


@pytest.mark.parametrize("kind", ["memory", "mmap"])
def test_open_store_over_a_dataset(tmp_path, kind):
    path = write_tiny_dataset(tmp_path / "tiny", feat_dtype=np.float16)
    store = open_store(path, kind=kind, progress=False)
    import gnnio

    feats = np.asarray(gnnio.load(path).features)
    ids = np.array([0, 5, 5, 11])
    assert _same_bits(store.gather(ids), feats[ids])
    assert isinstance(store, MmapFeatureStore if kind == "mmap" else InMemoryFeatureStore)


def test_open_store_errors(tmp_path):
    path = write_tiny_dataset(tmp_path / "tiny")
    with pytest.raises(UsageError, match="kind"):
        open_store(path, kind="cloud")
    with pytest.raises(UsageError, match="loader"):
        open_store(path, kind="mmap", device="cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_store_accepts_device_ids():
    feats = np.arange(40, dtype=np.float32).reshape(10, 4)
    store = InMemoryFeatureStore(feats, device="cuda")
    ids = torch.tensor([9, 0, 9], device="cuda")
    assert store.counters is not None and store.tier == "gpu"
    assert _same_bits(store.gather(ids), feats[[9, 0, 9]])
    with pytest.raises(IndexError):
        store.gather(torch.tensor([10], device="cuda"))


def test_bad_feature_arrays_are_refused(tmp_path):
    with pytest.raises(ValueError, match="2-D"):
        InMemoryFeatureStore(np.zeros(5, np.float32))
    with pytest.raises(ValueError, match="no columns"):
        MmapFeatureStore(_npy_file(np.zeros((5, 0), np.float32)))
    with pytest.raises(ValueError, match="2-D"):
        MmapFeatureStore(_npy_file(np.zeros((2, 2, 2), np.float32)))
