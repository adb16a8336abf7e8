"""Row-gather kernel details: word views, aligned host buffers, every-line prefetch, zero-width
and empty in-memory stores, host_tensor(), and the gather bench's ceiling buffer."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gnnio.features import InMemoryFeatureStore
from gnnio.features import _gather as G
from tests.helpers import write_tiny_dataset

needs_numba = pytest.mark.skipif(not G.HAVE_NUMBA, reason="numba not installed")


def _byte_rows(n: int, row_bytes: int, offset: int, seed: int = 0) -> np.ndarray:
    """``[n, row_bytes]`` uint8 rows starting ``offset`` bytes past a 64-byte boundary."""
    raw = np.empty(n * row_bytes + 128, dtype=np.uint8)
    start = (-raw.ctypes.data) % 64 + offset
    a = raw[start : start + n * row_bytes].reshape(n, row_bytes)
    a[:] = np.random.default_rng(seed).integers(0, 256, a.shape, dtype=np.uint8)
    return a


@pytest.mark.parametrize(
    "row_bytes,offset,want",
    [(512, 0, np.uint64), (512, 16, np.uint64), (512, 4, np.uint32), (12, 0, np.uint32),
     (6, 0, np.uint16), (512, 2, np.uint16), (7, 0, np.uint8), (512, 1, np.uint8)],
)  # fmt: skip
def test_word_views_pick_the_widest_legal_word(row_bytes, offset, want):
    src = _byte_rows(10, row_bytes, offset)
    out = _byte_rows(10, row_bytes, 0, seed=1)
    s, o = G.word_views(src, out)
    assert s.dtype == want and o.dtype == want
    assert np.shares_memory(s, src) and np.shares_memory(o, out)
    assert s.shape == (10, row_bytes // np.dtype(want).itemsize)


@needs_numba
@pytest.mark.parametrize("row_bytes", [1, 3, 8, 12, 64, 100, 512, 1500])
@pytest.mark.parametrize("offset", [0, 1, 16])
def test_gather_rows_matches_numpy_for_any_width_and_alignment(row_bytes, offset):
    n = 257
    src = _byte_rows(n, row_bytes, offset)
    ids = np.random.default_rng(row_bytes).integers(0, n, 1000)
    out = torch.zeros((1000, row_bytes), dtype=torch.uint8)
    G.gather_rows(src, ids, out, kernel="numba", num_threads=2)
    assert np.array_equal(out.numpy(), src[ids])


@needs_numba
@pytest.mark.parametrize(
    "n,chunks,lines,last",
    [(0, 4, 8, -1), (5, 64, 8, 511), (999, 7, 8, 511), (1000, 1, 8, -1), (50, 3, 4, 10),
     (50, 3, 16, -1), (50, 3, 3, 7)],
)  # fmt: skip
def test_prefetching_row_kernel_on_word_views(n, chunks, lines, last):
    """Every prefetch branch (prefetches are hints: any line count is safe), and chunks with
    fewer rows than the prefetch distance, or none."""
    src = _byte_rows(300, 512, 16).view(np.uint64)
    ids = np.random.default_rng(n).integers(0, 300, n)
    out = np.zeros((n, 64), dtype=np.uint64)
    G._gather_rows_prefetch(src, ids, out, chunks, lines, last)
    assert np.array_equal(out, src[ids])


@needs_numba
@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_the_kernel_checks_the_ids_range_in_its_own_pass(dtype):
    """The stores leave the range check to the copy's pass (no separate min/max pass): ids out of
    range are counted, never read, and their rows left as they were; gather_rows raises naming
    the smallest negative id, else the largest one past the end, as the separate check did."""
    src = _byte_rows(40, 512, 0).view(np.uint64)
    ids = np.array([3, -1, 39, 40, 7, -5, 1000, 0] * 5, dtype=dtype)
    out = np.full((ids.shape[0], 64), 7, dtype=np.uint64)
    assert G._gather_rows_prefetch(src, ids, out, 3, 8, -1) == 20
    ok = (ids >= 0) & (ids < 40)
    assert np.array_equal(out[ok], src[ids[ok]]) and (out[~ok] == 7).all()
    for bad, want in (([5, 40, -1, 2], "-1"), ([5, 40, 41, 2], "41"), ([0, -3], "-3")):
        o = torch.zeros((4, 128), dtype=torch.float32)
        with pytest.raises(IndexError, match=f"feature id {want} out of range"):
            G.gather_rows(src.view(np.float32), np.array(bad, dtype=dtype), o, kernel="numba")
    store = InMemoryFeatureStore(np.ones((40, 4), np.float32))
    with pytest.raises(IndexError, match="feature id 40 out of range"):
        store.gather(np.array([0, 40, 2], dtype=dtype), out=torch.empty(3, 4))


def test_last_line_offset():
    assert G._last_line_offset(_byte_rows(4, 512, 0)) == -1  # aligned 8-line rows: none
    assert G._last_line_offset(_byte_rows(4, 512, 16)) == 511  # straddling rows: last byte
    assert G._last_line_offset(_byte_rows(4, 100, 0)) == 99
    assert G._last_line_offset(_byte_rows(2, 4096, 16)) == -1  # beyond the prefetch window


@pytest.mark.parametrize("shape,dtype", [((10, 3), np.float32), ((5000, 128), np.float32),
                                         ((0, 4), np.float16), ((7, 0), np.float32)])  # fmt: skip
def test_host_empty_alignment(shape, dtype):
    a = G.host_empty(shape, dtype)
    assert a.shape == shape and a.dtype == dtype and a.flags.c_contiguous
    align = (2 << 20) if a.nbytes >= (2 << 20) else 64
    assert a.size == 0 or a.ctypes.data % align == 0  # (an empty array has no memory to align)
    a[...] = 1  # writable, and the whole shape is backed


def test_memmap_and_noncontiguous_inputs_are_copied_aligned(tmp_path):
    feats = np.random.default_rng(0).random((300, 128), dtype=np.float32)
    np.save(tmp_path / "f.npy", feats)
    mm = np.load(tmp_path / "f.npy", mmap_mode="r")
    for inp in (mm, np.asfortranarray(feats), torch.from_numpy(feats).t().contiguous().t()):
        store = InMemoryFeatureStore(inp)
        host = store.host_tensor()
        assert host.is_contiguous() and host.data_ptr() % 64 == 0
        assert np.array_equal(host.numpy(), feats)
        assert np.array_equal(store.gather([299, 0, 5]).numpy(), feats[[299, 0, 5]])
    bf = torch.from_numpy(feats).to(torch.bfloat16).t().contiguous().t()  # no NumPy twin
    store = InMemoryFeatureStore(bf)
    assert store.host_tensor().is_contiguous() and torch.equal(store.gather([3, 1]), bf[[3, 1]])


def test_host_tensor_shares_the_rows():
    feats = np.arange(40, dtype=np.float32).reshape(10, 4)
    store = InMemoryFeatureStore(feats)  # in-RAM, contiguous: shared, not copied
    host = store.host_tensor()
    assert isinstance(host, torch.Tensor) and host.device.type == "cpu"
    assert tuple(host.shape) == (10, 4) and host.dtype == torch.float32
    assert host.data_ptr() == feats.ctypes.data


@pytest.mark.parametrize("kernel", ["auto", "torch"])
@pytest.mark.parametrize(
    "feats", [np.zeros((5, 0), np.float32), torch.zeros(5, 0), np.zeros((0, 4), np.float32),
              torch.zeros(0, 4, dtype=torch.float16), np.zeros((0, 0), np.float32)],
)  # fmt: skip
def test_zero_width_and_empty_tables(feats, kernel):
    store = InMemoryFeatureStore(feats, kernel=kernel)
    n, d = store.num_rows, store.dim
    ids = [n - 1, 0, n - 1] if n else []
    got = store.gather(ids)
    assert tuple(got.shape) == (len(ids), d)
    buf = torch.empty((8, d), dtype=store.dtype)
    assert tuple(store.gather(ids, out=buf).shape) == (len(ids), d)
    assert store.counters.snapshot()["rows"]["host"] == 2 * len(ids)
    assert store.counters.snapshot()["bytes"]["host"] == 2 * len(ids) * store.row_bytes
    assert tuple(store.host_tensor().shape) == (n, d)
    with pytest.raises(IndexError):
        store.gather([n])
    with pytest.raises(TypeError):
        store.gather(np.array([0.5]))


def test_row_bytes_view_of_empty_tensors():
    assert G.row_bytes_view(torch.zeros(5, 0)).shape == (5, 0)
    assert G.row_bytes_view(torch.from_numpy(np.zeros((0, 4), np.float32))).shape == (0, 16)


@needs_numba
def test_ceiling_buffers_are_aligned_and_ceiling_kernels_copy_rows():
    from gnnio.bench import gather as bg

    impls, nbytes = bg.make_ceiling([100, 50], gib=1 / 256, seed=0, progress=False)
    assert nbytes == 150 * bg.CEILING_ROW_BYTES
    assert set(impls) >= {"aten_index_select", "numba_u64_rows", "numba_u64_rows_prefetch",
                          "numba_memcpy_rows", "numba_memcpy_rows_prefetch"}  # fmt: skip
    for fn in impls.values():
        fn()  # runs; the copies themselves are checked below on the same kernels
    src = G.host_empty((64, 64), np.uint64)
    src[:] = np.arange(64, dtype=np.uint64)[:, None]
    ids = np.array([5, 63, 0, 5])
    out = np.zeros((4, 64), np.uint64)
    bg._copy_rows_u64_prefetch(src, ids, out, 2, 8)
    assert np.array_equal(out, src[ids])
    for ahead in (0, 8):
        out[:] = 0
        bg._memcpy_rows(src, ids, out, 2, ahead)
        assert np.array_equal(out, src[ids])


def test_bench_gather_cli_reports_alignment(tmp_path, capsys):
    from gnnio.cli.main import main

    path = write_tiny_dataset(tmp_path / "tiny")
    rc = main(["bench", "gather", str(path), "--batches", "2", "--passes", "1", "--warmup", "0",
               "--batch-size", "4", "--fanouts", "2,2", "--ceiling-gib", "0.001", "--evict-mib", "2",
               "--json",
               "--no-progress"])  # fmt: skip
    assert rc in (0, None)
    res = json.loads(capsys.readouterr().out)
    assert res["store_row_offset_mod_64"] in range(64)
    assert 0 < res["fraction_of_ceiling"]
    assert res["evict_mib"] == 2 and res["ceiling_gib"] == 0.001 and res["llc_mib"] > 0


def test_the_ceiling_outgrows_the_cache_and_every_pass_starts_evicted(monkeypatch, tmp_path):
    """The ceiling's buffer defaults to 4x the last-level cache (1 GiB at least) and the eviction
    read to 2x: on a machine with a 480 MiB L3 a 1 GiB ceiling read a third of its rows from the
    cache its previous pass left, the gather none. Every pass, warm-up included, follows one
    eviction read."""
    import argparse

    from gnnio.bench import gather as bg
    from tests.helpers import write_tiny_dataset

    monkeypatch.setattr(bg, "llc_bytes", lambda: 480 << 20)
    monkeypatch.setattr(bg, "available_ram", lambda: 64 << 30)
    evicted, made = [], []

    def make_evict(nbytes):
        made.append(nbytes)
        return lambda: evicted.append(1)

    def make_ceiling(rows, gib, seed, progress):
        made.append(gib)
        return {"a": lambda: order.append("a"), "b": lambda: order.append("b")}, 1

    order = []
    monkeypatch.setattr(bg, "make_evict", make_evict)
    monkeypatch.setattr(bg, "make_ceiling", make_ceiling)
    path = write_tiny_dataset(tmp_path / "tiny")
    p = argparse.ArgumentParser()
    bg.add_arguments(p)
    res = bg.run(p.parse_args([str(path), "--batches", "2", "--passes", "3", "--warmup", "1",
                               "--batch-size", "4", "--fanouts", "2,2", "--quiet"]))  # fmt: skip
    assert made == [2.0, 960 << 20]  # 4 x 480 MiB = 1.875 GiB, in quarter GiB: 2; 2 x 480 MiB
    assert res["ceiling_gib"] == 2.0 and res["evict_mib"] == 960 and res["llc_mib"] == 480
    assert len(evicted) == 3 * (1 + 3)  # gather + two ceilings, warm-up + 3 timed passes each
    # each round in a fresh order drawn from --seed (a fixed slot or neighbour measured up to 10 %
    # slower for the same call)
    rng = np.random.default_rng(0)
    want = [k for _ in range(3) for k in rng.permutation(["gather", "a", "b"]) if k != "gather"]
    assert order == ["a", "b"] + want and want != ["a", "b"] * 3


def test_default_eviction_fits_the_memory_available(monkeypatch, tmp_path):
    """Without ``--evict-mib`` the eviction buffer (2x the cache) is capped at a quarter of the
    memory available, as the automatic ceiling is: it used to fail the run with a usage error
    about a flag not given (a 480 MiB L3, 3 GiB available: 960 MiB > 768)."""
    import argparse

    from gnnio.bench import gather as bg
    from tests.helpers import write_tiny_dataset

    monkeypatch.setattr(bg, "llc_bytes", lambda: 480 << 20)
    avail = [3 << 30]
    monkeypatch.setattr(bg, "available_ram", lambda: avail[0])
    made = []
    monkeypatch.setattr(bg, "make_evict", lambda nbytes: made.append(nbytes) or (lambda: None))
    monkeypatch.setattr(bg, "make_ceiling",
                        lambda rows, gib, seed, progress: ({"numba_u64_rows": lambda: None}, 1))  # fmt: skip
    path = write_tiny_dataset(tmp_path / "tiny")
    p = argparse.ArgumentParser()
    bg.add_arguments(p)
    res = bg.run(p.parse_args([str(path), "--batches", "2", "--passes", "1", "--warmup", "0",
                               "--batch-size", "4", "--fanouts", "2,2", "--quiet"]))  # fmt: skip
    assert res["evict_mib"] == 768 and made == [768 << 20] and res["ceiling_gib"] == 0.75
    avail[0] = 400 << 20  # little memory: both shrink to a quarter of it, no error about a flag
    res = bg.run(p.parse_args([str(path), "--batches", "2", "--passes", "1", "--warmup", "0",
                               "--batch-size", "4", "--fanouts", "2,2", "--quiet"]))  # fmt: skip
    assert res["evict_mib"] == 100 and res["ceiling_gib"] == 100 / 1024


def test_llc_bytes_reads_the_largest_cache(monkeypatch, tmp_path):
    from gnnio.bench import gather as bg

    for i, size in enumerate(["48K", "2048K", "491520K"]):
        (tmp_path / f"index{i}").mkdir()
        (tmp_path / f"index{i}" / "size").write_text(size + "\n")
    real = bg.Path
    monkeypatch.setattr(bg, "Path", lambda p: real(tmp_path) if "cache" in str(p) else real(p))
    assert bg.llc_bytes() == 480 << 20
    monkeypatch.setattr(bg, "Path", lambda p: real(tmp_path / "none"))
    assert bg.llc_bytes() == 32 << 20  # unreadable: a common size


def test_big_misaligned_arrays_are_realigned_small_ones_shared():
    rows = _byte_rows(4096, 512, 16).view(np.int32)  # 2 MiB, 16 bytes past a cache line
    assert rows.ctypes.data % 64 == 16
    store = InMemoryFeatureStore(rows)
    assert store.host_tensor().data_ptr() % 64 == 0
    assert np.array_equal(store.host_tensor().numpy(), rows)
    assert np.array_equal(store.gather([4095, 1]).numpy(), rows[[4095, 1]])
    t = torch.from_numpy(rows)  # the same for a tensor view of it
    assert InMemoryFeatureStore(t).host_tensor().data_ptr() % 64 == 0
    small = _byte_rows(16, 512, 16).view(np.int32)  # 8 KiB: shared as it is
    assert InMemoryFeatureStore(small).host_tensor().data_ptr() == small.ctypes.data


@pytest.mark.parametrize("kernel", ["numba", "torch"])
@pytest.mark.parametrize(
    "shape, dtype",
    [((3, 4), torch.float32), ((0, 4), torch.float32), ((5, 3), torch.float32),
     ((5, 4), torch.float64), ((20,), torch.float32)],
)  # fmt: skip
def test_an_out_buffer_that_cannot_take_the_rows_is_refused_before_a_write(kernel, shape, dtype):
    """``gather_rows`` refuses an ``out`` with fewer rows than ids or another row width with a
    ValueError and writes nothing (the kernel would copy past a smaller buffer; the process
    aborted), on both kernels; a buffer with more rows is fine."""
    src = np.arange(40, dtype=np.float32).reshape(10, 4)
    ids = np.array([9, 0, 4, 4, 7], dtype=np.int64)
    out = torch.full(shape, -1, dtype=dtype)
    with pytest.raises(ValueError, match="cannot take 5 rows of 16 bytes"):
        G.gather_rows(src, ids, out, kernel=kernel)
    assert bool((out == -1).all())
    big = torch.full((7, 4), -1.0)
    G.gather_rows(src, ids, big[:5], kernel=kernel)
    assert torch.equal(big[:5], torch.from_numpy(src[ids]))


def test_a_row_source_read_into_a_short_buffer_is_an_error_not_an_abort():
    """A tier's row source reading into a too-small buffer raises ValueError (it aborted the
    process with a write past the buffer)."""
    from gnnio.features.tiers.row_source import RowSource

    feats = torch.arange(40, dtype=torch.float32).reshape(10, 4)
    out = torch.zeros(2, 4)
    with pytest.raises(ValueError, match="cannot take 3 rows"):
        RowSource(feats).read(np.array([1, 2, 3], dtype=np.int64), out)


def test_a_read_only_view_swaps_the_warning_filters_once_per_process(monkeypatch):
    """``tensor_view`` silences torch's once-per-process non-writable warning on the first
    read-only array only: later calls (and every writable array) never enter
    ``warnings.catch_warnings``, which swaps process-wide state that a loader thread's block
    could restore under another thread's (gnnio.utils.syncs.CudaSyncLog's count)."""
    ro = np.arange(12, dtype=np.float32).reshape(3, 4)
    ro.setflags(write=False)
    entered = []
    real = G.warnings.catch_warnings

    def spy(*a, **k):
        entered.append(1)
        return real(*a, **k)

    monkeypatch.setattr(G, "_RO_SILENCED", False, raising=False)
    monkeypatch.setattr(G.warnings, "catch_warnings", spy)
    assert torch.equal(G.tensor_view(np.ones((2, 2))), torch.ones(2, 2, dtype=torch.float64))
    assert entered == []  # a writable array: no warning to silence
    for _ in range(3):
        assert torch.equal(G.tensor_view(ro), torch.from_numpy(ro.copy()))
    assert entered == [1]  # the first read-only one only
