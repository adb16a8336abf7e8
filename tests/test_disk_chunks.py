"""DiskFeatureStore batches larger than its page buffer: read in chunks of rows, each chunk's
blocks within the buffer limit (plus the blocks its last row spills into), rows bit-identical
whichever chunk they fall in, repeats included."""

from __future__ import annotations

import numpy as np
import pytest

from gnnio.features.stores import _direct_io as dio
from gnnio.features.stores.disk import DiskFeatureStore


def spy_plan_pages(monkeypatch) -> list[int]:
    """The blocks of every plan a reader is given (one plan per chunk of rows)."""
    sizes: list[int] = []
    read = dio.PageReader.read

    def spy(self, plan):
        sizes.append(int(plan.pages.size))
        return read(self, plan)

    monkeypatch.setattr(dio.PageReader, "read", spy)
    return sizes


@pytest.mark.parametrize("block", [512, 4096])
@pytest.mark.parametrize("dim", [1300, 700, 96])
def test_chunked_batches_are_exact_and_within_the_buffer(tmp_path, monkeypatch, block, dim):
    rng = np.random.default_rng(dim)
    feats = rng.standard_normal((400, dim)).astype(np.float32)
    path = tmp_path / "f.npy"
    np.save(path, feats)
    limit_bytes = 6 * 4096
    disk = DiskFeatureStore(path, direct=False, block_size=block, max_buffer_bytes=limit_bytes)
    sizes = spy_plan_pages(monkeypatch)
    ids = rng.integers(0, 400, 300)
    ids = np.concatenate([ids, ids[::3]])  # repeats, also across chunks
    got = disk.gather(ids)
    assert got.numpy().tobytes() == feats[ids].tobytes()
    assert len(sizes) > 1  # the batch did not fit: several chunks
    rb = feats.shape[1] * 4
    per_row = (rb + block - 1) // block + 1  # blocks one row can touch
    assert max(sizes) <= limit_bytes // block + per_row
    disk.close()
