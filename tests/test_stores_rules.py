"""Rules of the CPU feature stores and what they count that the shared contract does not pin
(gnnio/features/stores/memory.py, mmap.py, _host_gather.py, _row_variants.py, accounting.py,
base.py): when an array is realigned rather than shared, the masked copy of ``gather_into``, the
raw-file and layout checks of the mapped store, the buffers the lean gather takes or refuses, the
row kernel's rows per program and when its measurement starts, and how device counts are booked."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gnnio.errors import DatasetError
from gnnio.features import InMemoryFeatureStore, MmapFeatureStore
from gnnio.features import _row_variants as rv
from gnnio.features._gather import HAVE_NUMBA
from gnnio.features.accounting import CacheStats
from gnnio.features.base import BatchCount, TierCounters
from gnnio.features.stores import memory as memory_mod

needs_numba = pytest.mark.skipif(not HAVE_NUMBA, reason="the lean path runs the numba kernel")

ROW = 256  # float32 columns: 1 KiB rows, so 1024 rows are exactly 1 MiB


def _at_offset(rows: int, off: int) -> np.ndarray:
    """A ``[rows, ROW]`` float32 array (values 0, 1, 2, ...) whose first byte sits ``off`` bytes
    past a 64-byte boundary."""
    nbytes = rows * ROW * 4
    raw = np.empty(nbytes + 128, dtype=np.uint8)
    start = (off - raw.ctypes.data) % 64
    a = raw[start : start + nbytes].view(np.float32).reshape(rows, ROW)
    a[:] = np.arange(rows * ROW, dtype=np.float32).reshape(rows, ROW)
    assert a.ctypes.data % 64 == off
    return a


@pytest.mark.parametrize("as_tensor", [False, True])
@pytest.mark.parametrize(
    ("rows", "off", "avail_per_nbytes", "copied"),
    [
        (1024, 16, 4, True),  # 1 MiB, 16 bytes off a cache line: realigned
        (1024, 32, 4, True),
        (1024, 0, 4, False),  # on a 64-byte boundary: shared
        (1023, 16, 4, False),  # under 1 MiB: shared
        (1024, 16, 2, True),  # the copy takes exactly half of what is available: still copied
        (1024, 16, 1.5, False),  # more than half: shared
        (1024, 16, None, False),  # available memory unknown: shared
    ],
)
def test_an_in_ram_array_is_realigned_only_when_the_docstring_says(
    monkeypatch, as_tensor, rows, off, avail_per_nbytes, copied
):
    """A CPU array/tensor is copied to a 64-byte-aligned buffer iff it is >= 1 MiB, off a 64-byte
    boundary and at most half of the available memory; otherwise it is shared."""
    a = _at_offset(rows, off)
    nbytes = a.nbytes
    avail = None if avail_per_nbytes is None else int(avail_per_nbytes * nbytes)
    monkeypatch.setattr(memory_mod, "available_ram", lambda: avail)
    store = InMemoryFeatureStore(torch.from_numpy(a) if as_tensor else a)
    t = store.host_tensor()
    assert (t.data_ptr() != a.ctypes.data) == copied
    if copied:
        assert t.data_ptr() % 64 == 0
    assert torch.equal(t, torch.from_numpy(a))
    ids = torch.tensor([rows - 1, 0, 5, 5])
    assert torch.equal(store.gather(ids), torch.from_numpy(a)[ids])


def test_gather_into_writes_and_counts_only_the_masked_rows():
    """``gather_into`` writes row ``ids[i]`` only where ``mask[i]`` (other rows of ``out`` and their
    ids, even out of range, are left alone) and books ``mask.sum()`` rows under the store's tier."""
    x = np.arange(40 * 3, dtype=np.float32).reshape(40, 3)
    store = InMemoryFeatureStore(x)
    ids = torch.tensor([3, 10**6, 4, 1, -5, 39])
    mask = torch.tensor([True, False, True, True, False, True])
    out = torch.full((6, 3), -7.0)
    got = store.gather_into(ids, out, mask)
    assert [(t, int(n)) for t, n in got] == [("host", 4)]
    want = torch.full((6, 3), -7.0)
    want[mask] = torch.from_numpy(x)[ids[mask]]
    assert torch.equal(out, want)
    assert store.counters.snapshot() == {"rows": {"host": 4}, "bytes": {"host": 4 * 12}}


def _raw(tmp_path, x: np.ndarray):
    path = tmp_path / "rows.bin"
    x.tofile(path)
    return path


def test_a_raw_file_needs_both_dtype_and_shape(tmp_path):
    """A raw (non-.npy) file given only one of ``dtype=`` / ``shape=`` is refused with the
    DatasetError that names both, not an error from inside NumPy."""
    path = _raw(tmp_path, np.arange(12, dtype=np.float32).reshape(4, 3))
    for kw in ({"dtype": np.float32}, {"shape": (4, 3)}):
        with pytest.raises(DatasetError, match="dtype= and shape="):
            MmapFeatureStore(path, **kw)
    store = MmapFeatureStore(path, dtype=np.float32, shape=(4, 3))  # exactly the file's size
    assert torch.equal(store.gather([3, 0]), torch.tensor([[9.0, 10, 11], [0, 1, 2]]))


def test_a_mapping_that_is_not_row_major_is_refused(tmp_path):
    """A memmap whose rows are not contiguous (transposed or strided) is refused, since the
    kernel reads each row as one run of bytes."""
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    mm = np.memmap(_raw(tmp_path, x), dtype=np.float32, mode="r", shape=(4, 6))
    for bad in (mm.T, mm[:, ::2]):
        assert isinstance(bad, np.memmap)
        with pytest.raises(ValueError, match="row-major"):
            MmapFeatureStore(bad)


@pytest.mark.parametrize("rows", [1, 2, 5])
def test_a_memmap_is_read_into_ram_to_its_last_row(tmp_path, rows):
    """The in-memory store reads every row of a memmap, the last one (and a one-row file)
    included, into a 64-byte-aligned buffer of its own."""
    x = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3) + 1
    np.save(tmp_path / "m.npy", x)
    mm = np.load(tmp_path / "m.npy", mmap_mode="r")
    store = InMemoryFeatureStore(mm)
    t = store.host_tensor()
    assert t.data_ptr() != mm.ctypes.data and t.data_ptr() % 64 == 0
    assert torch.equal(t, torch.from_numpy(x))
    assert torch.equal(store.gather([rows - 1]), torch.from_numpy(x[rows - 1 :]))


# ---- the lean call of the CPU stores (HostRowGather) -------------------------------------------

D = 7


def _lean_stores(tmp_path):
    """Both CPU stores over the same ``[300, D]`` float32 rows, the lean path compiled."""
    x = np.random.default_rng(4).standard_normal((300, D)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    stores = [InMemoryFeatureStore(x, num_threads=2), MmapFeatureStore(tmp_path / "x.npy")]
    for s in stores:
        s.gather(torch.arange(3), out=torch.empty(3, D))  # (the first call compiles)
    return x, stores


@needs_numba
def test_an_out_buffer_that_is_not_contiguous_is_refused_on_the_lean_path_too(tmp_path):
    """A strided or transposed ``out=`` (right shape and dtype) raises the general path's
    ValueError rather than being written through as if its rows were back to back."""
    _, stores = _lean_stores(tmp_path)
    for store in stores:
        for out in (torch.zeros(10, 2 * D)[:, :D], torch.zeros(D, D).t()):
            assert not out.is_contiguous()
            with pytest.raises(ValueError, match="contiguous"):
                store.gather(torch.tensor([1, 2, 3]), out=out)


@needs_numba
def test_a_buffer_whose_base_has_other_rows_gets_the_rows_back_to_back(tmp_path):
    """``out`` viewed from a tensor of a different row width (same first byte) is written as
    ``out``'s own rows, not as rows of that base tensor."""
    x, stores = _lean_stores(tmp_path)
    ids = torch.from_numpy(np.random.default_rng(5).integers(0, 300, 20))
    for store in stores:
        base = torch.zeros(20, 2 * D)  # (room for 20 rows of either width: a wrong one fails)
        out = base.view(40, D)[:20]
        assert out._base is base
        got = store.gather(ids, out=out)
        assert got.data_ptr() == base.data_ptr()
        assert torch.equal(got, torch.from_numpy(x)[ids])


@needs_numba
def test_a_buffer_seen_with_fewer_rows_is_checked_again_when_it_grows(tmp_path):
    """A buffer first seen as 3 rows, then (same address and strides) as 10 rows, gets all 10
    rows written; one seen as 10 rows then refuses 11 ids with the general path's error."""
    x, stores = _lean_stores(tmp_path)
    ids = torch.tensor([299, 0, 5, 5, 17, 250, 3, 1, 2, 100])
    want = torch.from_numpy(x)[ids]
    for store in stores:
        flat = torch.zeros(10 * D)
        small = flat[: 3 * D].view(3, D)
        assert torch.equal(store.gather(ids[:3], out=small), want[:3])
        whole = flat.view(10, D)
        assert whole.data_ptr() == small.data_ptr() and whole.stride() == small.stride()
        got = store.gather(ids, out=whole)
        assert torch.equal(got, want) and torch.equal(flat.view(10, D), want)
        with pytest.raises(ValueError, match=r"need \[>= 11, 7\]"):
            store.gather(torch.arange(11), out=whole)


@needs_numba
def test_the_checked_buffers_kept_are_bounded(tmp_path):
    """However many live buffers a store gathers into, it keeps at most 16 of them checked
    (the loader's ring has prefetch + 2 slots), and each still gets its rows."""
    x, stores = _lean_stores(tmp_path)
    ids = torch.tensor([4, 1, 4])
    bufs = [torch.empty(3, D) for _ in range(40)]  # all alive: no entry is let go
    for store in stores:
        for b in bufs:
            assert torch.equal(store.gather(ids, out=b), torch.from_numpy(x)[ids])
            assert len(store._fast._views) <= 16


# ---- the row kernel's variants (gnnio/features/_row_variants.py) -------------------------------


def test_rows_per_program_is_the_tile_over_the_row_capped_and_at_least_one():
    """A program takes ``tile_bytes // row bytes`` rows, at most ``max_rows`` and never zero
    (a row wider than the tile still gets a program of its own)."""
    for v in rv.VARIANTS:
        for word, words in (
            (4, 1),
            (4, 128),
            (8, 64),
            (8, 1024),
            (16, 4096),
            (2, 3 * v.tile_bytes),
        ):
            want = v.tile_bytes // (word * words)
            want = 1 if want < 1 else min(want, v.max_rows)
            assert v.rows_per_program(word, words) == want, (v.name, word, words)
        assert v.rows_per_program(8, v.tile_bytes) == 1  # a row 8x the tile


def test_a_gather_of_exactly_min_bytes_starts_the_measurement():
    """The first gather moving ``min_bytes`` or more starts the candidates' timings; a smaller
    one does not (and both get the default variant)."""
    started = []

    def trials(runs):
        started.append([name for name, _ in runs])
        return {name: "not timed here" for name, _ in runs}

    cpu = torch.device("cpu")
    tuner = rv.RowTuner(trials, devices=("cpu",), min_bytes=1000)
    assert tuner.pick("k", 999, cpu, lambda v: None) is rv.DEFAULT
    assert started == []
    assert tuner.pick("k", 1000, cpu, lambda v: None) is rv.DEFAULT
    assert started == [[v.name for v in rv.VARIANTS]]


# ---- what the wrappers count (accounting.py, base.py) ------------------------------------------


def _sums(stats: CacheStats) -> dict:
    d = stats.as_dict()
    keys = ("batches", "queries", "unique_queries", "hits", "misses", "insertions", "evictions",
            "fetched_bytes", "hit_bytes", "hit_ratio_sum")  # fmt: skip
    return {k: d[k] for k in keys}


def test_device_counted_batches_book_what_host_counted_ones_do():
    """A batch recorded with device-scalar counts books the same figures as the host path, also
    for a batch with no unique ids (hit ratio 0) and across a reset (no batch booked twice)."""
    batches = [(10, 6, 4, 2, 2, 1, 16), (0, 0, 0, 0, 0, 0, 16), (5, 5, 0, 5, 5, 5, 16)]
    host, dev = CacheStats(), CacheStats()
    for i, (n, u, h, m, ins, ev, rb) in enumerate(batches):
        if i == 2:
            host.reset(), dev.reset()
        host._record(n, u, h, m, ins, ev, rb, 0.0, 0.0)
        t = [torch.tensor(v) for v in (u, h, m, ins, ev)]
        dev._record_device(n, *t, rb, 0.0, 0.0)
        assert _sums(dev) == _sums(host), i
    assert _sums(host)["hit_ratio_sum"] == 0.0 and _sums(host)["misses"] == 5


def test_device_parts_of_different_row_sizes_keep_their_own_bytes():
    """Summing batch counts keeps one device sum per (tier, row bytes), however many batches:
    rows of 4-byte and 12-byte parts under one tier resolve to each count times its row size."""
    total = BatchCount()
    for rows, rb in ((3, 4), (2, 12), (1, 4)):
        part = BatchCount()
        part.dev.append(("host", torch.tensor(rows), rb))
        total.add(part)
    assert len(total.dev) == 2  # one running sum per (tier, row bytes), not one per batch
    assert total.resolve() == {"rows": {"host": 6}, "bytes": {"host": 4 * 4 + 2 * 12}}


def test_a_reset_drops_device_counts_queued_before_it():
    """Device counts queued before ``reset`` are not booked after it: the counters start at zero."""
    c = TierCounters()
    c.add("host", 2, 8)
    c.add_device("gpu", torch.tensor(5), 8)
    c.reset()
    assert c.snapshot() == {"rows": {}, "bytes": {}}
    c.add_device("gpu", torch.tensor(1), 8)
    assert c.snapshot() == {"rows": {"gpu": 1}, "bytes": {"gpu": 8}}


def test_a_device_count_of_zero_adds_no_tier_to_a_snapshot_or_a_batch():
    """A device part that counted no rows adds no tier, in a snapshot as in a resolved batch
    count (the two agree)."""
    c = TierCounters()
    mark = c.mark()
    c.add_device("peer", torch.tensor(0), 8)
    c.add("host", 3, 8)
    want = {"rows": {"host": 3}, "bytes": {"host": 24}}
    assert c.since(mark).resolve() == want
    assert c.snapshot() == want
