"""Rules of the disk tier (gnnio/features/stores/disk.py, _direct_io.py) that its other tests do
not pin, found by a mutation pass: a feature file one byte short is refused at open, a file cut by
one byte under an open store is refused at the read that misses it, ``close`` closes the file, a
Fortran-ordered .npy is refused, a buffered read error (EINVAL too) is one line, and
``max_run_pages`` counts 4 KiB pages whatever the block size. A second pass added: rows of exactly
one block counted exactly against the buffer, an epoch's ``read_amplification`` (and the
summary's) from its own reads, the host cache's exact capacity, ``queue_depth=0`` refused, a plan
of smaller blocks than its reader's refused, a memmap view of a view read at its own offset; and
what ``_layout`` is given (a raw file's dtype and shape, a negative size, a directory, not 2-D, a
damaged header), the reader's cleanup (a fallback's descriptor, ``close``'s threads, an error
leaving after the other reads), ``disk_line`` and the kernel's count."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest

from gnnio.errors import DatasetError
from gnnio.features.stores.disk import DiskFeatureStore
from tests.test_disk_chunks import spy_plan_pages
from tests.test_disk_store import refuse_o_direct_reads


def _npy(tmp_path, rows: int = 1000, dim: int = 8):
    path = tmp_path / "f.npy"
    np.save(path, np.arange(rows * dim, dtype=np.float32).reshape(rows, dim))
    return path


def test_one_byte_short_is_refused_at_open(tmp_path):
    path = _npy(tmp_path)
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 1)
    with pytest.raises(DatasetError, match="truncated"):
        DiskFeatureStore(path)


def test_cut_by_one_byte_under_an_open_store_is_refused(tmp_path):
    path = _npy(tmp_path)
    s = DiskFeatureStore(path)
    try:
        with open(path, "r+b") as f:
            f.truncate(path.stat().st_size - 1)
        with pytest.raises(DatasetError, match="truncated"):
            s.gather([999])  # the last row, whose last byte is gone
    finally:
        s.close()


def test_close_closes_the_file(tmp_path):
    s = DiskFeatureStore(_npy(tmp_path))
    fd = s._reader.fd
    os.fstat(fd)
    s.close()
    with pytest.raises(OSError):
        os.fstat(fd)


def test_a_fortran_ordered_npy_is_refused(tmp_path):
    path = tmp_path / "f.npy"
    np.save(path, np.asfortranarray(np.ones((16, 4), dtype=np.float32)))
    with pytest.raises(ValueError, match="Fortran"):
        DiskFeatureStore(path)


def test_a_buffered_read_error_is_one_line_even_einval(tmp_path, monkeypatch):
    from gnnio.features.stores import _direct_io as dio

    s = DiskFeatureStore(_npy(tmp_path), direct=False)

    def einval(fd, bufs, off):
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(dio.os, "preadv", einval)
    with pytest.raises(DatasetError, match="read error at byte"):
        s.gather([3])
    s.close()


def test_max_run_pages_counts_4k_pages_for_smaller_blocks(tmp_path):
    path = tmp_path / "raw.bin"
    path.write_bytes(np.zeros(16 * 4096, dtype=np.uint8).tobytes())  # 16 pages, 128 sectors
    s = DiskFeatureStore(
        path, dtype=np.uint8, shape=(128, 512), direct=False, block_size=512, max_run_pages=1
    )
    s.gather(np.arange(128))
    assert s.stats.reads == 16  # one 4 KiB page (8 blocks of 512 B) per read
    s.close()


def test_an_object_npy_is_refused(tmp_path):
    path = tmp_path / "f.npy"
    np.save(path, np.array([[1, "a"]], dtype=object), allow_pickle=True)
    with pytest.raises(DatasetError, match="Python objects"):
        DiskFeatureStore(path)


@pytest.mark.parametrize(
    "ranks, placement, match",
    [(2, None, "single-process only"), (1, "auto", "not with --placement")],
)
def test_disk_refuses_ranks_and_placement(ranks, placement, match):
    from types import SimpleNamespace

    from gnnio.errors import UsageError
    from gnnio.train.setup_disk import check_disk_options

    cfg = SimpleNamespace(store="disk", host_cache_size=None, placement=placement,
                          cache_policy="none", gpu_cache_fraction=None, cpu_cache_size=0)  # fmt: skip
    with pytest.raises(UsageError, match=match):
        check_disk_options(cfg, ranks)


# ---- the open survivors of the first pass, and its continuation -----------------------------


def test_rows_of_exactly_one_block_are_counted_exactly_for_the_buffer(tmp_path, monkeypatch):
    """512-byte rows after the 128-byte .npy header, in 512-byte blocks: rows 0-9 touch blocks
    0-10. A buffer of 11 blocks reads them in one chunk, each block once; one of 10 blocks cuts
    the batch (and re-reads the block shared across the cut)."""
    path = tmp_path / "f.npy"
    feats = np.arange(40 * 128, dtype=np.float32).reshape(40, 128)
    np.save(path, feats)
    sizes = spy_plan_pages(monkeypatch)
    fits = DiskFeatureStore(path, direct=False, block_size=512, max_buffer_bytes=11 * 512)
    assert fits.gather(np.arange(10)).numpy().tobytes() == feats[:10].tobytes()
    assert sizes == [11] and fits.stats.pages_read == 11
    sizes.clear()
    short = DiskFeatureStore(path, direct=False, block_size=512, max_buffer_bytes=10 * 512)
    assert short.gather(np.arange(10)).numpy().tobytes() == feats[:10].tobytes()
    assert len(sizes) > 1 and short.stats.pages_read > 11
    fits.close()
    short.close()


def test_an_epochs_read_amplification_is_its_own_bytes_over_its_own_rows(tmp_path):
    """``rec["disk"]["read_amplification"]`` is the pass's bytes over the pass's distinct rows'
    bytes (not the store's totals since it opened); the summary's is the sum of the epochs'
    bytes over the sum of their rows' bytes, not a mean of the epochs' ratios."""
    from types import SimpleNamespace

    from gnnio.train.setup_disk import disk_epoch, disk_mark, disk_summary

    path = tmp_path / "raw.bin"
    path.write_bytes(np.zeros(64 * 4096, dtype=np.uint8).tobytes())  # 64-byte rows, 64 a page
    disk = DiskFeatureStore(path, dtype=np.float32, shape=(4096, 16), direct=False, block_size=4096)
    setup = SimpleNamespace(disk=disk, disk_below_gpu=None)
    disk.gather(np.arange(0, 4096, 64))  # before the passes: 64 rows on 64 pages (amp 64)
    history = []
    for ids in ([0, 1, 2, 3], np.arange(64, 128)):  # 4 rows on a page (amp 16); 64 rows (amp 1)
        mark = disk_mark(setup)
        disk.gather(ids)
        rec = {"bytes_by_tier": {}, "rows_by_tier": {}}
        disk_epoch(setup, mark, rec)
        history.append(rec)
    assert [h["disk"]["read_amplification"] for h in history] == [16.0, 1.0]
    assert [h["disk"]["bytes_read"] for h in history] == [4096, 4096]
    assert history[0]["bytes_by_tier"]["disk"] == 4096
    s = disk_summary(history, setup)["disk"]
    assert s["read_amplification"] == 2 * 4096 / (68 * 64)
    assert s["bytes_read_per_epoch"] == [4096, 4096] and s["pages_read"] == 2
    kern = [h["disk"]["disk_read_bytes"] for h in history]
    # the kernel's count is of storage reads (read_bytes), not of bytes read() returned (rchar):
    # buffered reads of a file just written come from the page cache, so it counts none of them
    assert all(k is None or k < 4096 for k in kern), kern
    if None not in kern:  # (a system with /proc/self/io)
        assert disk_summary(history, setup)["disk_read_bytes"] == sum(kern)
    history[1]["disk"]["disk_read_bytes"] = None  # an epoch the kernel did not count: no total
    assert disk_summary(history, setup)["disk_read_bytes"] is None
    disk.close()


@pytest.mark.parametrize(
    "fraction, rows, policy",
    [(0.9, 45, "none"), (0.25, 13, "s3fifo"), (1.0, 50, "lookahead")],
)
def test_the_host_cache_holds_the_fraction_of_the_nodes_exactly(tmp_path, fraction, rows, policy):
    """``--host-cache-size F``: the nearest count to F x N rows, halves up (0.25 of 50 is 13),
    the same rule as every other cache size; ``data_setup`` says the same number. No
    ``--cache-policy``: SIEVE; ``lookahead`` gets ``--lookahead``'s window."""
    from types import SimpleNamespace

    import gnnio
    from gnnio.train.setup_disk import build_disk_base
    from tests.helpers import write_tiny_dataset

    ds = gnnio.load(write_tiny_dataset(tmp_path / "d", num_nodes=50))
    cfg = SimpleNamespace(host_cache_size=fraction, cache_policy=policy, lookahead=3)
    cache, disk, tiers, info = build_disk_base(ds, cfg, get_score=None)
    assert cache.capacity == rows and info["host_cache"]["capacity"] == rows
    assert (
        info["host_cache"]["policy"] == cache.policy.name == {"none": "sieve"}.get(policy, policy)
    )
    assert tiers == ("host_cache", "disk") and info["disk"]["block_bytes"] == disk.block_size
    assert cache.lookahead == (3 if policy == "lookahead" else 0)
    disk.close()


@pytest.mark.parametrize("size", [0.0, 1.0])
def test_a_host_cache_of_none_or_all_rows_is_allowed(size):
    from types import SimpleNamespace

    from gnnio.train.setup_disk import check_disk_options

    cfg = SimpleNamespace(store="disk", host_cache_size=size, placement=None, cache_policy="none",
                          gpu_cache_fraction=None, cpu_cache_size=0)  # fmt: skip
    check_disk_options(cfg, 1)


def test_queue_depth_zero_is_refused_in_one_line(tmp_path):
    with pytest.raises(ValueError, match="queue_depth must be >= 1, got 0") as e:
        DiskFeatureStore(_npy(tmp_path), queue_depth=0)
    assert "\n" not in str(e.value)


def test_a_plan_in_blocks_smaller_than_the_readers_is_refused(tmp_path):
    """A reader of 4 KiB blocks refuses a plan of 512-byte blocks (``O_DIRECT`` would read at
    offsets and lengths its file does not take); a plan of its own block or a multiple reads."""
    from gnnio.features.stores._direct_io import PageReader, plan_pages

    path = _npy(tmp_path)
    r = PageReader(str(path), direct=False, block=4096)
    s = PageReader(str(path), direct=False, block=512)
    try:
        with pytest.raises(ValueError, match="a plan of 512-byte blocks; .* multiples of 4096"):
            r.read(plan_pages(np.array([512]), 32, block=512))
        assert r.pages_read == 0
        want = path.read_bytes()[4096 : 4096 + 32]
        assert r.read(plan_pages(np.array([4096]), 32))[:32].tobytes() == want
        assert s.read(plan_pages(np.array([4096]), 32))[:32].tobytes() == want
    finally:
        r.close()
        s.close()


class _Mapped(np.memmap):
    """A memmap subclass (as a wrapping library might hand over): NumPy does not collapse a
    chain of views across a change of subclass, so its view's base is a view, not the mapping."""


@pytest.mark.parametrize("how", ["slices", "subclass"])
def test_a_memmap_view_of_a_view_reads_its_own_rows(tmp_path, how):
    """``features[7:][3:]`` starts at row 10 of the file; its rows are rows 10, 11, ... The byte
    offset is counted from the mapping at the end of the chain of bases, however long."""
    path = _npy(tmp_path, rows=100, dim=4)
    m = np.load(path, mmap_mode="r")
    view = m[7:][3:] if how == "slices" else m[7:].view(_Mapped)[3:]
    s = DiskFeatureStore(view, direct=False)
    assert (s.offset, s.num_rows) == (128 + 10 * 16, 90)
    assert s.gather([0, 5, 89]).numpy().tobytes() == m[[10, 15, 99]].tobytes()
    s.close()


# ---- _layout: what it is given ----------------------------------------------------------------


def test_a_raw_file_needs_both_dtype_and_shape(tmp_path):
    raw = tmp_path / "raw.bin"
    raw.write_bytes(b"\0" * 64)
    for kw in ({"dtype": np.float32}, {"shape": (4, 4)}):
        with pytest.raises(DatasetError, match="give dtype= and shape="):
            DiskFeatureStore(raw, **kw)


@pytest.mark.parametrize("shape", [(-1, 4), (4, -4)])
def test_a_raw_file_with_a_negative_size_is_refused_at_open(tmp_path, shape):
    """NumPy's ``-1`` ("the rest") is not read as such: refused at open, not a store of -1 rows
    (every id out of range) or of -4 columns (a torch error at the first gather)."""
    raw = tmp_path / "raw.bin"
    raw.write_bytes(b"\0" * 64)
    with pytest.raises(ValueError, match=r"sizes must be >= 0"):
        DiskFeatureStore(raw, dtype=np.float32, shape=shape)


def test_a_directory_is_not_a_feature_file(tmp_path):
    with pytest.raises(DatasetError, match="no such feature file") as e:
        DiskFeatureStore(tmp_path)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("shape", [(40,), (4, 5, 2)])
def test_features_that_are_not_2d_are_refused(tmp_path, shape):
    path = tmp_path / "f.npy"
    np.save(path, np.ones(shape, dtype=np.float32))
    with pytest.raises(ValueError, match="must be 2-D"):
        DiskFeatureStore(path)


# ---- the line gnnio train prints --------------------------------------------------------------


def test_disk_line_by_hand():
    """MiB of 2**20 bytes, blocks (not read calls) and their size, the amplification to two
    places, the mode, and the kernel's count where there is one (0 bytes is a count)."""
    from gnnio.train.setup_disk import disk_line

    dk = {"direct": True, "queue_depth": 8, "bytes_read": 3 * 2**20, "pages_read": 6144,
          "reads": 700, "block_bytes": 512, "read_amplification": 1.1649}  # fmt: skip
    assert disk_line({"disk": dk, "disk_read_bytes": 2**21}) == (
        "disk (O_DIRECT, queue depth 8): 3.0 MiB read in 6,144 blocks of 512 B, read "
        "amplification 1.16; the kernel counted 2.0 MiB"
    )
    dk = {**dk, "direct": False, "queue_depth": 1, "block_bytes": 4096}
    line = disk_line({"disk": dk, "disk_read_bytes": None})
    assert line.startswith("disk (buffered, queue depth 1): ") and line.endswith("1.16")
    assert disk_line({"disk": dk, "disk_read_bytes": 0}).endswith("; the kernel counted 0.0 MiB")


def test_a_damaged_npy_header_is_one_dataset_error(tmp_path):
    path = tmp_path / "f.npy"
    path.write_bytes(b"\x93NUMPY\x01\x00\x10\x00{'descr': 'zz'}\n" + b"\0" * 64)
    with pytest.raises(DatasetError, match="not a readable .npy file") as e:
        DiskFeatureStore(path)
    assert "\n" not in str(e.value)


def test_reset_stats_keeps_the_block_size(tmp_path):
    s = DiskFeatureStore(_npy(tmp_path), direct=False, block_size=512)
    s.gather([1, 2])
    s.reset_stats()
    assert s.stats.as_dict() == {"gathers": 0, "rows": 0, "unique_rows": 0, "pages_read": 0,
                                 "bytes_read": 0, "reads": 0, "read_amplification": 0.0,
                                 "block_bytes": 512}  # fmt: skip
    assert s.stats.row_bytes == 32
    assert s.counters.snapshot()["rows"] == {}
    s.close()


def test_a_fallback_to_buffered_reads_closes_the_direct_descriptor(tmp_path, monkeypatch):
    """A read refusing O_DIRECT reopens the file buffered; the first descriptor is closed (one
    open file per store, none after ``close``)."""

    path = _npy(tmp_path)
    fds = len(os.listdir("/proc/self/fd"))
    s = DiskFeatureStore(path)
    if not s.direct:
        pytest.skip("this filesystem refuses O_DIRECT")
    refuse_o_direct_reads(monkeypatch, s)
    assert s.gather([3]).shape == (1, 8) and not s.direct
    assert len(os.listdir("/proc/self/fd")) == fds + 1
    s.close()
    assert len(os.listdir("/proc/self/fd")) == fds


def test_close_stops_the_reader_threads(tmp_path):
    s = DiskFeatureStore(_npy(tmp_path), queue_depth=4, direct=False, block_size=4096,
                         max_run_pages=1)  # fmt: skip
    s.gather(np.arange(0, 1000, 100))  # 10 runs of one page: read by the pool
    threads = list(s._reader._pool._threads)
    assert threads and all(t.is_alive() for t in threads)
    s.close()
    assert not any(t.is_alive() for t in threads)


def test_a_failed_read_leaves_only_after_the_other_reads_end(tmp_path, monkeypatch):
    """One reader thread's EIO is raised once every other thread's reads are done: none is still
    writing into the buffer the next gather reuses when the error reaches the caller."""
    import threading

    from gnnio.features.stores import _direct_io as dio

    s = DiskFeatureStore(_npy(tmp_path), queue_depth=4, direct=False, block_size=4096,
                         max_run_pages=1)  # fmt: skip
    real, lock, live = os.preadv, threading.Lock(), [0]

    def slow_or_eio(fd, bufs, off):
        if off == 0:
            raise OSError(errno.EIO, "Input/output error")
        with lock:
            live[0] += 1
        threading.Event().wait(0.3)  # the other reads are still in flight when the EIO comes
        try:
            return real(fd, bufs, off)
        finally:
            with lock:
                live[0] -= 1

    monkeypatch.setattr(dio.os, "preadv", slow_or_eio)
    with pytest.raises(DatasetError, match="read error at byte 0"):
        s.gather(np.arange(0, 1000, 100))  # 10 runs of one page over 4 threads
    assert live[0] == 0
    s.close()


def test_a_file_smaller_than_two_blocks_is_probed_inside_it(tmp_path, monkeypatch):
    """The sub-page probe of a file of under two blocks reads at offset 0: a read past the end
    returns 0 bytes before any alignment check (Linux), which would pass a 512-byte block on a
    device taking only pages, and every read after it would fall back to buffered."""
    from gnnio.features.stores import _direct_io as dio

    path = _npy(tmp_path, rows=10, dim=4)  # 288 bytes
    real = os.preadv

    def pages_only(fd, bufs, off):
        if off >= 288:
            return 0
        if off % 4096 or len(bufs[0]) % 4096:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, bufs, off)

    monkeypatch.setattr(dio.os, "preadv", pages_only)
    s = DiskFeatureStore(path)
    if not s.direct:
        pytest.skip("this filesystem refuses O_DIRECT")
    assert s.block_size == 4096
    s.close()


def test_only_a_static_host_cache_ranks_rows_by_score():
    """A hotness score (a presampling pass on the larger graphs) is computed for a static host
    cache only; SIEVE and the others, or no host cache, go without."""
    from types import SimpleNamespace

    from gnnio.train.setup_disk import needs_disk_score

    def cfg(size, policy):
        return SimpleNamespace(host_cache_size=size, cache_policy=policy)

    assert needs_disk_score(cfg(0.1, "static"))
    assert not any(needs_disk_score(cfg(0.1, p)) for p in ("none", "sieve", "s3fifo", "lookahead"))
    assert not needs_disk_score(cfg(None, "static")) and not needs_disk_score(cfg(0.0, "static"))
