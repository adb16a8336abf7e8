"""The CPU stores' lean call of the row gather (gnnio/features/_host_gather.py): the loader's call
(a 1-D int CPU tensor of ids and a reused ``out=`` buffer) skips the general path's steps, gives
the same rows, counts and errors, and follows a buffer that changes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gnnio.features import InMemoryFeatureStore, MmapFeatureStore
from gnnio.features import _gather as G
from gnnio.features.stores import memory as memory_mod
from gnnio.features.stores import mmap as mmap_mod

pytestmark = pytest.mark.skipif(not G.HAVE_NUMBA, reason="the lean path runs the numba kernel")

N, D = 3000, 37


def _rows(dtype=np.float32):
    return np.random.default_rng(0).standard_normal((N, D)).astype(dtype)


def _stores(tmp_path, x):
    np.save(tmp_path / "x.npy", x)
    return [
        (InMemoryFeatureStore(x, num_threads=2), memory_mod),
        (MmapFeatureStore(tmp_path / "x.npy", num_threads=2), mmap_mod),
    ]


def _no_general_path(monkeypatch, module):
    """Make the general path fail loudly, so a call that still works took the lean one."""

    def boom(*a, **k):
        raise AssertionError("took the general path")

    monkeypatch.setattr(module, "gather_rows", boom)
    monkeypatch.setattr(module, "as_index_array", boom)


@pytest.mark.parametrize("id_dtype", [torch.int64, torch.int32])
def test_the_loaders_call_takes_the_lean_path_and_gives_the_same_rows(
    tmp_path, monkeypatch, id_dtype
):
    x = _rows()
    rng = np.random.default_rng(1)
    for store, module in _stores(tmp_path, x):
        out = torch.full((2500, D), -1.0)
        store.gather(torch.arange(3, dtype=id_dtype), out=out)  # first call: the kernel compiles
        with monkeypatch.context() as m:
            _no_general_path(m, module)
            for n, view in ((2500, False), (17, False), (1, True), (999, True), (2500, True)):
                ids = torch.from_numpy(rng.integers(0, N, n)).to(id_dtype)
                ids[: n // 3] = ids[0]  # repeats
                dst = out[:n] if view else out  # the loader passes its slot's first n rows
                got = store.gather(ids, out=dst)
                assert got.data_ptr() == out.data_ptr() and got.shape == (n, D)
                assert torch.equal(got, torch.from_numpy(x)[ids.long()])
        assert store.counters.snapshot()["rows"][store.tier] == 3 + 2500 + 17 + 1 + 999 + 2500
        assert len(store._fast._views) == 1  # the slot's views share its entry


def test_other_calls_take_the_general_path(tmp_path):
    x = _rows()
    store = InMemoryFeatureStore(x, num_threads=2)
    out = torch.empty(100, D)
    store.gather(torch.arange(3), out=out)
    fast = store._fast

    def f(ids, out):
        return fast(ids, out, store.kernel, store.num_threads)

    out = torch.empty(100, D)
    want = torch.from_numpy(x)[torch.tensor([5, 6, 7])]
    assert f(torch.tensor([5, 6, 7]), None) is None  # no buffer: a fresh tensor is made
    assert f([5, 6, 7], out) is None  # not a tensor
    assert f(np.array([5, 6, 7]), out) is None
    assert f(torch.tensor([5, 6, 7], dtype=torch.int16), out) is None
    assert f(torch.tensor([[5, 6, 7]]), out) is None  # 2-D: the general path refuses it
    assert f(torch.arange(20)[::2], out) is None  # not contiguous
    assert f(torch.empty(0, dtype=torch.int64), out) is None
    assert f(torch.arange(101), out) is None  # the buffer is too small
    assert f(torch.arange(3), out[:, :5].contiguous()) is None  # not this store's rows
    assert f(torch.arange(3), out.double()) is None
    assert f(torch.arange(3), out.t()) is None  # (square only by chance: not contiguous)
    torch_store = InMemoryFeatureStore(x, num_threads=2, kernel="torch")
    assert torch_store._fast(torch.arange(3), out, "torch", 2) is None
    for s in (store, torch_store):  # and every one of them still gives the rows
        assert torch.equal(s.gather([5, 6, 7], out=out), want)
        assert torch.equal(s.gather(torch.tensor([5, 6, 7])), want)
        assert torch.equal(s.gather(torch.arange(20)[5:8:1].clone(), out=out), want)


def test_a_new_or_changed_buffer_is_checked_again(tmp_path):
    x = _rows()
    store = InMemoryFeatureStore(x, num_threads=2)
    ids = torch.tensor([4, 2, 2999, 0])
    want = torch.from_numpy(x)[ids]
    a, b = torch.zeros(10, D), torch.zeros(10, D)
    for out in (a, b, a, b):  # two buffers in turn (two loaders' rings)
        out.zero_()
        assert torch.equal(store.gather(ids, out=out), want)
        assert out[4:].abs().sum() == 0
    a.set_(torch.zeros(10, D))  # the same tensor object now on other storage
    got = store.gather(ids, out=a)
    assert got.data_ptr() == a.data_ptr() and torch.equal(got, want)
    a.resize_(3, D)  # shrunk in place: 4 rows no longer fit
    with pytest.raises(ValueError, match=r"need \[>= 4, 37\]"):
        store.gather(ids, out=a)


def test_errors_and_counts_are_those_of_the_general_path(tmp_path):
    x = _rows()
    for store, _ in _stores(tmp_path, x):
        out = torch.zeros(50, D)
        store.gather(torch.arange(3), out=out)
        before = store.counters.snapshot()["rows"][store.tier]
        for bad in (N, -1, 10**9):
            with pytest.raises(IndexError, match=rf"feature id {bad} out of range \[0, {N}\)"):
                store.gather(torch.tensor([1, bad, 2]), out=out)
        with pytest.raises(ValueError, match=r"need \[>= 51, 37\]"):
            store.gather(torch.arange(51), out=out)
        with pytest.raises(ValueError, match="dtype torch.float64"):
            store.gather(torch.arange(5), out=out.double())
        assert store.counters.snapshot()["rows"][store.tier] == before  # failed calls: not counted


def test_the_stores_threads_are_set_on_the_calling_thread(monkeypatch):
    x = _rows()
    store = InMemoryFeatureStore(x, num_threads=1)
    out = torch.zeros(50, D)
    store.gather(torch.arange(3), out=out)
    asked = []
    monkeypatch.setattr(G.numba, "set_num_threads", lambda n: asked.append(n))
    store.gather(torch.arange(5), out=out)
    assert asked == [1]


@pytest.mark.parametrize("dtype", [np.float16, np.int8, np.float64])
def test_other_row_sizes(dtype):
    x = (np.random.default_rng(2).standard_normal((500, 13)) * 20).astype(dtype)
    store = InMemoryFeatureStore(x, num_threads=2)
    out = torch.empty(300, 13, dtype=torch.from_numpy(x[:0]).dtype)
    ids = torch.from_numpy(np.random.default_rng(3).integers(0, 500, 300))
    for _ in range(2):
        assert torch.equal(store.gather(ids, out=out), torch.from_numpy(x)[ids])


def test_views_and_buffers_let_go():
    import gc

    x = _rows()
    store = InMemoryFeatureStore(x, num_threads=2)
    ids = torch.tensor([4, 2, 2999, 0])
    want = torch.from_numpy(x)[ids]
    big = torch.zeros(10, D)
    store.gather(ids, out=big)
    big.zero_()
    assert torch.equal(store.gather(ids, out=big[2:6]), want)  # a view not at its base's start
    assert big[:2].abs().sum() == 0 and big[6:].abs().sum() == 0
    del big
    store.gather(torch.arange(3), out=torch.empty(5, D))
    gc.collect()
    assert store._fast._views == {}  # those buffers are gone: their entries too
    slot = torch.empty(50, D)
    for n in (40, 7, 50):
        store.gather(torch.arange(n), out=slot[:n])
    assert [v[0] for v in store._fast._views.values()] == [50]  # the whole slot, once
    del slot
    gc.collect()
    assert store._fast._views == {}


def test_threads_and_kernel_set_after_the_store_is_built_reach_the_call(monkeypatch):
    """``--isolation auto`` sets a store's gather threads after it is built (train/isolate.py):
    the lean call uses them, as the general path does."""
    store = InMemoryFeatureStore(_rows(), num_threads=2)
    out = torch.zeros(50, D)
    store.gather(torch.arange(3), out=out)
    asked = []
    real = G.numba.set_num_threads
    monkeypatch.setattr(G.numba, "set_num_threads", lambda n: (asked.append(n), real(n)))
    store.num_threads = 1
    store.gather(torch.arange(5), out=out)
    assert asked == [1]
    store.kernel = "torch"  # (nothing reassigns it today: the lean path still follows it)
    assert store._fast(torch.arange(5), out, store.kernel, store.num_threads) is None


def test_a_store_on_cpu_0_takes_a_cpu_buffer_on_both_paths():
    x = _rows()
    store = InMemoryFeatureStore(x, device="cpu:0", num_threads=2)
    out = torch.zeros(10, D)
    want = torch.from_numpy(x)[[5, 6]]
    assert torch.equal(store.gather(torch.tensor([5, 6]), out=out), want)  # a tensor: lean
    assert torch.equal(store.gather([5, 6], out=out), want)  # a list: the general path


def test_a_prefetch_kernel_that_did_not_compile_is_not_called(monkeypatch):
    """Where the prefetching kernel failed to compile (an LLVM without the intrinsic: the general
    path warned once and keeps the plain kernel), the lean call leaves it alone: the rows come
    from the plain kernel, not from a second try that raises."""
    x = _rows()
    store = InMemoryFeatureStore(x, num_threads=2)
    out = torch.zeros(50, D)
    store.gather(torch.arange(3), out=out)

    def broken(*a, **k):
        raise RuntimeError("LLVM ERROR: the intrinsic is not supported")

    monkeypatch.setattr(G, "_prefetch_ok", False)
    monkeypatch.setattr(G, "_gather_rows_prefetch", broken)
    ids = torch.tensor([7, 2999, 7, 0])
    assert torch.equal(store.gather(ids, out=out), torch.from_numpy(x)[ids])


def test_a_strided_buffer_whose_first_row_passed_is_refused_for_more_rows():
    """A buffer allocated with padded rows (``torch.empty_strided``): its first row alone is
    contiguous and takes the lean path; its first 5 rows are not and are refused as on the
    general path (the one-row call cached the whole padded buffer's rows, and the next call
    found that entry: the same address and strides)."""
    x = _rows()
    store = InMemoryFeatureStore(x, num_threads=2)
    store.gather(torch.arange(3), out=torch.empty(5, D))
    padded = torch.empty_strided((10, D), (D + 8, 1)).zero_()
    ids = torch.tensor([4, 2, 2999, 0, 7])
    assert torch.equal(store.gather(ids[:1], out=padded[:1]), torch.from_numpy(x)[ids[:1]])
    with pytest.raises(ValueError, match="out must be contiguous"):
        store.gather(ids, out=padded[:5])


def test_a_buffer_at_a_checked_address_with_other_strides_is_refused():
    """Every other row of a checked buffer (the same address, other strides) is not contiguous:
    refused as on the general path, not written as if it were the checked buffer's rows."""
    x = _rows()
    store = InMemoryFeatureStore(x, num_threads=2)
    ids = torch.tensor([4, 2, 2999, 0])
    buf = torch.zeros(10, D)
    store.gather(torch.arange(3), out=buf)  # (the first call compiles, on the general path)
    assert torch.equal(store.gather(ids, out=buf), torch.from_numpy(x)[ids])
    every_other = buf.as_strided((5, D), (2 * D, 1))
    with pytest.raises(ValueError, match="out must be contiguous"):
        store.gather(ids, out=every_other)
