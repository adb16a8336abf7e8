"""Counting what a window of work moved: ``TierCounters.mark`` / ``since`` give the rows *and
bytes* counted after the mark only (the loader books each batch that way), and an in-memory
store read from a memmap larger than one copy chunk holds every row."""

from __future__ import annotations

import numpy as np
import torch

from gnnio.features import InMemoryFeatureStore
from gnnio.features.base import TierCounters

from .test_loader import data, make_loader  # noqa: F401 - data is a fixture


def test_since_counts_only_what_came_after_the_mark():
    c = TierCounters()
    c.add("host", 5, 16)
    c.add("disk", 2, 16)
    m = c.mark()
    c.add("host", 3, 16)
    got = c.since(m).resolve()
    assert got["rows"].get("host") == 3 and got["bytes"].get("host") == 48
    assert got["rows"].get("disk", 0) == 0 and got["bytes"].get("disk", 0) == 0


def test_the_loader_books_each_batch_once(data):  # noqa: F811
    store = InMemoryFeatureStore(data[1])
    loader = make_loader(data, batch_size=16, store=store)
    rows = byts = 0
    for mb in loader.epoch(0):
        got = mb.meta["counted"].resolve()
        rows += got["rows"]["host"]
        byts += got["bytes"]["host"]
    snap = store.counters.snapshot()
    assert (rows, byts) == (snap["rows"]["host"], snap["bytes"]["host"])


def test_a_memmap_larger_than_a_copy_chunk_is_read_whole(tmp_path):
    """The in-memory store reads a memmap into RAM 64 MiB at a time: rows on both sides of a
    chunk boundary (and the last) arrive."""
    dim, step = 64, (64 << 20) // 64  # int8 rows of 64 B: 2^20 rows per chunk
    n = step + 3
    mm = np.memmap(tmp_path / "f.bin", dtype=np.int8, mode="w+", shape=(n, dim))
    rows = np.array([step - 2, step - 1, step, n - 1])
    mm[rows] = (np.arange(4)[:, None] + 1).astype(np.int8)
    mm.flush()
    store = InMemoryFeatureStore(np.memmap(tmp_path / "f.bin", dtype=np.int8, shape=(n, dim)))
    got = store.gather(rows)
    assert torch.equal(got, torch.from_numpy(np.asarray(mm[rows])))
    assert int(got.abs().sum()) == dim * (1 + 2 + 3 + 4)
