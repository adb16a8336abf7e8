"""Rules of the disk tier (gnnio/features/stores/disk.py, _direct_io.py) that its other tests do
not pin, found by a mutation pass: a feature file one byte short is refused at open, a file cut by
one byte under an open store is refused at the read that misses it, ``close`` closes the file, a
Fortran-ordered .npy is refused, a buffered read error (EINVAL too) is one line, and
``max_run_pages`` counts 4 KiB pages whatever the block size."""

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
