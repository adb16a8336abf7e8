"""Rules of the disk tier (gnnio/features/stores/disk.py, _direct_io.py) that its other tests do
not pin, found by a mutation pass: a feature file one byte short is refused at open, a file cut by
one byte under an open store is refused at the read that misses it, and ``close`` closes the file."""

from __future__ import annotations

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
