"""Rules of the disk tier (gnnio/features/stores/disk.py, _direct_io.py) that its other tests do
not pin, found by a mutation pass: a feature file one byte short is refused at open, a file cut by
one byte under an open store is refused at the read that misses it, ``close`` closes the file, a
Fortran-ordered .npy is refused, a buffered read error (EINVAL too) is one line, and
``max_run_pages`` counts 4 KiB pages whatever the block size. A second pass added: rows of exactly
one block counted exactly against the buffer, an epoch's ``read_amplification`` (and the
summary's) from its own reads, the host cache's exact capacity, ``queue_depth=0`` refused, a plan
of smaller blocks than its reader's refused, and a memmap view of a view read at its own offset."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest

from gnnio.errors import DatasetError
from gnnio.features.stores.disk import DiskFeatureStore


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


def _spy_chunks(monkeypatch) -> list[int]:
    """The blocks of every plan a reader is given (one plan per chunk of rows)."""
    from gnnio.features.stores import _direct_io as dio

    sizes: list[int] = []
    read = dio.PageReader.read

    def spy(self, plan):
        sizes.append(int(plan.pages.size))
        return read(self, plan)

    monkeypatch.setattr(dio.PageReader, "read", spy)
    return sizes


def test_rows_of_exactly_one_block_are_counted_exactly_for_the_buffer(tmp_path, monkeypatch):
    """512-byte rows after the 128-byte .npy header, in 512-byte blocks: rows 0-9 touch blocks
    0-10. A buffer of 11 blocks reads them in one chunk, each block once; one of 10 blocks cuts
    the batch (and re-reads the block shared across the cut)."""
    path = tmp_path / "f.npy"
    feats = np.arange(40 * 128, dtype=np.float32).reshape(40, 128)
    np.save(path, feats)
    sizes = _spy_chunks(monkeypatch)
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
    disk.close()


@pytest.mark.parametrize("fraction, rows", [(0.9, 45), (0.25, 13), (1.0, 50)])
def test_the_host_cache_holds_the_fraction_of_the_nodes_exactly(tmp_path, fraction, rows):
    """``--host-cache-size F``: the nearest count to F x N rows, halves up (0.25 of 50 is 13),
    the same rule as every other cache size; ``data_setup`` says the same number."""
    from types import SimpleNamespace

    import gnnio
    from gnnio.train.setup_disk import build_disk_base
    from tests.helpers import write_tiny_dataset

    ds = gnnio.load(write_tiny_dataset(tmp_path / "d", num_nodes=50))
    cfg = SimpleNamespace(host_cache_size=fraction, cache_policy="sieve", lookahead=8)
    cache, disk, tiers, info = build_disk_base(ds, cfg, get_score=None)
    assert cache.capacity == rows and info["host_cache"]["capacity"] == rows
    assert tiers == ("host_cache", "disk")
    disk.close()


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
